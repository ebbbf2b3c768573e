"""Rows that compute alike: a one-token step and a pass over several tokens give each token bit for bit the
same logits, so that greedy speculative output is the autoregressive output in bf16 too.

Where they would differ on a CPU in bf16/fp16 (measured on an AMD EPYC, torch 2.13, oneDNN):
  - a linear layer's one-row product may take another kernel than a many-row one and round otherwise (Qwen2.5
    1.5B: 3 of its 5 shapes; Whisper base: fc2), while products of 2 to 33 rows give each row the same bits;
  - torch's scaled_dot_product_attention gives a row of a many-query call other bits than a one-query call.
Norms, rotary embeddings and activations compute a row alone. So:

    KernelLinear     on a CPU, an fp32 or bf16 linear layer's steps and passes through kernels/float_rows: each row
                     computed alone, the weights read once a call (fp32: 1.1–3.2× torch's product for 1–44 rows of
                     Whisper base's shapes, 2 threads of an AMD EPYC Zen 3; bf16: 1.2–1.9× torch's for 1–5 rows,
                     0.9–1.2× at 9–12, 0.6–0.9× at 44, AMD EPYC Zen 5: benchmarks/README.md, sixteenth session)
    RowLinear        elsewhere (fp16, CUDA, no compiler), a lone row is computed as the first of two (the
                     weights are read once: it costs what one does)
    step_attention   transformers' sdpa, the mask of one query dropped where transformers drops it
    sdpa_by_rows     a pass of up to ROWS queries, one query at a time over the keys a step would see
    fp32_by_rows     the same with each one-query call in fp32 (a causal LM's steps and passes alike)
    kernel_rows      on a CPU, every row of a call in one kernels/rows_attention call, fp32, each row as alone:
                     fp32_by_rows, kernel_or_step and kernel_or_sdpa_by_rows (Whisper's) run it where it runs;
                     slots a row's mask hides (a batch's left padding, the holes its rejected draft tokens leave)
                     change none of its bits there. Where it does not run (CUDA, no compiler), torch's sdpa sums
                     over the hidden slots' places: rows of a batch with holes may then round otherwise than steps
    exact_rows       a shallow copy of a causal LM (weights, buffers shared): in its decoder layers (wherever its
                     family keeps them: adapters.layers_path) every linear layer row_linear's and every attention
                     fp32_by_rows; its output layer row_linear's. A layer that says its rows compute alike already
                     (`rows_alike`: a model on GGUF blocks, models/gguf_linear.py) is kept; its attention is made
                     fp32_by_rows all the same.

One query in fp32: torch's CPU sdpa takes ~7× longer for one bf16 query than for the same in fp32 (Qwen2.5 1.5B,
605 keys: 822 against 126 µs a layer, AMD EPYC, 2 threads), so a causal LM's one-query attention runs in fp32
(K, V cast once per pass and layer), in steps and in passes alike: rows still compute alike, and a step is faster.
On a CPU it runs as kernels/rows_attention (fp32, K and V read as they are, every row and head in one call:
Qwen2.5 1.5B, 600 keys, 2 threads: ~20 µs a step's layer, ~16 µs a row of a 9-row pass, against ~55 µs a row and
the casts through torch).

tests/test_summarize.py (SmolLM2) and tests/test_transcribe.py (Whisper base) check a pass's rows against steps,
bit for bit; models/whisper_decoding.py builds Whisper's decoder from the same pieces.
"""

from __future__ import annotations

from typing import TypeGuard

import torch
from torch import nn

from specdec_cli import internals, options
from specdec_cli.decoding.adapters import layers_path
from specdec_cli.kernels import float_rows, rows_attention

ROWS = options.MAX_GAMMA + 1  # a pass scores at most γ+1 rows; longer calls are prompt prefill, batched as usual


