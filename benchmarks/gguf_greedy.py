"""The embedded target (Qwen2.5-Coder-1.5B, Q4_K_M) in a plain greedy loop, two ways, interleaved A B A B:

    bf16      today: the GGUF dequantized to bf16 (through the cache), as summarize runs it (decoding.exact_rows)
    blocks    its linears on the file's own blocks (models/gguf_linear.py, kernels/qmatmul), exact_rows' attention

Reports prefill seconds, decode tokens/s (prefill excluded) and wall, per contender (medians over repeats), whether
the two texts agree, for `blocks` whether a pass over k tokens gives each the bits of its one-token step, and what
a pass over 1, 2, 5, 9 tokens costs each (after the prompt).

    .venv/bin/python benchmarks/gguf_greedy.py --article examples/articles/bumblebees.txt --tokens 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from specdec_cli.bench.machine import cpu_model
from specdec_cli.decoding.exact_rows import exact_rows
from specdec_cli.kernels import qmatmul
from specdec_cli.models.causal_lm import load_causal_lm
from specdec_cli.models.gguf_linear import load_gguf_causal_lm


def greedy(model, ids: torch.Tensor, n: int, eos: set[int]) -> tuple[list[int], float, float]:
    """n greedy tokens after ids [1, T]: (tokens, prefill seconds, decode seconds)."""
    with torch.inference_mode():
        cache = DynamicCache()
        t0 = time.perf_counter()
        logits = model(ids, past_key_values=cache, use_cache=True).logits[0, -1]
        t1 = time.perf_counter()
        out = [int(logits.argmax())]
        while len(out) < n and out[-1] not in eos:
            logits = model(torch.tensor([[out[-1]]]), past_key_values=cache, use_cache=True).logits[0, -1]
            out.append(int(logits.argmax()))
        t2 = time.perf_counter()
    return out, t1 - t0, t2 - t1


def pass_costs(model, ids: torch.Tensor, ks=(1, 2, 5, 9), reps: int = 3) -> dict[int, float]:
    """Seconds of a forward over k tokens after the prompt (less its last 9), the cache cropped back after each:
    {k: median}."""
    with torch.inference_mode():
        cache = DynamicCache()
        T = ids.shape[1] - 9
        model(ids[:, :T], past_key_values=cache, use_cache=True)
        out = {}
        for k in ks:
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                model(ids[:, T:T + k], past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - t0)
                cache.crop(-k)  # transformers 5: the count of tokens to remove
            out[k] = statistics.median(times)
    return out


def steps_equal_pass(model, ids: torch.Tensor, k: int) -> bool:
    with torch.inference_mode():
        cache = DynamicCache()
        model(ids[:, :-k], past_key_values=cache, use_cache=True)
        steps = [model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[0, -1]
                 for t in range(ids.shape[1] - k, ids.shape[1])]
        cache = DynamicCache()
        model(ids[:, :-k], past_key_values=cache, use_cache=True)
        passed = model(ids[:, -k:], past_key_values=cache, use_cache=True).logits[0]
    return all(torch.equal(s, p) for s, p in zip(steps, passed))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--article", default="examples/articles/bumblebees.txt")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}; {qmatmul.backend_line()}",
          flush=True)
    blocks = load_gguf_causal_lm("embedded", dtype=torch.bfloat16, progress=False)
    plain = load_causal_lm("embedded", dtype=torch.bfloat16, progress=False)
    tok = plain.tokenizer
    text = Path(args.article).read_text()
    messages = [{"role": "user", "content": f"Summarize this article in two sentences.\n\n{text}"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    eos = {tok.eos_token_id, *([plain.model.generation_config.eos_token_id] if isinstance(
        plain.model.generation_config.eos_token_id, int) else plain.model.generation_config.eos_token_id or [])}
    models = {"bf16": exact_rows(plain.model), "blocks": exact_rows(blocks.model)}
    print(f"# prompt {ids.shape[1]} tokens, {args.tokens} new at most", flush=True)
    runs = {name: [] for name in models}
    for r in range(args.repeats):
        for name in (list(models) if r % 2 == 0 else list(models)[::-1]):
            toks, pre, dec = greedy(models[name], ids, args.tokens, eos)
            runs[name].append({"tokens": toks, "prefill_s": pre, "decode_s": dec})
            print(f"{name}: prefill {pre:.2f} s, {len(toks)} tokens, decode {(len(toks) - 1) / dec:.2f} tokens/s, "
                  f"wall {pre + dec:.2f} s", flush=True)
    summary = {}
    for name, rs in runs.items():
        n = len(rs[0]["tokens"])
        summary[name] = {"new_tokens": n, "prefill_s": statistics.median(r["prefill_s"] for r in rs),
                         "decode_tokens_per_s": statistics.median((n - 1) / r["decode_s"] for r in rs),
                         "wall_s": statistics.median(r["prefill_s"] + r["decode_s"] for r in rs),
                         "text": tok.decode(rs[0]["tokens"], skip_special_tokens=True)}
    ratio = summary["blocks"]["decode_tokens_per_s"] / summary["bf16"]["decode_tokens_per_s"]
    same = runs["bf16"][0]["tokens"] == runs["blocks"][0]["tokens"]
    exact = {k: steps_equal_pass(models["blocks"], ids, k) for k in (2, 5, 9)}
    costs = {name: pass_costs(model, ids) for name, model in models.items()}
    print("\n| target | " + " | ".join(f"pass of {k}, ms" for k in costs["bf16"]) + " |\n|---|" + "---:|" * len(costs["bf16"]))
    for name, c in costs.items():
        print(f"| {name} | " + " | ".join(f"{v * 1e3:.0f} ({v / c[1]:.2f}×)" for v in c.values()) + " |")
    print("\n| target | prefill s | decode tokens/s | wall s | new tokens |\n|---|---:|---:|---:|---:|")
    for name, s in summary.items():
        print(f"| {name} | {s['prefill_s']:.2f} | {s['decode_tokens_per_s']:.2f} | {s['wall_s']:.2f} | {s['new_tokens']} |")
    print(f"\nblocks / bf16 decode speed: {ratio:.2f}×; same tokens: {same}; blocks pass = steps (k=2,5,9): {exact}")
    for name, s in summary.items():
        print(f"{name}: {s['text']!r}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "threads": torch.get_num_threads(),
                                               "article": args.article, "prompt_tokens": ids.shape[1],
                                               "summary": summary, "same_tokens": same, "pass_equals_steps": exact,
                                               "pass_seconds": costs},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
