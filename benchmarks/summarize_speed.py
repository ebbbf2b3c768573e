"""Tokens/s of summarization on a real target/draft pair, every contender in one run, interleaved
article by article so that machine noise hits them alike:

    autoregressive   the target alone (specdec's loop, γ = 0)
    hf-assisted      transformers' generate(assistant_model=draft), its default schedule
    baseline         specdec, transformers-style verification
    exact            specdec, the exact kernel (torch twin on a CPU)
    exact+subset     the same, with the draft's output layer cut to --draft-vocab tokens + the prompt's
    exact+subset+int8   the same, with the draft's weights in int8 (specdec_cli/drafts/int8.py): the CLI default
                        (with --draft-stop 0.4 as well); baseline+subset+int8 likewise
    hf-assisted+int8    transformers' assisted generation with that same int8 draft (full head)

Greedy (the issue's setting), so every contender must print the same tokens: checked, and reported.

    .venv/bin/python benchmarks/summarize_speed.py --gamma 5 --max-new-tokens 100 --out benchmarks/summarize-cpu.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec_cli.bench.machine import cpu_model
from specdec_cli.bench.runners import data_files
from specdec_cli.decoding import SamplingParams, generate
from specdec_cli.drafts.int8 import quantize_draft
from specdec_cli.drafts.subset_head import frequent_ids, restrict_head
from specdec_cli.models.causal_lm import eos_ids
from specdec_cli.options import SummarizeOptions
from specdec_cli.tasks import summarize as task

GREEDY = SamplingParams(temperature=0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--draft", default="embedded")
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--draft-vocab", type=int, default=32768)
    ap.add_argument("--draft-stop", type=float, default=0.0, help="specdec contenders: decoding.loop.draft's stopping rule")
    ap.add_argument("--max-new-tokens", type=int, default=100)
    ap.add_argument("--articles", type=int, default=0, help="how many example articles (0 = all)")
    ap.add_argument("--contenders", default="autoregressive,hf-assisted,hf-assisted+int8,baseline,exact,exact+subset,exact+subset+int8")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    pair = SummarizeOptions(target=args.target, draft=args.draft, device="cpu")
    target, draft = task.load_pair(pair)
    articles = [task.read_article(p) for p in data_files("summarize", None)][: args.articles or None]
    tok = target.tokenizer
    eos = eos_ids(target)
    contenders = args.contenders.split(",")
    draft8 = None
    if any(c.endswith("int8") for c in contenders):  # a second copy of the draft, with int8 weights
        _, draft8 = task.load_pair(pair)
        quantize_draft(draft8.loaded)

    def run(name, ids, mask):
        d = draft8 if name.endswith("int8") else draft
        full_head = d.model.get_output_embeddings()
        if name.startswith("hf-assisted"):
            out = target.model.generate(
                input_ids=ids, attention_mask=mask, assistant_model=d.model, do_sample=False,
                max_new_tokens=args.max_new_tokens, eos_token_id=list(eos), pad_token_id=tok.pad_token_id,
            )
            new = out[0, ids.shape[1] :].tolist()
            return new, {}
        mode = name.split("+")[0]  # autoregressive | baseline | exact, then what the draft gets
        if "subset" in name:
            restrict_head(d.model, torch.cat([frequent_ids(args.draft_vocab, full_head.weight.shape[0]), ids[0]]))
            if d is draft8:
                quantize_draft(d.loaded)
        got = generate(
            target.model, None if mode == "autoregressive" else d.model, ids, mask, mode=mode, gamma=args.gamma,
            params=GREEDY, max_new_tokens=args.max_new_tokens, eos_token_ids=eos, draft_stop_below=args.draft_stop,
        )
        d.model.set_output_embeddings(full_head)
        return got.tokens[0], got.stats.to_dict()

    totals = {c: {"tokens": 0, "seconds": 0.0, "prefill_s": 0.0, "accepted": 0, "drafted": 0, "verify_s": 0.0,
                  "verify_calls": 0} for c in contenders}
    per_article, mismatches = [], []
    with torch.inference_mode():
        for art in articles:
            ids, mask = task.left_pad(task.encode(tok, target.model, [art], args.max_new_tokens, False), tok.pad_token_id or 0)
            outputs = {}
            for name in contenders:
                start = time.perf_counter()
                new, stats = run(name, ids, mask)
                seconds = time.perf_counter() - start
                outputs[name] = new
                t = totals[name]
                t["tokens"] += len(new)
                t["seconds"] += seconds
                t["prefill_s"] += stats.get("prefill_s", 0.0) or 0.0
                t["accepted"] += stats.get("accepted_tokens", 0) or 0
                t["drafted"] += stats.get("draft_tokens", 0) or 0
                t["verify_s"] += stats.get("verify_s", 0.0) or 0.0
                t["verify_calls"] += stats.get("verify_calls", 0) or 0
                print(f"{art.name:45s} {name:15s} {len(new):4d} tok {seconds:7.2f} s {len(new) / seconds:6.2f} tok/s", flush=True)
            ref = outputs[contenders[0]]
            for name, new in outputs.items():
                n = min(len(new), len(ref))
                if new[:n] != ref[:n]:
                    mismatches.append((art.name, name))
            per_article.append({"article": art.name, "text": tok.decode(ref, skip_special_tokens=True)})

    base = totals.get("autoregressive")
    rows = []
    for name, t in totals.items():
        tps = t["tokens"] / t["seconds"]
        row = {
            "contender": name, "tokens": t["tokens"], "seconds": round(t["seconds"], 2), "tokens_per_s": round(tps, 3),
            "ms_per_token": round(1e3 / tps, 1),
            # after the prompt's prefill (both models'); hf-assisted does not report its prefill
            "decode_tokens_per_s": round(t["tokens"] / (t["seconds"] - t["prefill_s"]), 3) if t["prefill_s"] else None,
            "acceptance_rate": round(t["accepted"] / t["drafted"], 3) if t["drafted"] else None,
            "verify_ms_per_call": round(1e3 * t["verify_s"] / t["verify_calls"], 3) if t["verify_calls"] else None,
        }
        if base:
            row["speedup_vs_autoregressive"] = round(tps / (base["tokens"] / base["seconds"]), 3)
            if row["decode_tokens_per_s"] and base["prefill_s"]:
                base_decode = base["tokens"] / (base["seconds"] - base["prefill_s"])
                row["decode_speedup_vs_autoregressive"] = round(row["decode_tokens_per_s"] / base_decode, 3)
        if "hf-assisted" in totals:
            hf = totals["hf-assisted"]
            row["speedup_vs_hf_assisted"] = round(tps / (hf["tokens"] / hf["seconds"]), 3)
        rows.append(row)
        print(json.dumps(row))
    print("outputs identical to the first contender:", not mismatches, mismatches[:5])
    if args.out:
        result = {
            "command": "python benchmarks/summarize_speed.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in ("", None)),
            "machine": {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__},
            "target": target.name, "draft": draft.loaded.name, "dtype": str(target.dtype), "gamma": args.gamma,
            "draft_vocab": args.draft_vocab, "max_new_tokens": args.max_new_tokens, "articles": [a.name for a in articles],
            "greedy_outputs_identical": not mismatches, "results": rows, "summaries": per_article,
        }
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
