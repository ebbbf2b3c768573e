"""Prompt lookup against the model draft and the target alone on the example articles: every contender in one
run, interleaved article by article so that machine noise hits them alike. CLI defaults (greedy, bf16 where the
CPU has it, the auto γ schedule and its bound, --target-quant unless given), all cores unless --threads.

    autoregressive     the target alone (specdec's loop)
    embedded           the 0.5B draft, int8, subset head, --draft-stop 0.4 (the default draft before lookup)
    lookup             prompt lookup, no second model (drafts/lookup.py): the default draft
    lookup+embedded    lookup where an n-gram matches, the model draft elsewhere
    hf-lookup          transformers' generate(prompt_lookup_num_tokens=γ) on the same target: the tool people use
    NAME@G             NAME with --gamma G (e.g. lookup@8: longer proposals)

Decode-only tokens/s (prefill excluded) and wall tokens/s (prefill included); whether each output equals the
autoregressive one token for token; acceptance and tokens per target call.

    .venv/bin/python benchmarks/lookup_speed.py --out benchmarks/summarize-lookup.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec_cli.bench.machine import cpu_model
from specdec_cli.bench.runners import data_files
from specdec_cli.models.causal_lm import eos_ids
from specdec_cli.options import SummarizeOptions
from specdec_cli.tasks import summarize as task


def hf_lookup(target, article, opts):
    """transformers' prompt lookup on the same prompt: (tokens, seconds incl. prefill)."""
    ids = task.encode(target.tokenizer, target.model, [article], opts.max_new_tokens, False)[0]
    t0 = time.perf_counter()
    eos = sorted(eos_ids(target))
    out = target.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=opts.max_new_tokens,
                                prompt_lookup_num_tokens=opts.gamma, eos_token_id=eos, pad_token_id=eos[0])
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--articles", type=int, default=0, help="how many example articles (0 = all seven)")
    ap.add_argument("--contenders", default="autoregressive,embedded,lookup,lookup+embedded,hf-lookup")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores, torch's default)")
    ap.add_argument("--target-quant", default=SummarizeOptions.target_quant, help="as summarize's --target-quant")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    articles = [task.read_article(p) for p in data_files("summarize", None)][: args.articles or None]
    opts = SummarizeOptions(draft="embedded", target_quant=args.target_quant)  # the CLI's defaults but these
    target, model_draft = task.load_pair(opts, progress=False)
    drafts = {"embedded": model_draft, "lookup": task.load_draft("lookup", target),
              "lookup+embedded": task.load_draft("lookup+embedded", target)}
    contenders = args.contenders.split(",")
    rows = []
    for article in articles:
        want = None
        for name in contenders:
            base, _, g = name.partition("@")
            o = opts.replace(gamma=int(g)) if g else opts
            if base == "hf-lookup":
                tokens, wall = hf_lookup(target, article, o)
                text = target.tokenizer.decode([t for t in tokens if t not in eos_ids(target)],
                                               skip_special_tokens=True).strip()
                row = {"new_tokens": len(tokens), "wall_s": wall}
            else:
                mode = "autoregressive" if base == "autoregressive" else o.mode
                (s,) = task.summarize(target, drafts.get(base), [article], o, mode=mode)
                text, st = s.text, s.stats
                row = {"new_tokens": st.new_tokens, "wall_s": st.wall_s, "prefill_s": st.prefill_s,
                       "decode_tok_s": st.new_tokens / (st.wall_s - st.prefill_s), "target_calls": st.target_calls,
                       "acceptance_rate": st.acceptance_rate, "tokens_per_call": st.new_tokens / max(1, st.target_calls)}
            want = text if name == "autoregressive" else want
            row.update(article=Path(article.name).name, contender=name, wall_tok_s=row["new_tokens"] / row["wall_s"],
                       same_as_autoregressive=None if want is None else text == want)
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for name in contenders:
        mine = [r for r in rows if r["contender"] == name]
        tokens = sum(r["new_tokens"] for r in mine)
        summary[name] = {"wall_tok_s": tokens / sum(r["wall_s"] for r in mine),
                         "same_as_autoregressive": sum(bool(r["same_as_autoregressive"]) for r in mine)}
        if "prefill_s" in mine[0]:
            summary[name]["decode_tok_s"] = tokens / sum(r["wall_s"] - r["prefill_s"] for r in mine)
            summary[name]["tokens_per_call"] = tokens / sum(r["target_calls"] for r in mine)
    base = summary.get("autoregressive")
    for name, s in summary.items():
        if base:
            s["wall_ratio"] = s["wall_tok_s"] / base["wall_tok_s"]
            if "decode_tok_s" in s:
                s["decode_ratio"] = s["decode_tok_s"] / base["decode_tok_s"]
        print(name, json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()}))
    result = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "articles": len(articles), "summary": summary, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
