"""What a token costs each engine on the same GGUF, side by side, and where the physical limit is.

After the same prompt (an example article in the chat template, as summarize builds it), each contender scores k new
tokens (k = 1: a decoding step; k > 1: a verification pass), then drops them again; the rounds interleave the
contenders (the start rotating), so a loaded machine loads them alike:

    blocks     specdec's target as summarize runs it by default (--target-quant gguf: its linears on the file's
               blocks, driven as the decoding loop drives it: decoding.llama_like, attention by rows), all k rows'
               logits; on AVX-512 VNNI its Q4_K and Q6_K layers from the packed form (GgufLinear.pack)
    unpacked   the same with no packed form: every layer's product qmatmul.gguf_mm on the file's blocks (what
               blocks ran before the packed kernel, and runs on AVX2)
    bf16       the same with --target-quant none (the GGUF dequantized to bf16: specdec before issue 30)
    llama.cpp  llama-cpp-python on the same GGUF file, the same prompt tokens, n_threads = n_threads_batch = the
               threads here (its default: logits of the last row only)

Then the machine's read bandwidth (a 1 GiB fp32 sum and a bf16 GEMV over 467 MB, each the best of a few) and the
bytes each form of the target reads per token: the bound in tokens per second, and how close each step comes.

    .venv/bin/python benchmarks/quant_step.py --rounds 7 --json benchmarks/quant-step.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specdec_cli.bench.machine import cpu_model, load_average
from specdec_cli.decoding.llama_like import decoder_for
from specdec_cli.kernels import qmatmul
from specdec_cli.models.gguf_linear import GgufLinear
from specdec_cli.options import SummarizeOptions
from specdec_cli.tasks import summarize as task

KS = (1, 2, 5, 9)


def torch_pass(decoder, T: int, ids: torch.Tensor, k: int) -> float:
    positions = torch.arange(T, T + k)[None]
    t0 = time.perf_counter()
    with torch.inference_mode():
        decoder.forward(ids[:, T:T + k], None, positions)
    dt = time.perf_counter() - t0
    decoder.crop(T)
    return dt


def llama_pass(llm, T: int, ids: list[int], k: int) -> float:
    t0 = time.perf_counter()
    llm.eval(ids[T:T + k])
    dt = time.perf_counter() - t0
    llm.n_tokens = T  # the next eval drops the positions past T from its KV cache
    return dt


def bandwidth() -> dict[str, float]:
    """GB/s read by a 1 GiB fp32 sum and by a bf16 GEMV over a [151936, 1536] weight (the target's output layer)."""
    a = torch.ones(1 << 28)
    w = torch.randn(151936, 1536).to(torch.bfloat16)
    x = torch.randn(1, 1536, dtype=torch.bfloat16)
    out = {}
    for name, fn, nbytes in (("fp32 sum, 1 GiB", lambda: a.sum(), a.numel() * 4),
                             ("bf16 GEMV, 467 MB", lambda: torch.nn.functional.linear(x, w), w.numel() * 2)):
        fn()
        out[name] = nbytes / min(_timed(fn) for _ in range(7)) / 1e9
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def read_bytes(model) -> dict[str, int]:
    """Bytes a one-token step reads from the linear layers (blocks or dense weights) and one embedding row."""
    linear = sum((m.blocks if m.packed is None else m.packed).numel() if isinstance(m, GgufLinear)
                 else m.weight.numel() * m.weight.element_size()
                 for m in model.modules() if isinstance(m, GgufLinear) or type(m) is torch.nn.Linear)
    emb = model.get_input_embeddings().weight
    return {"linear_layers": linear, "embedding_row": emb.shape[1] * emb.element_size()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--article", default="examples/articles/bumblebees.txt")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--contenders", default="blocks,unpacked,bf16,llama.cpp")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    names = args.contenders.split(",")
    print(f"# {cpu_model()}, {threads} threads, torch {torch.__version__}; qmatmul: {qmatmul.backend_line()}", flush=True)
    opts = SummarizeOptions(mode="autoregressive", target_quant="gguf")
    target, _ = task.load_pair(opts, progress=False)
    prompt = task.encode(target.tokenizer, target.model, [task.read_article(args.article)], 100, False)[0]
    extra = [int(t) for t in target.tokenizer(" The study found that bumblebee colonies grew", add_special_tokens=False)
             ["input_ids"]][:max(KS)]
    ids = prompt + extra
    T = len(prompt)
    t = torch.tensor([ids])
    runners, sizes = {}, {}
    for name in names:
        if name in ("blocks", "unpacked", "bf16"):
            loaded = target if name == "blocks" else task.load_pair(
                opts.replace(target_quant="none" if name == "bf16" else "gguf"), progress=False)[0]
            if name == "unpacked":
                for m in loaded.model.modules():
                    for layer in (m, m.joint) if isinstance(m, GgufLinear) else ():
                        if layer is not None and layer.packed is not None:
                            layer.blocks, layer.packed = layer.file_blocks(), None
            decoder = decoder_for(loaded.model)
            with torch.inference_mode():
                decoder.prefill(t[:, :T], None, torch.arange(T)[None])
            runners[name] = lambda k, d=decoder: torch_pass(d, T, t, k)
            sizes[name] = read_bytes(loaded.model)
        elif name == "llama.cpp":
            from llama_cpp import Llama

            from specdec_cli.models.causal_lm import gguf_file

            path = gguf_file("embedded", "target", progress=False)
            llm = Llama(model_path=str(path), n_ctx=len(ids) + 16, n_threads=threads, n_threads_batch=threads,
                        verbose=False)
            llm.eval(ids[:T])
            runners[name] = lambda k, llm=llm: llama_pass(llm, T, ids, k)
            sizes[name] = {"file": path.stat().st_size}
    for run in runners.values():
        for k in KS:
            run(k)  # warm
    times: dict[str, dict[int, list[float]]] = {n: {k: [] for k in KS} for n in runners}
    loads = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in KS:
            for name in order:
                times[name][k].append(runners[name](k))
        loads.append(load_average())
        print(f"round {r + 1}: " + "; ".join(f"{n} " + "/".join(f"{1e3 * times[n][k][-1]:.0f}" for k in KS)
                                             for n in names), flush=True)
    bw = bandwidth()
    med = {n: {k: statistics.median(v) for k, v in ks.items()} for n, ks in times.items()}
    low = {n: {k: min(v) for k, v in ks.items()} for n, ks in times.items()}
    print(f"\n{cpu_model()}, {threads} threads; load average {min(loads):.1f}–{max(loads):.1f}; "
          f"{args.rounds} interleaved rounds; prompt {T} tokens")
    print("\n| engine | " + " | ".join(f"k = {k}: median (min) ms" for k in KS) + " | k = 9 / k = 1 |")
    print("|---|" + "---:|" * (len(KS) + 1))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{1e3 * med[n][k]:.0f} ({1e3 * low[n][k]:.0f})" for k in KS)
              + f" | {med[n][9] / med[n][1]:.2f} |")
    print("\nread bandwidth: " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in bw.items()))
    best = max(bw.values())
    for n, s in sizes.items():
        nbytes = sum(s.values())
        bound = nbytes / (best * 1e9)
        print(f"{n}: {nbytes / 1e9:.3f} GB a token -> bound {1e3 * bound:.1f} ms ({1 / bound:.1f} tokens/s); step "
              f"median {1e3 * med[n][1]:.0f} ms = {bound / med[n][1]:.0%} of the bound ({nbytes / med[n][1] / 1e9:.1f} GB/s)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "cpu": cpu_model(), "threads": threads, "torch": torch.__version__, "qmatmul": qmatmul.backend_line(),
            "article": args.article, "prompt_tokens": T, "rounds": args.rounds, "load_average": [min(loads), max(loads)],
            "seconds": times, "median_s": med, "min_s": low, "bandwidth_gb_s": bw, "bytes_per_token": sizes,
            "command": " ".join(sys.argv)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
