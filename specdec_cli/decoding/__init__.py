"""The decoding loop and what it needs: the loop's stages, the model adapter, what a draft is to the loop, the
stats, sampling, and the verification registry.

    loop.py      generate(): prefill → draft γ → score γ+1 → verify → crop caches → adapt γ
    slots.py     Slots: the slot grid both models share (drafts read it, the loop alone changes it)
    draft.py     Draft (the protocol every draft kind follows), Batch, DraftSettings, Proposal, ModelDraft
    adapters.py  Decoder, Seq2SeqDecoder: how a model with a KV cache enters the loop; where its layers are
    exact_rows.py a causal LM whose multi-token passes compute each row as its one-token steps do
    llama_like.py LlamaLike: a Llama-shaped causal LM (Llama, Qwen2, Mistral) on a CPU without transformers' forward
                  around its layers (same operations, same bits); decoder_for: how the loop drives a target
    schedule.py  the γ schedules: constant, heuristic, auto (γ from measured costs and acceptance)
    stats.py     GenerationStats, GenerationResult, merge_stats, rows_share
    sampling.py  temperature, top-k, top-p; inverse-CDF sampling with caller-supplied uniforms
    verify.py    the verification contract and VERIFIERS: one entry per mode, the kernels behind it
    threads.py   Threads: the CPU thread count of a run, fewer while other processes keep cores busy

Imports run downward only: decoding uses kernels, never models, drafts, tasks, bench or the CLI.
"""

from specdec_cli.decoding.adapters import Decoder, LogitsHook, Seq2SeqDecoder
from specdec_cli.decoding.draft import Batch, Draft, DraftSettings, ModelDraft, Proposal, as_draft
from specdec_cli.decoding.loop import generate
from specdec_cli.decoding.sampling import SamplingParams
from specdec_cli.decoding.schedule import make as make_schedule
from specdec_cli.decoding.slots import Slots
from specdec_cli.decoding.stats import GenerationResult, GenerationStats, merge_stats, rows_share
from specdec_cli.decoding.threads import Threads
from specdec_cli.decoding.verify import VERIFIERS, Verifier

__all__ = ["VERIFIERS", "Batch", "Decoder", "Draft", "DraftSettings", "GenerationResult", "GenerationStats",
           "LogitsHook", "ModelDraft", "Proposal", "SamplingParams", "Seq2SeqDecoder", "Slots", "Threads", "Verifier",
           "as_draft", "generate", "make_schedule", "merge_stats", "rows_share"]
