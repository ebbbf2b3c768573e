"""What the int8 prompt kernel costs in quality: the embedded target (Qwen2.5-Coder-1.5B, Q4_K_M) teacher-forced over
each example article's prompt and a summary of it, its next-token distributions at the summary's positions against
those of the same file in fp32 (the weights dequantized exactly, fp32 products: the model the file means), two ways:

    bf16 prompt   the prompt as a bf16 product of the dequantized weights (prefill before the prompt kernel), then
                  one-token steps (qmatmul's step kernel: activations in int8 per 256)
    int8 prompt   the prompt through qmatmul.prompt_mm (activations in int8 per 256, as the steps and llama.cpp
                  quantize them), then the same steps

Reports the mean KL divergence from the fp32 model and how often the argmax agrees, over every position.

    .venv/bin/python benchmarks/prompt_quality.py --summaries benchmarks/summarize-llama-cpp-scales16.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specdec_cli.bench.machine import cpu_model
from specdec_cli.options import SummarizeOptions
from specdec_cli.tasks import summarize as task

ARTICLES = Path(__file__).resolve().parents[1] / "examples" / "articles"
DENSE = "portable"  # SPECDEC_QMATMUL: as on a CPU without the prompt kernel (a dense product of the dequantized weights)
WAYS = {"bf16 prompt": DENSE, "int8 prompt": None}


def _with_path(path: str | None):
    if path:
        os.environ["SPECDEC_QMATMUL"] = path
    else:
        os.environ.pop("SPECDEC_QMATMUL", None)


def stepped(model, seq: list[int], P: int, path: str | None) -> torch.Tensor:
    """Logits [len(seq) − P, V] fp32: the prompt seq[:P] in one call, then one token a step."""
    _with_path(path)
    cache = DynamicCache()
    with torch.inference_mode():
        out = [model(torch.tensor([seq[:P]]), past_key_values=cache, use_cache=True).logits[0, -1].float()]
        for t in seq[P:-1]:
            out.append(model(torch.tensor([[t]]), past_key_values=cache, use_cache=True).logits[0, -1].float())
    _with_path(None)
    return torch.stack(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summaries", required=True, help="a summarize bench JSON: its first result's outputs, in the "
                                                       "articles' order")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    target, _ = task.load_pair(SummarizeOptions(mode="autoregressive", target_quant="gguf"), progress=False)
    tok, model = target.tokenizer, target.model
    summaries = json.loads(Path(args.summaries).read_text())["results"][0]["outputs"]
    articles = sorted(p for p in ARTICLES.glob("*.txt") if not p.name.endswith(".ref.txt"))
    runs = []
    for article, summary in zip(articles, summaries):
        prompt = task.encode(tok, model, [task.read_article(str(article))], 100, False)[0]
        seq = prompt + tok.encode(summary, add_special_tokens=False)
        runs.append((seq, len(prompt), {w: stepped(model, seq, len(prompt), p) for w, p in WAYS.items()}))
    model.float()  # the reference: every product in fp32 on the exact weights (a prefill of the whole sequence)
    _with_path(DENSE)
    totals = {w: [0.0, 0, 0] for w in WAYS}
    with torch.inference_mode():
        for seq, P, got in runs:
            ref = F.log_softmax(model(torch.tensor([seq])).logits[0, P - 1:-1].float(), -1)
            for w, logits in got.items():
                kl = (ref.exp() * (ref - F.log_softmax(logits, -1))).sum(-1)
                totals[w][0] += kl.sum().item()
                totals[w][1] += int((logits.argmax(-1) == ref.argmax(-1)).sum())
                totals[w][2] += len(kl)
    _with_path(None)
    result = {w: {"mean_kl": t[0] / t[2], "argmax_agreement": t[1] / t[2], "positions": t[2]} for w, t in totals.items()}
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads; {len(runs)} articles")
    for w, r in result.items():
        print(f"{w}: mean KL to the fp32 model {r['mean_kl']:.2e}, argmax agreement {r['argmax_agreement']:.4f} "
              f"({r['positions']} positions)")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "summaries": args.summaries, "ways": result},
                                              indent=2) + "\n")


if __name__ == "__main__":
    main()
