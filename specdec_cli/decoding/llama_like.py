"""A Llama-shaped causal LM driven without transformers' forward around its layers: the same modules and the same
operations, in the same order and dtypes, minus what a step pays for besides them.

    LlamaLike    Decoder for a causal LM of a family in FAMILIES on a CPU: embeddings, then per layer
                     h = x + o(attention(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))
                     x = h + down(act(gate(n2(h))) · up(n2(h)))
                 then the final norm and the output layer over the rows kept; n1, n2 RMS norms (transformers'
                 formula), rope from the model's own rotary module (every rope type it knows), attention
                 exact_rows.fp32_by_rows (each row as a step computes it; a prompt through sdpa), K and V in a
                 preallocated cache (no concatenation a step, a crop only moves the length).
    decoder_for  the Decoder the loop drives a target by: LlamaLike(exact_rows(model)) where it applies, else
                 Decoder(exact_rows(model)).
    draft_decoder  the same for a draft model, without exact_rows (a draft's rows need not compute alike).

Why: transformers' forward costs a Qwen2.5-1.5B step on GGUF blocks ~5.5 ms besides its products (module calls,
the cache's 56 concatenations, its masks, config lookups; AMD EPYC, 2 threads), a sixth of the step. Linear layers
whose GGUF blocks lie side by side in one buffer (q, k, v; gate, up: models/gguf_linear.py joins them on load) are
multiplied in one call, their outputs then split: each output is computed alone, so the bits are the same.

A layer computes what transformers' computes, bit for bit: the same torch operations on the same tensors
(tests/test_summarize.py checks logits against the model's own forward, and greedy output against its generate()).
"""

from __future__ import annotations

import torch

from specdec_cli import internals
from specdec_cli.decoding.adapters import Decoder
from specdec_cli.decoding.exact_rows import exact_rows, fp32_by_rows, needs_rows

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
        all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))


def decoder_for(model) -> Decoder:
    """How the loop drives a target: its rows computed alike (exact_rows), by LlamaLike where it applies and
    exact_rows changed something (its attention is then fp32_by_rows in transformers' forward too: the same bits)."""
    rows = exact_rows(model)
    return LlamaLike(rows) if rows is not model and applies(model) else Decoder(rows)


def draft_decoder(model) -> Decoder:
    """How the loop drives a draft model: by LlamaLike where it applies and the model is in bf16/fp16 (on GGUF blocks
    too), where transformers' forward would run its one-query attention in bf16 (several times fp32's cost on a CPU:
    exact_rows' docstring) besides the rest of its overhead; Qwen2.5-0.5B on its GGUF blocks, a step after a
    500-token prompt: 31 -> 21 ms (AMD EPYC, 2 threads). Its logits are then not transformers' bits (fp32 attention),
    which a draft's need not be: only the target's decide the output."""
    return LlamaLike(model) if applies(model) and needs_rows(next(model.parameters())) else Decoder(model)


def _rms(norm, x: torch.Tensor) -> torch.Tensor:
    """transformers' RMS norm (Llama's, Qwen2's, Mistral's): x in fp32 over its root mean square, back to x's dtype,
    times the weight."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


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


class LlamaLike(Decoder):
    """The module docstring's forward over `model` (exact_rows' copy: its linear layers compute rows alike)."""

    def __init__(self, model):
        super().__init__(model)
        base = model.model
        self.embed, self.norm, self.rotary = base.embed_tokens, base.norm, base.rotary_emb
        self.head = model.get_output_embeddings()
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((layer.input_layernorm, a, _Products(a.q_proj, a.k_proj, a.v_proj), a.o_proj,
                                layer.post_attention_layernorm, _Products(m.gate_proj, m.up_proj), m.act_fn,
                                m.down_proj))
        self.keys: list[torch.Tensor] = []  # per layer [B, KV heads, slots, head_dim]
        self.values: list[torch.Tensor] = []

    def new_cache(self):
        return None

    def reset(self) -> None:
        self.keys, self.values, self.length = [], [], 0

    def _store(self, i: int, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, KV heads, T, head_dim] into layer i's slots start..start+T (grown by doubling) -> the layer's
        keys and values of slots 0..start+T (views)."""
        end = start + k.shape[2]
        if i == len(self.keys):
            self.keys.append(k.new_empty(*k.shape[:2], max(64, 2 * end), k.shape[3]))
            self.values.append(v.new_empty(*v.shape[:2], max(64, 2 * end), v.shape[3]))
        elif end > self.keys[i].shape[2]:
            more = max(end, 2 * self.keys[i].shape[2])
            for cache in (self.keys, self.values):
                grown = cache[i].new_empty(*cache[i].shape[:2], more, cache[i].shape[3])
                grown[:, :, :start] = cache[i][:, :, :start]
                cache[i] = grown
        self.keys[i][:, :, start:end] = k
        self.values[i][:, :, start:end] = v
        return self.keys[i][:, :, :end], self.values[i][:, :, :end]

    def _hidden(self, tokens, mask, positions) -> torch.Tensor:
        """tokens, positions [B, T] at slots length..length+T (mask [B, length+T] bool or None) -> the last layer's
        output [B, T, d]; their keys and values go into the cache."""
        B, T = tokens.shape
        start, end = self.length, self.length + tokens.shape[1]
        x = self.embed(tokens)  # [B, T, d]
        cos, sin = (t.unsqueeze(1) for t in self.rotary(x, positions))  # [B, 1, T, head_dim]
        shown = None
        if mask is not None and not bool(mask[:, :end].all()):
            slot = torch.arange(end, device=x.device)
            shown = (slot[None, :] <= slot[start:, None])[None, None] & mask[:, None, None, :end]  # [B, 1, T, end]
        for i, (n1, attn, qkv, o, n2, gate_up, act, down) in enumerate(self.layers):
            q, k, v = (t.view(B, T, -1, attn.head_dim).transpose(1, 2) for t in qkv(_rms(n1, x)))  # [B, heads, T, hd]
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            k, v = self._store(i, k, v, start)
            a, _ = fp32_by_rows(attn, q, k, v, shown, dropout=0.0, scaling=attn.scaling)  # [B, T, heads, hd]
            x = x + o(a.reshape(B, T, -1).contiguous())
            g, u = gate_up(_rms(n2, x))
            x = x + down(act(g) * u)
        return x

    def _call(self, tokens, mask, positions, keep: int) -> torch.Tensor:
        x = self._hidden(tokens, mask, positions)
        return self.head(_rms(self.norm, x[:, -keep:] if keep else x))

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
