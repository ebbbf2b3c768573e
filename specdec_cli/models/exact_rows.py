"""Rows that compute alike: a one-token step and a pass over several tokens give each token bit for bit the
same logits, so that greedy speculative output is the autoregressive output in bf16 too.

Where they would differ on a CPU in bf16/fp16 (measured on an AMD EPYC, torch 2.13, oneDNN):
  - a linear layer's one-row product may take another kernel than a many-row one and round otherwise (Qwen2.5
    1.5B: 3 of its 5 shapes; Whisper base: fc2), while products of 2 to 33 rows give each row the same bits;
  - torch's scaled_dot_product_attention gives a row of a many-query call other bits than a one-query call.
Norms, rotary embeddings and activations compute a row alone. So:

    RowLinear        a lone row is computed as the first of two (the weights are read once: it costs what one does)
    step_attention   transformers' sdpa, the mask of one query dropped where transformers drops it
    sdpa_by_rows     a pass of up to ROWS queries, one query at a time over the keys a step would see
    fp32_by_rows     the same with each one-query call in fp32 (a causal LM's steps and passes alike)
    exact_rows       a shallow copy of a causal LM (weights, buffers shared) made of RowLinear and fp32_by_rows
                     (a model on GGUF blocks, models/gguf_linear.py, keeps its GgufLinear layers: their rows compute
                     alike in any dtype; its attention is made fp32_by_rows all the same)

One query in fp32: torch's CPU sdpa takes ~7× longer for one bf16 query than for the same in fp32 (Qwen2.5 1.5B,
605 keys: 822 against 126 µs a layer, AMD EPYC, 2 threads), so a causal LM's one-query attention runs in fp32
(K, V cast once per pass and layer), in steps and in passes alike: rows still compute alike, and a step is faster.

tests/test_summarize.py (SmolLM2) and tests/test_transcribe.py (Whisper base) check a pass's rows against steps,
bit for bit; models/whisper_decoding.py builds Whisper's decoder from the same pieces.
"""

from __future__ import annotations

import torch
from torch import nn

from specdec_cli import internals, options
from specdec_cli.models.gguf_linear import GgufLinear

ROWS = options.MAX_GAMMA + 1  # a pass scores at most γ+1 rows; longer calls are prompt prefill, batched as usual


class RowLinear(nn.Module):
    """An nn.Linear (weights shared) that computes a lone row [.., 1, in] as the first of two rows."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    @property
    def weight(self) -> torch.Tensor:  # what get_output_embeddings() callers read
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-1].numel() == 1:
            return self.linear(torch.cat([x, x], -2))[..., :1, :]
        return self.linear(x)


def needs_rows(weight: torch.Tensor) -> bool:
    """Whether rows must be made to compute alike: on a CPU in bf16/fp16. (In fp32 MKL also rounds a many-row
    GEMM otherwise than a one-row GEMV, by far less: only a tie within that rounding could flip.)"""
    return weight.device.type == "cpu" and weight.dtype in (torch.bfloat16, torch.float16)


def row_linear(linear: nn.Module) -> nn.Module:
    """RowLinear(linear) for an nn.Linear where needs_rows, else `linear` itself (e.g. an int8 layer)."""
    return RowLinear(linear) if type(linear) is nn.Linear and needs_rows(linear.weight) else linear


def step_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention for queries [B, H, T, D], cross-attention computed in its keys' dtype (fp32 on
    a CPU for Whisper: models.whisper.cross_attention_dtype), the output back in the queries'; one query's mask
    dropped when it hides nothing, as transformers' sdpa path drops it (a mask takes another kernel).
    -> (out [B, T, H, D], None)."""
    if query.shape[2] == 1:
        attention_mask = internals.sdpa_mask_for_one_query(attention_mask)
    if getattr(module, "is_causal", True) or key.dtype == query.dtype:
        return internals.sdpa_attention(module, query, key, value, attention_mask, **kwargs)
    out, weights = internals.sdpa_attention(module, query.to(key.dtype), key, value, attention_mask, **kwargs)
    return out.to(query.dtype), weights


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


def fp32_by_rows(module, query, key, value, attention_mask, **kwargs):
    """sdpa_by_rows with every one-query call in fp32 (the module docstring)."""
    return sdpa_by_rows(module, query, key, value, attention_mask, one_query_dtype=torch.float32, **kwargs)


def copy_with_row_linears(module: nn.Module) -> nn.Module:
    """A shallow copy of `module` with its direct nn.Linear children made row_linear."""
    clone = internals.shallow_copy(module)
    for name, child in module.named_children():
        if type(child) is nn.Linear:
            setattr(clone, name, row_linear(child))
    return clone


def exact_rows(model: nn.Module) -> nn.Module:
    """A causal LM whose steps and passes compute each row alike (the module docstring), sharing `model`'s
    weights; `model` itself when its weights need nothing (needs_rows) or it does not run sdpa attention.
    Relies on the llama layout transformers gives Llama, Qwen2, Mistral, SmolLM: model.model.layers[i] with
    .self_attn (q/k/v/o_proj, reading .config on every call) and .mlp (gate/up/down_proj), and model.lm_head."""
    head = model.get_output_embeddings()
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    on_blocks = isinstance(head, GgufLinear)  # its rows compute alike already; attention still needs them
    if (head is None or not (on_blocks or needs_rows(head.weight)) or layers is None
            or internals.attention_implementation(model.config) != "sdpa"
            or not all(hasattr(layer, "self_attn") and hasattr(layer, "mlp") for layer in layers)):
        return model
    config = internals.config_with_attention(model.config, "specdec_fp32_by_rows", fp32_by_rows)
    clone, clone.model = internals.shallow_copy(model), internals.shallow_copy(inner)
    clone.model.layers = nn.ModuleList()
    for layer in layers:
        layer = internals.shallow_copy(layer)
        layer.self_attn = copy_with_row_linears(layer.self_attn)
        layer.self_attn.config = config  # attention by rows, in fp32; the model's masks stay sdpa's
        layer.mlp = copy_with_row_linears(layer.mlp)
        clone.model.layers.append(layer)
    clone.lm_head = row_linear(model.lm_head)
    return clone
