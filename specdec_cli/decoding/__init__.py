"""The decoding loop and what it needs: the loop's stages, the model adapter, the stats, sampling, and the
one entry point to verification.

    loop.py      generate(): prefill → draft γ → score γ+1 → verify → crop caches → adapt γ
    adapters.py  Decoder, Seq2SeqDecoder: how a model with a KV cache enters the loop
    schedule.py  the γ schedules: constant, heuristic, auto (γ from measured costs and acceptance)
    stats.py     GenerationStats, GenerationResult, merge_stats
    sampling.py  temperature, top-k, top-p; inverse-CDF sampling with caller-supplied uniforms
    verify.py    the verification contract and verify(mode, ...): the kernels behind one call

Imports run downward only: decoding uses kernels, never models, drafts, tasks, bench or the CLI.
"""

from specdec_cli.decoding.adapters import Decoder, LogitsHook, Seq2SeqDecoder, as_decoder
from specdec_cli.decoding.loop import generate
from specdec_cli.decoding.sampling import SamplingParams
from specdec_cli.decoding.schedule import make as make_schedule
from specdec_cli.decoding.stats import GenerationResult, GenerationStats, merge_stats

__all__ = ["Decoder", "GenerationResult", "GenerationStats", "LogitsHook", "SamplingParams", "Seq2SeqDecoder",
           "as_decoder", "generate", "make_schedule", "merge_stats"]