class RowLinear(nn.Module):
    """A linear layer (nn.Linear, or transformers' Conv1D: GPT-2), weights shared, that computes a lone row
    [.., 1, in] as the first of two rows."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.linear = linear

    @property
    def weight(self) -> torch.Tensor:  # what get_output_embeddings() callers read
        weight = self.linear.weight
        assert isinstance(weight, torch.Tensor)
        return weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-1].numel() == 1:
            return self.linear(torch.cat([x, x], -2))[..., :1, :]
        return self.linear(x)


def needs_rows(weight: torch.Tensor) -> bool:
    """Whether rows must be made to compute alike: in bf16/fp16, on a CPU or a GPU. (In fp32 MKL also rounds a
    many-row GEMM otherwise than a one-row GEMV, by far less: only a tie within that rounding could flip.)
    On an H100 (torch 2.11, cuBLAS, benchmarks/gpu-h100): a bf16 product's row had the same bits for any M ≤ 16
    (M ≤ 33 on 4 of TinyLlama's 5 shapes), but sdpa's many-query attention did not give one-query bits: a random
    TinyLlama-shaped target's greedy self:4 output left autoregressive's without exact_rows, and kept it with."""
    return weight.dtype in (torch.bfloat16, torch.float16)


def _is_linear(module: nn.Module) -> bool:
    """nn.Linear itself, or transformers' Conv1D (GPT-2's linear layers: x·W + b with W [in, out]); not a
    subclass (an int8 layer) nor a layer whose rows compute alike already."""
    return type(module) is nn.Linear or type(module).__name__ == "Conv1D"


class KernelLinear(nn.Module):
    """An nn.Linear, weights shared, whose calls of up to ROWS tokens a sequence (a step, a pass: [.., T, in] with
    T ≤ ROWS) run kernels/float_rows, every row computed alone and the weights read once for all of them; longer
    calls (a prompt: every mode prefills alike) run the layer itself."""

    rows_alike = True

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.shape[-2] if x.dim() > 1 else 1) > ROWS:
            return self.linear(x)
        return float_rows.mm(x, self.linear.weight, self.linear.bias)


def takes_kernel(module: nn.Module) -> TypeGuard[nn.Linear]:
    """Whether row_linear gives `module` a KernelLinear once kernels/float_rows is built: an nn.Linear whose weight
    it takes (fp32 or bf16, on a CPU)."""
    return type(module) is nn.Linear and float_rows.takes(module.weight)


def row_linear(linear: nn.Module) -> nn.Module:
    """For a linear layer (_is_linear): KernelLinear(linear) where takes_kernel and kernels/float_rows is built, else
    RowLinear(linear) where needs_rows; anything else is returned as it is."""
    weight = getattr(linear, "weight", None)
    if not (_is_linear(linear) and isinstance(weight, torch.Tensor)):
        return linear
    if takes_kernel(linear) and float_rows.extension() is not None:
        return KernelLinear(linear)
    return RowLinear(linear) if needs_rows(weight) else linear


def step_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention for queries [B, H, T, D], cross-attention computed in its keys' dtype (fp32 on
    a CPU for Whisper without the rows kernel: models.whisper.cross_attention_dtype), the output back in the
    queries'. One query reads only from the first key its mask shows in some row (a sliding window hides the keys
    before it: a step and a pass's row then read the same W keys, however many the cache held), and its mask is
    dropped when it then hides nothing, as transformers' sdpa path drops it (a mask takes another kernel).
    -> (out [B, T, H, D], None)."""
    if query.shape[2] == 1:
        start = _first_shown(attention_mask)
        if start:
            key, value, attention_mask = key[:, :, start:], value[:, :, start:], attention_mask[..., start:]
        attention_mask = internals.sdpa_mask_for_one_query(attention_mask)
    if getattr(module, "is_causal", True) or key.dtype == query.dtype:
        return internals.sdpa_attention(module, query, key, value, attention_mask, **kwargs)
    out, weights = internals.sdpa_attention(module, query.to(key.dtype), key, value, attention_mask, **kwargs)
    return out.to(query.dtype), weights


def _first_shown(mask: torch.Tensor | None) -> int:
    """The first key column a boolean mask [B, 1, 1, S] shows in some row (0 without a mask)."""
    if mask is None or mask.dtype != torch.bool or mask.shape[-1] == 0:
        return 0
    shown = mask.reshape(-1, mask.shape[-1]).any(0)  # [S]
    return int(shown.int().argmax()) if bool(shown.any()) else 0


def sdpa_by_rows(module, query, key, value, attention_mask, *, one_query_dtype=None, **kwargs):
    """Attention for queries [B, H, T, D] with T ≤ ROWS one query row at a time (step_attention) over exactly
    the keys a one-token step would see: the first S − (T−1−r) for row r of a causal self-attention, all S for
    cross-attention. -> ([B, T, H, D], None), each row bit for bit a one-token step's. T > ROWS: batched.
    one_query_dtype: compute each one-query call in this dtype (q, K, V cast; the output cast back)."""
    T, S = query.shape[2], key.shape[2]
    if T > ROWS:
        return step_attention(module, query, key, value, attention_mask, **kwargs)
    if one_query_dtype is not None and query.dtype != one_query_dtype:
        key, value = key.to(one_query_dtype), value.to(one_query_dtype)  # once for every row: a cast is elementwise
        out, _ = sdpa_by_rows(module, query.to(one_query_dtype), key, value, attention_mask, **kwargs)
        return out.to(query.dtype), None
    if T == 1:
        return step_attention(module, query, key, value, attention_mask, **kwargs)
    rows = []
    for r in range(T):
        end = S - (T - 1 - r) if getattr(module, "is_causal", True) else S
        mask = None if attention_mask is None else attention_mask[:, :, r : r + 1, :end]
        rows.append(step_attention(module, query[:, :, r : r + 1], key[:, :, :end], value[:, :, :end], mask,
                                   **kwargs)[0])
    return torch.cat(rows, 1), None


