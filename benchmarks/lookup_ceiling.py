"""How much prompt lookup can speed up summarize on this machine: the ceiling set by the target's own costs and by
what lookup proposes, not by one run's timing luck.

1. The target's greedy tokens for the example articles (specdec's loop, autoregressive: the tokens every mode
   gives), and each article's prefill as that run measured it.
2. The target's pass over k tokens, k = 1 .. γmax + 1, on a ~500-token article's cache (interleaved rounds, medians):
   the costs a speculative round pays.
3. Lookup's rounds replayed over those tokens: each round asks drafts/lookup.continuation for up to γ tokens and keeps
   the ones the target would accept (its own next tokens), then one more token from the target; a round costs the
   measured pass over its rows (lookup itself and verification, well under 1 % of a round, are left out):

       constant γ    every round asks for γ
       auto ≤ γmax   decoding/schedule.Auto, fed each replayed round with its measured pass cost
       hindsight     each round drafts exactly the tokens that will be accepted (none: a plain step), the bound of
                     any γ schedule over lookup's proposals

Decode speedup: the tokens' plain steps over the replayed rounds; the wall ratio adds the prefill, read alike by
every mode: (prefill + plain steps) / (prefill + rounds), the bound of `specdec bench --task summarize`'s speedup
with this draft here.

    .venv/bin/python benchmarks/lookup_ceiling.py --out benchmarks/lookup-ceiling-zen5-s35.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from quant_step import torch_pass  # a sibling script (the script's folder is on sys.path)

from specdec_cli.bench.machine import cpu_model
from specdec_cli.bench.runners import data_files
from specdec_cli.decoding import SamplingParams, generate
from specdec_cli.decoding.llama_like import decoder_for
from specdec_cli.decoding.schedule import Auto, Round
from specdec_cli.drafts import spec
from specdec_cli.drafts.lookup import continuation
from specdec_cli.models.causal_lm import eos_ids
from specdec_cli.options import SummarizeOptions
from specdec_cli.tasks import summarize as task


def greedy_rows(target, articles, opts) -> tuple[list[tuple[list[int], list[int]]], float, float]:
    """[(prompt ids, the target's greedy new tokens)] per article; the prefills' and the decodings' seconds summed."""
    rows, prefill, decode = [], 0.0, 0.0
    for article in articles:
        ids = task.encode(target.tokenizer, target.model, [article], opts.max_new_tokens, opts.truncate)[0]
        result = generate(target.model, None, torch.tensor([ids]), mode="autoregressive", params=SamplingParams.of(opts),
                          max_new_tokens=opts.max_new_tokens, eos_token_ids=eos_ids(target))
        rows.append((ids, result.tokens[0]))
        prefill += result.stats.prefill_s
        decode += result.stats.wall_s - result.stats.prefill_s
    return rows, prefill, decode


def pass_costs(target, ids: list[int], kmax: int, rounds: int) -> dict[int, float]:
    """{k: the target's pass over k tokens after `ids`' cache, seconds (median of `rounds`, k interleaved)}."""
    dec = decoder_for(target.model)
    t = torch.tensor([ids + ids[:kmax]])  # the tokens scored: any will do, their cost does not depend on them
    T = len(ids)
    with torch.inference_mode():
        dec.prefill(t[:, :T], None, torch.arange(T)[None])
    seen: dict[int, list[float]] = {k: [] for k in range(1, kmax + 1)}
    for r in range(rounds + 1):
        for k in (range(1, kmax + 1) if r % 2 else range(kmax, 0, -1)):
            dt = torch_pass(dec, T, t, k)
            if r:  # the first round warms up
                seen[k].append(dt)
    return {k: statistics.median(v) for k, v in seen.items()}


def replay(rows, cost: dict[int, float], choose, observe=None) -> tuple[float, int, list[int]]:
    """Lookup's rounds over the greedy tokens: choose(the tokens so far, the tokens still to come) -> the γ asked;
    observe(Round) after each round (a schedule's). -> (seconds, rounds, rows scored per round)."""
    total, sizes = 0.0, []
    longest, shortest = spec.LOOKUP_LONGEST, spec.LOOKUP_SHORTEST
    for prompt, gen in rows:
        context, i = np.array(prompt + gen), len(prompt)
        end = len(context)
        while i < end:
            asked = choose(context[:i], context[i:])
            proposal = continuation(context[:i], min(asked, end - i - 1), longest, shortest) if asked > 0 else []
            a = 0  # the proposal's tokens the target accepts: its own next ones
            while a < len(proposal) and proposal[a] == context[i + a]:
                a += 1
            k = len(proposal) + 1  # rows scored: the proposal and the position before it
            total += cost[k]
            sizes.append(k)
            if observe is not None:
                observe(Round(len(proposal), [a], asked, target_s=cost[k]) if len(proposal) or asked
                        else Round(0, [0], target_s=cost[1]))
            i += a + 1
    return total, len(sizes), sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gamma", type=int, default=SummarizeOptions.gamma, help="γmax (default: the CLI's)")
    ap.add_argument("--rounds", type=int, default=11, help="interleaved rounds of pass timings")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    opts = SummarizeOptions(mode="autoregressive")
    target, _ = task.load_pair(opts, progress=False)
    articles = [task.read_article(str(p)) for p in data_files("summarize", None)]
    rows, prefill, ar_decode = greedy_rows(target, articles, opts)
    kmax = args.gamma + 1
    longest = max(rows, key=lambda r: len(r[0]))[0]
    cost = pass_costs(target, longest, kmax, args.rounds)
    tokens = sum(len(g) for _, g in rows)
    plain = tokens * cost[1]

    results = {}

    def record(name, seconds, rounds, sizes):
        results[name] = {"decode_s": seconds, "rounds": rounds, "tokens_per_round": tokens / rounds,
                         "mean_rows": sum(sizes) / len(sizes), "decode_speedup": plain / seconds,
                         "wall_ratio": (prefill + plain) / (prefill + seconds)}

    for g in range(1, args.gamma + 1):
        record(f"constant {g}", *replay(rows, cost, lambda ctx, rest, g=g: g))
    auto = Auto(args.gamma)
    auto.draft_step.add(0.0)
    auto.verify.add(0.0)
    record(f"auto ≤ {args.gamma}", *replay(rows, cost, lambda ctx, rest: auto.next(), auto.observe))

    def hindsight(ctx, rest):  # as long as the proposal agrees with what follows
        proposal = continuation(ctx, min(args.gamma, len(rest) - 1), spec.LOOKUP_LONGEST, spec.LOOKUP_SHORTEST)
        a = 0
        while a < len(proposal) and proposal[a] == rest[a]:
            a += 1
        return a

    record("hindsight", *replay(rows, cost, hindsight))

    print(f"{cpu_model()}, {torch.get_num_threads()} threads; {len(rows)} articles, {tokens} tokens; prefill "
          f"{prefill:.2f} s; the loop's own autoregressive decoding {ar_decode:.2f} s, {tokens} plain steps at the "
          f"measured step {plain:.2f} s")
    print("pass ms over k tokens: " + ", ".join(f"{k}: {1e3 * v:.1f}" for k, v in cost.items()))
    print(f"{'replay':14s} {'decode s':>9s} {'tok/round':>9s} {'rows':>5s} {'decode ×':>9s} {'wall ×':>7s}")
    for name, r in results.items():
        print(f"{name:14s} {r['decode_s']:9.2f} {r['tokens_per_round']:9.2f} {r['mean_rows']:5.2f} "
              f"{r['decode_speedup']:9.3f} {r['wall_ratio']:7.3f}")
    if args.out:
        args.out.write_text(json.dumps({
            "machine": cpu_model(), "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d"),
            "articles": len(rows), "tokens": tokens, "prefill_s": prefill, "ar_decode_s": ar_decode,
            "pass_ms": {k: 1e3 * v for k, v in cost.items()}, "results": results}, indent=1))


if __name__ == "__main__":
    main()
