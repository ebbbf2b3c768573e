"""Prompt lookup for transcribe: decoder time of the target alone, the default self draft, lookup and lookup+self
on one recording (CLI defaults, all cores), two interleaved runs after a warm-up; checks every output against
the autoregressive one.

    .venv/bin/python benchmarks/transcribe_lookup.py RECORDING.wav     # e.g. tasks.transcribe.joined_librivox(3)
"""
import sys

import torch

from specdec_cli.bench.machine import cpu_model
from specdec_cli.options import TranscribeOptions
from specdec_cli.tasks import transcribe as T

wav = sys.argv[1]
opts = TranscribeOptions(batch_size=1)  # a window at a time, as this script always measured
target, self_draft = T.load_pair(opts, progress=False)
drafts = {"self": self_draft, "lookup": T.load_draft("lookup", target), "lookup+self": T.load_draft("lookup+self", target)}
T.transcribe(target, None, [wav], opts, mode="autoregressive")  # warm-up
out = {}
for rep in range(2):
    for name in ("autoregressive", "self", "lookup", "lookup+self"):
        mode = "autoregressive" if name == "autoregressive" else "exact"
        (r,) = T.transcribe(target, drafts.get(name), [wav], opts, mode=mode)
        s = r.stats
        out.setdefault(name, []).append((round(s.decoder_s, 2), r.text))
        print(name, rep, round(s.decoder_s, 2), "s decoder", s.new_tokens, "tokens", s.target_calls, "calls",
              None if s.acceptance_rate is None else round(s.acceptance_rate, 2), flush=True)
ar = out["autoregressive"][0][1]
print(cpu_model(), torch.get_num_threads(), "threads; same as AR:", {k: all(t == ar for _, t in v) for k, v in out.items()})
