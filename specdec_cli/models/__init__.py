"""Models: from a spec (`embedded`, a directory, a .gguf file, a hub id) to a model ready to run.

    loading.py          LoadedModel, Family, and the one route from a spec to a model (hub included)
    causal_lm.py        causal LMs for summarize: the embedded Qwen pair and SmolLM2, GGUF files
    gguf_linear.py      a GGUF causal LM whose linear layers run on the file's own blocks (kernels/qmatmul)
    whisper.py          Whisper models for transcribe; special token ids and prompts
    whisper_decoding.py how Whisper enters the loop for a batch of windows: encoder once, cross-attention K/V,
                        WindowDecoder, ExactScorer
    whisper_convert.py  CTranslate2 Whisper (the embedded packages) -> transformers, without ctranslate2
    weights.py          how a causal LM's weights are held on a CPU: --target-quant gguf | none | int8 | int4
    int8.py             int8 products for Whisper's linear layers (transcribe --target-int8, --encoder-int8)
    compatible.py       whether a draft can draft for a target: the one rule; loading such a draft
    device.py           --device and --dtype for this machine
    cache.py            the user cache of converted models, written atomically
    progress.py         what a user sees while a model loads

Models know nothing of drafts, tasks, bench or the CLI; transformers' private internals are reached only
through specdec_cli/internals.py.
"""

from specdec_cli.models.causal_lm import EMBEDDED, load_causal_lm
from specdec_cli.models.compatible import check_compatible, load_compatible
from specdec_cli.models.device import cpu_has_fast_bf16, resolve_device, resolve_dtype
from specdec_cli.models.loading import LoadedModel, load_model
from specdec_cli.models.whisper import load_whisper

__all__ = [
           "EMBEDDED",
           "LoadedModel",
           "check_compatible",
           "cpu_has_fast_bf16",
           "load_causal_lm",
           "load_compatible",
           "load_model",
           "load_whisper",
           "resolve_device",
           "resolve_dtype",
]
