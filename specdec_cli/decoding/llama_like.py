"""A Llama-shaped causal LM driven without transformers' forward around its layers: its own modules and transformers'
arithmetic, minus what a step pays for besides them.

    LlamaLike    Decoder for a causal LM of a family in FAMILIES on a CPU: embeddings, then per layer
                     h = x + o(attention(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))
                     x = h + down(act(gate(n2(h))) · up(n2(h)))
                 then the final norm and the output layer over the rows kept; n1, n2 RMS norms, rope from the
                 model's own rotary module (every rope type it knows), attention exact_rows.fp32_by_rows (each row
                 as a step computes it; a prompt through kernels/frames_attention on an AVX2 CPU, else sdpa), K
                 and V in a preallocated cache (no concatenation a step, a crop only moves the length).
    decoder_for  the Decoder the loop drives a target by: LlamaLike(exact_rows(model)) where it applies, else
                 Decoder(exact_rows(model)).
    draft_decoder  the same for a draft model, without exact_rows (a draft's rows need not compute alike).

Why: transformers' forward costs a Qwen2.5-1.5B step on GGUF blocks ~5.5 ms besides its products (module calls,
the cache's 56 concatenations, its masks, config lookups, 8 torch ops a norm; AMD EPYC, 2 threads), a sixth of
the step. Linear layers whose GGUF blocks lie side by side in one buffer (q, k, v; gate, up: models/gguf_linear.py
joins them on load) are multiplied in one call, their outputs then split: each output is computed alone, so the
bits are the same. In bf16 and fp32 the residual adds, norms and rotary embedding run fused (kernels/layer_ops.py).

Its logits: transformers' bit for bit with the torch ops (where layer_ops does not run, and in
tests/test_llama_like.py); with the fused ones the norms' sums of squares are added in an order of their own, so
the logits are transformers' up to the rounding of the activations' dtype. Either way each row of a pass gets a step's bits, so greedy
speculative output is this model's autoregressive output.
"""

from __future__ import annotations

import torch

from specdec_cli import internals
from specdec_cli.decoding.adapters import Decoder
from specdec_cli.decoding.exact_rows import ROWS, by_rows, exact_rows, fp32_by_rows, needs_rows, takes_kernel
from specdec_cli.kernels import float_rows, frames_attention, layer_ops, rows_attention

# config.model_type of the families whose decoder layer is the one above (no sliding window, no extra norms)
FAMILIES = ("llama", "qwen2", "mistral")


def applies(model) -> bool:
    """Whether LlamaLike drives `model`: a family of FAMILIES without a sliding window, on a CPU, its layers where
    transformers keeps them (model.model.layers), with the parts the forward above names."""
    config = getattr(model, "config", None)
    base = getattr(model, "model", None)
    if config is None or getattr(config, "model_type", None) not in FAMILIES or internals.sliding_window(config):
        return False
    if base is None or not hasattr(base, "rotary_emb") or not hasattr(base, "layers") or len(base.layers) == 0:
        return False
    if next(model.parameters()).device.type != "cpu" or internals.attention_implementation(config) != "sdpa":
        return False
    layer = base.layers[0]
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")) and \
        all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")) and \
        all(hasattr(norm, "variance_epsilon") for norm in (layer.input_layernorm, base.norm))


def cpu_kernels(model) -> tuple:
    """The C++ kernels decoder_for(model)'s steps run on a CPU, besides the products on blocks: attention by rows
    where exact_rows changes the model, float_rows where it then holds layers row_linear gives a KernelLinear
    (takes_kernel), and the fused norms, the rotary embedding and (an AVX2 or AVX-512 CPU, heads it takes) a prompt's
    attention where LlamaLike then drives it."""
    if not by_rows(model):
        return ()
    linears = any(takes_kernel(m) for m in model.modules())
    lean = applies(model)
    prompt = lean and frames_attention.takes(model.model.layers[0].self_attn.head_dim)
    return (rows_attention.KERNEL, *((float_rows.KERNEL,) if linears else ()),
            *((layer_ops.KERNEL,) if lean else ()), *((frames_attention.KERNEL,) if prompt else ()))