def kernel_rows(module, query, key, value, attention_mask, **kwargs):
    """(out [B, T, H, D], None) from kernels/rows_attention, fp32 inside, each row computed alone (the guarantee of
    sdpa_by_rows, in one call and without casts), or None where it does not run: not on a CPU, more rows than a pass
    (a prefill), the kernel not built, or an attention with what it leaves out (a softcap, sinks, a position bias,
    dropout). Whether it runs does not depend on the rows, so a model's steps and passes take the same path."""
    mask = attention_mask
    if query.shape[2] > ROWS or query.device.type != "cpu" or kwargs.get("dropout") or (mask is not None and mask.dim() != 4) \
            or any(kwargs.get(k) is not None for k in ("softcap", "sinks", "s_aux", "position_bias")):
        return None
    if mask is not None:
        mask = mask[:, :, :, : key.shape[2]]  # as transformers' sdpa: the mask may run past the keys
    scale, causal = kwargs.get("scaling"), kwargs.get("is_causal")
    out = rows_attention.attend(query, key, value, mask, query.shape[-1] ** -0.5 if scale is None else scale,
                                getattr(module, "is_causal", True) if causal is None else bool(causal))
    return None if out is None else (out, None)


def fp32_by_rows(module, query, key, value, attention_mask, **kwargs):
    """sdpa_by_rows with every one-query call in fp32 (the module docstring), as kernel_rows where it runs."""
    return kernel_rows(module, query, key, value, attention_mask, **kwargs) or sdpa_by_rows(
        module, query, key, value, attention_mask, one_query_dtype=torch.float32, **kwargs)


def kernel_or_step(module, query, key, value, attention_mask, **kwargs):
    """step_attention (one query, or a prompt's few) as kernel_rows where it runs."""
    return kernel_rows(module, query, key, value, attention_mask, **kwargs) or step_attention(
        module, query, key, value, attention_mask, **kwargs)


def kernel_or_sdpa_by_rows(module, query, key, value, attention_mask, **kwargs):
    """sdpa_by_rows as kernel_rows where it runs (a step of kernel_or_step's gets the same bits)."""
    return kernel_rows(module, query, key, value, attention_mask, **kwargs) or sdpa_by_rows(
        module, query, key, value, attention_mask, **kwargs)


def copy_with_row_linears(module: nn.Module) -> nn.Module:
    """A shallow copy of `module` with its direct linear children made row_linear."""
    clone = internals.shallow_copy(module)
    for name, child in module.named_children():
        if _is_linear(child):
            setattr(clone, name, row_linear(child))
    return clone


def _rows_copy(module: nn.Module, config, old_config) -> nn.Module:
    """A shallow copy of `module` and of every module below it, each linear layer made row_linear, and each
    module that reads the model's config reading `config` (attention by rows) instead."""
    if _is_linear(module):
        return row_linear(module)
    clone = internals.shallow_copy(module)
    if getattr(module, "config", None) is old_config:
        clone.config = config
    for name, child in module.named_children():
        setattr(clone, name, _rows_copy(child, config, old_config))
    return clone


def by_rows(model: nn.Module) -> bool:
    """Whether exact_rows changes `model`: its output layer needs_rows or is on blocks (whose rows compute alike
    already; attention still needs them), it runs sdpa attention, and layers_path finds its decoder layers."""
    head = model.get_output_embeddings()  # type: ignore[operator]  # a transformers PreTrainedModel's
    return (head is not None and (getattr(head, "rows_alike", False) or needs_rows(head.weight))
            and layers_path(model) is not None and internals.attention_implementation(model.config) == "sdpa")


def exact_rows(model: nn.Module) -> nn.Module:
    """A causal LM whose steps and passes compute each row alike (the module docstring), sharing `model`'s
    weights; `model` itself where by_rows says nothing needs it.
    Limitation: a mixture-of-experts layer computes each expert's rows together, so a step (one row) and a pass
    may round otherwise there (experts are not linear layers); greedy output may then differ from a step's."""
    if not by_rows(model):
        return model
    head = model.get_output_embeddings()  # type: ignore[operator]
    path = layers_path(model)
    assert path is not None  # by_rows found it
    config = internals.config_with_attention(model.config, "specdec_fp32_by_rows", fp32_by_rows)
    clone = parent = internals.shallow_copy(model)
    for name in path[:-1]:  # shallow copies on the way to the layers: the original keeps its own
        child = internals.shallow_copy(getattr(parent, name))
        setattr(parent, name, child)
        parent = child
    layers = getattr(parent, path[-1])
    setattr(parent, path[-1], nn.ModuleList([_rows_copy(layer, config, model.config) for layer in layers]))
    clone.set_output_embeddings(row_linear(head))
    return clone
