"""How a causal LM's weights are held on a CPU: `--target-quant gguf|none|int8|int4` (summarize), for the target and
for a draft model alike.

    gguf   a GGUF model (embedded, a .gguf file, a folder holding one) runs its linear layers on the file's own blocks
           (models/gguf_linear.py, kernels/qmatmul): exactly the weights the file means, ~1/3 of bf16's bytes, and a
           pass's rows computed as its steps' are. Any other model is held as it is (as `none`). The default.
    none   every weight dequantized to the compute dtype (--dtype): what CUDA runs, and what specdec did before.
    int8   a model without a GGUF (safetensors, a hub id) quantized weight-only at load: Q8_0 blocks (int8, one fp16
           scale per 32 weights of a row); int4: Q4_1 blocks (4 bits, a scale and a minimum per 32), llama.cpp's own
           reference quantizers (kernels/gguf_blocks.quantize). Per group of 32 rather than per channel: finer, and
           the same kernel runs them, so greedy speculative output is still this model's autoregressive output. Opt-in:
           another model than the one given.

On CUDA, `gguf` is `none` (the blocks kernel is a CPU kernel) and int8 / int4 are refused.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from specdec_cli.errors import SpecdecError
from specdec_cli.models.gguf_linear import GgufLinear, attach_gguf_blocks, join_and_pack, step_kernels
from specdec_cli.models.loading import LoadedModel
from specdec_cli.models.progress import build_kernels

QTYPES = {"int8": "q8_0", "int4": "q4_1"}  # --target-quant -> the blocks a model without a GGUF is quantized to
GROUP = 32  # weights per scale (a row's length must be a multiple of it)


def load_held(spec: str, form: str, *, role: str = "target", dtype: torch.dtype | str = "auto", device: str = "cpu",
              progress: bool = True) -> LoadedModel:
    """The causal LM `spec` names, its linear layers held in `form` (hold): a GGUF that runs on its blocks (gguf on
    a CPU) read from the file alone (gguf_linear.load_gguf_causal_lm: no dequantized copy of the whole model, the
    same values), any other loaded (loading.load_model), then held."""
    from specdec_cli.models.causal_lm import CAUSAL_LM, gguf_file
    from specdec_cli.models.gguf_linear import load_gguf_causal_lm
    from specdec_cli.models.loading import load_model

    path = gguf_file(spec, role, progress) if form == "gguf" and torch.device(device).type == "cpu" else None
    if path is not None:
        return load_gguf_causal_lm(spec, role=role, dtype=dtype, progress=progress, path=path)
    loaded = load_model(spec, CAUSAL_LM, role=role, dtype=dtype, device=device, progress=progress)
    hold(loaded, form, role, progress)
    return loaded


def hold(loaded: LoadedModel, form: str, role: str = "target", progress: bool = True) -> str:
    """Hold `loaded`'s linear layers in `form` (the module docstring), in place; returns the form they are in
    ("gguf", "int8", "int4" or "none") and records it as loaded.weights."""
    from specdec_cli.models.causal_lm import gguf_file

    held = "none"
    on_cpu = loaded.device.type == "cpu"
    if form in QTYPES and not on_cpu:
        raise SpecdecError(f"--target-quant {form} runs on a CPU only (the {role} is on {loaded.device})")
    if form != "none" and on_cpu and loaded.source != "self":
        path = gguf_file(loaded.spec, role, progress) if loaded.source in ("embedded", "gguf") else None
        if form == "gguf" and path is not None:
            attach_gguf_blocks(loaded.model, path)
            held = "gguf"
        elif form in QTYPES:
            if path is not None:
                raise SpecdecError(f"--target-quant {form} quantizes a model that has no GGUF; the {role} "
                                   f"{loaded.name} is a GGUF: its own blocks run with --target-quant gguf (the default)")
            quantize_linears(loaded.model, QTYPES[form])
            held = form
    if on_cpu:  # at load: no input's time holds a build
        build_kernels(progress, step_kernels(loaded.model))
    loaded.weights = held
    return held


def quantize_linears(model: nn.Module, qtype: str) -> dict[str, int]:
    """Replace, in place, every nn.Linear of `model` whose rows are a multiple of GROUP long by a GgufLinear on its
    weight quantized to `qtype` (q8_0 | q4_1), the output layer included (untied from the embeddings, which stay).
    Returns {qtype: layers}."""
    dtype = next(model.parameters()).dtype
    count = replace_linears(model, lambda linear: GgufLinear.quantized(linear, qtype, dtype),
                            lambda linear: linear.in_features % GROUP == 0)
    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False  # the head is its own module now: transformers must not re-tie it
    join_and_pack(model)  # as a GGUF's layers are: packed where AVX-512 VNNI or AVX2 runs
    return {qtype: count}


def replace_linears(module: nn.Module, make: Callable[[nn.Linear], nn.Module],
                    where: Callable[[nn.Linear], bool] = lambda linear: True) -> int:
    """Replace, in place, every plain nn.Linear inside `module` for which `where(linear)` holds by `make(linear)`
    (a layer replaced already is not an nn.Linear: replacing twice does nothing); returns how many."""
    found = [(parent, name, child) for parent in list(module.modules()) for name, child in parent.named_children()
             if type(child) is nn.Linear and where(child)]
    for parent, name, child in found:
        setattr(parent, name, make(child))
    return len(found)