def decoder_for(model) -> Decoder:
    """How the loop drives a target: its rows computed alike (exact_rows), by LlamaLike where it applies and
    exact_rows changed something (bf16/fp16 or GGUF blocks, where transformers' forward attends by rows too)."""
    rows = exact_rows(model)
    return LlamaLike(rows) if rows is not model and applies(model) else Decoder(rows)


def draft_decoder(model) -> Decoder:
    """How the loop drives a draft model: by LlamaLike where it applies and the model is in bf16/fp16 (on GGUF blocks
    too), where transformers' forward would run its one-query attention in bf16 (several times fp32's cost on a CPU:
    exact_rows' docstring) besides the rest of its overhead; Qwen2.5-0.5B on its GGUF blocks, a step after a
    500-token prompt: 31 -> 21 ms (AMD EPYC, 2 threads). Its logits are then not transformers' bits (fp32 attention),
    which a draft's need not be: only the target's decide the output."""
    return LlamaLike(model) if applies(model) and needs_rows(next(model.parameters())) else Decoder(model)


class _Products:
    """Linear layers that read the same input -> their outputs, in order: the parts a joint layer holds side by side
    (their `joint`, from `joint_start` on: models/gguf_linear.py) in one call, its output split, the others alone."""

    def __init__(self, *parts):
        self.calls: list[tuple[torch.nn.Module, list[int] | None]] = []  # (layer, split sizes or None: one output)
        i = 0
        while i < len(parts):
            joint, start, j = getattr(parts[i], "joint", None), 0, i
            while joint is not None and j < len(parts) and getattr(parts[j], "joint", None) is joint \
                    and getattr(parts[j], "joint_start", None) == start:
                start, j = start + parts[j].out_features, j + 1
            if joint is not None and j > i + 1 and start == joint.out_features and parts[i].joint_start == 0:
                self.calls.append((joint, [p.out_features for p in parts[i:j]]))
                i = j
            else:
                self.calls.append((parts[i], None))
                i += 1

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for layer, sizes in self.calls:
            y = layer(x)
            out.extend([y] if sizes is None else y.split(sizes, -1))
        return out


class _GatedAct:
    """act(g) · u for [g, u] = gate_up(h): a SiLU over one joint product (the two halves of one layer's output) in one
    pass over it (layer_ops.silu_mul), else as transformers computes it."""

    def __init__(self, gate_up: _Products, act: torch.nn.Module, ops: layer_ops.LayerOps):
        self.gate_up, self.act, self.ops = gate_up, act, ops
        (layer, sizes), *rest = gate_up.calls
        halves = not rest and sizes is not None and len(sizes) == 2 and sizes[0] == sizes[1]
        self.joint = layer if halves and ops.ext is not None and type(act).__name__ in SILU else None

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if self.joint is not None:
            return self.ops.silu_mul(self.joint(h))
        g, u = self.gate_up(h)
        return self.act(g) * u


SILU = ("SiLU", "SiLUActivation")  # torch's and transformers' SiLU modules


class LlamaLike(Decoder):
    """The module docstring's forward over `model` (exact_rows' copy: its linear layers compute rows alike)."""

    def __init__(self, model):
        super().__init__(model)
        base = model.model
        self.embed, self.norm, self.rotary = base.embed_tokens, base.norm, base.rotary_emb
        self.head = model.get_output_embeddings()
        self.dtype = self.embed.weight.dtype
        self.ops = layer_ops.LayerOps(self.dtype)
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((layer.input_layernorm, a, _Products(a.q_proj, a.k_proj, a.v_proj), a.o_proj,
                                layer.post_attention_layernorm,
                                _GatedAct(_Products(m.gate_proj, m.up_proj), m.act_fn, self.ops), m.down_proj))
        config = model.config
        self.head_dim = base.layers[0].self_attn.head_dim
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.keys: list[torch.Tensor] = []  # per layer [B, KV heads, slots, head_dim]
        self.values: list[torch.Tensor] = []

    def new_cache(self):
        return None

    def reset(self) -> None:
        self.keys, self.values, self.length = [], [], 0

    def _reserve(self, batch: int, end: int) -> None:
        """Every layer's cache [B, KV heads, slots, head_dim] with room for slots 0 .. end (grown by doubling)."""
        have = self.keys[0].shape[2] if self.keys else 0
        if self.keys and end <= have:
            return
        shape = (batch, self.kv_heads, max(64, 2 * end), self.head_dim)
        for cache in (self.keys, self.values):
            grown = [torch.empty(shape, dtype=self.dtype) for _ in self.layers]
            for old, new in zip(cache, grown, strict=False):
                new[:, :, : self.length] = old[:, :, : self.length]
            cache[:] = grown

    def _hidden(self, tokens, mask, positions, keep: int = 0) -> torch.Tensor:
        """tokens, positions [B, T] at slots length..length+T (mask [B, length+T] bool or None) -> the final norm's
        output [B, T, d], or [B, keep, d] for the last `keep` rows when 0 < keep ≤ ROWS < T (a prompt: the last
        layer's attention, o and MLP for those rows only, as a pass computes them, every mode alike); every row's
        keys and values go into the cache."""
        B, T = tokens.shape
        start, end = self.length, self.length + T
        self._reserve(B, end)
        x = self.embed(tokens)  # [B, T, d]
        cos, sin = (t.contiguous() for t in self.rotary(x, positions))  # [B, T, head_dim] each
        # a mask where a row has holes, or where sdpa reads more keys than queries (its causal mask would align them
        # at the first key: a prompt's second chunk); the row kernel aligns the queries at the last key itself
        shown = None
        holes = mask is not None and not bool(mask[:, :end].all())
        if holes or (T > ROWS and start > 0):
            slot = torch.arange(end, device=x.device)
            shown = (slot[None, :] <= slot[start:, None])[None, None]  # [1, 1, T, end]: causal
            if holes:
                shown = shown & mask[:, None, None, :end]  # [B, 1, T, end]
        y = None  # what the last layer adds to x
        trim = len(self.layers) - 1 if 0 < keep <= ROWS < T else None  # the layer after which only `keep` rows count
        for i, (n1, attn, qkv, o, n2, gated, down) in enumerate(self.layers):
            x, h = self.ops.add_rms(x, y, n1)
            q, k, v = (t.view(B, T, -1, self.head_dim) for t in qkv(h))  # [B, T, heads, head_dim]
            q = self.ops.rope_store(q, k, v, cos, sin, self.keys[i], self.values[i], start)  # [B, heads, T, hd]
            keys, values = self.keys[i][:, :, :end], self.values[i][:, :, :end]
            if i == trim:  # the last `keep` queries: a pass's rows, aligned at the last key
                q, x = q[:, :, -keep:], x[:, -keep:].contiguous()  # [B, heads, keep, hd], [B, keep, d]
                shown = shown[:, :, -keep:] if holes and shown is not None else None  # [B, 1, keep, end] or aligned
            t = q.shape[2]
            a = rows_attention.attend(q, keys, values, shown, attn.scaling) if t <= ROWS else None  # exact_rows'
            if a is None and t > ROWS and not holes and frames_attention.runs(q, keys, values, causal=True):
                a = frames_attention.attend(q, keys, values, attn.scaling, causal=True)  # a prompt's, every mode's
            if a is None:  # kernel_rows, without its checks: a CPU, no dropout, a bool mask or none
                a, _ = fp32_by_rows(attn, q, keys, values, shown, dropout=0.0, scaling=attn.scaling)
            x, h = self.ops.add_rms(x, o(a.reshape(B, t, -1)), n2)  # a [B, t, heads, hd]
            y = down(gated(h))  # act(gate(h)) · up(h)
        return self.ops.add_rms(x, y, self.norm)[1]

    def _call(self, tokens, mask, positions, keep: int) -> torch.Tensor:
        h = self._hidden(tokens, mask, positions, keep)
        return self.head(h[:, -keep:].contiguous() if keep else h)  # dense rows: see Decoder._call

    def prefill(self, tokens, mask, positions) -> None:
        self.reset()
        if tokens.shape[1] > 0:
            self._call(tokens, mask, positions, keep=1)
            self.length, self.seen = tokens.shape[1], tokens

    def check_rollback(self) -> None:
        return None  # K and V slots only: a crop drops any number of them

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def select(self, rows: torch.Tensor) -> None:
        self.keys = [t.index_select(0, rows) for t in self.keys]
        self.values = [t.index_select(0, rows) for t in self.values]
        if self.length > 0:
            self.seen = self.seen.index_select(0, rows)
        self.forward_kwargs = {}
