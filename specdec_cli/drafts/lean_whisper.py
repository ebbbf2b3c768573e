"""The self draft of Whisper: the target's own decoder weights, run by a lean decoding step.

    LeanDecoder  the decoding step: the target's decoder layers in plain torch ops, on int4 / int8 rows on a CPU
    LeanDraft    the draft kind (`self`, `self:K`, `self:0-2,4` for a Whisper target): a LeanDecoder per window

LeanDecoder keeps the target's decoder layers (all, or those `self:K` / `self:0-2,4` name), gives them an
output layer over token ids [0, N) and <|endoftext|> only, and the timestamp ids when the task decodes them
(−inf elsewhere: zero probability off the subset, which exact verification allows, and greedy verification
compares argmaxes), and runs them in plain torch ops instead of transformers' modules, on a CPU with int4 layers
(the int8 target's too, --target-int8: build()) and an int4 output layer whose RESCORED largest logits are
recomputed from int8 rows (rescored; kernels/int8_rows: a step reads ~0.3 of bf16's bytes) and cross-attention over
int8 keys and values that each stand for FRAMES frames (pooled); with quantized weights the layers' loop and the
output layer run in one C++ call each (kernels/lean_layers: the same bits, rescored values within an fp32 rounding).
Why every layer and not fewer: measured, see options.TranscribeOptions.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import nn

from specdec_cli.decoding import Batch, Decoder, ModelDraft
from specdec_cli.drafts import spec
from specdec_cli.errors import SpecdecError
from specdec_cli.kernels import int8_rows, lean_layers, rows_attention
from specdec_cli.models import LoadedModel
from specdec_cli.models.whisper import decoder_layers, special_ids
from specdec_cli.options import TranscribeOptions

# The draft's weight forms on a CPU (kernels/int8_rows), as the bits of its layers' weights; the output layer is int4
# rescored from int8 (RESCORED) in both. With an int8 output layer: one token a round, the 74 s and 297 s recordings,
# Whisper base's bf16 target, its draft's token was the target's 0.978 / 0.978 of the time with int8 layers, as often
# with int4 layers, 0.936 / 0.936 with an int4 output layer alone (benchmarks/README.md, twentieth session)
BITS = {"int8": 8, "int4": 4}


def weight_form(weights: str | None, embed: torch.Tensor) -> str | None:
    """The draft's weights for `weights` (int8 | int4 | None) on a model whose embeddings are `embed`: None off a CPU."""
    return weights if weights in BITS and embed.device.type == "cpu" else None


# Frames a quantized draft's cross-attention key and value stand for (their mean). The 74 s recording, four windows,
# one process (AMD EPYC Zen 5, 2 threads): int8 draft 2 frames a key 1.06x the target alone's decoding, 1 frame 0.95x
# (acceptance 0.97 / 0.96; the draft step 2.4 / 3.3 ms); with the int8 target 4 frames accepted 0.90, 8 frames none.
# In int8 (pooled(); twenty-first session), int8 target: the draft step 2.77 -> 2.34 ms, one token a round agreeing
# as often (0.986 / 0.980, 74 s / 297 s); 4 frames accepted 0.84-0.87 against 0.96 and decoded no faster
FRAMES = 2


def pooled(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, heads, S, head_dim] -> (int8 [B, heads, S / FRAMES, head_dim], scale [B, heads, 1, head_dim] fp32): each
    key the mean of FRAMES adjacent frames (in fp32; the last S mod FRAMES frames dropped) ≈ int8 · scale, one scale a
    channel (its largest |mean| / 127), so it folds into the query (keys) or the output (values) and the rows kernel
    reads a byte a value. Every key stands for as many frames, so softmax needs no count term."""
    B, H, S, D = t.shape
    n = S // FRAMES
    mean = t[:, :, :n * FRAMES].float().reshape(B, H, n, FRAMES, D).mean(3)  # [B, H, n, D]
    scale = mean.abs().amax(2, keepdim=True).clamp_min(1e-30) / 127  # [B, H, 1, D]
    return (mean / scale).round().clamp(-127, 127).to(torch.int8).contiguous(), scale


def cross_attention(q: torch.Tensor, kv: tuple, attend) -> torch.Tensor:
    """q [B, heads, T, head_dim] over a window's cross-attention kv = (K, V, K's scale, V's scale) (scales None: K,
    V as they are; else pooled()'s, V's as [B, 1, heads, head_dim]) -> [B, T, heads, head_dim] in q's dtype, through
    attend(q, k, v) -> [B, T, heads, head_dim]."""
    k, v, ks, vs = kv
    if ks is None:
        return attend(q, k, v)
    return (attend(q * ks, k, v) * vs).to(q.dtype)  # Σ_d q_d·(s_d·k_jd) and Σ_j p_j·(s_d·v_jd): the scales outside


# Output-layer rows a quantized draft recomputes from int8 weights a token: its int4 estimate's largest. Whisper base,
# the 74 s recording, int8 target: the argmax of the 1 / 2 / 4 / 8 rescored was the int8 layer's 0.969 / 0.996 / 1.000
# / 1.000 of the time (bf16 target 0.971 / 0.996 / 0.992 / 0.992: the int8 kernel rounds h, rescored() does not); a
# draft step reads 8.4 MB of int4 instead of 16.8 MB of int8 (twenty-second session)
RESCORED = 8


def rescored(z: torch.Tensor, h: torch.Tensor, ints: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """z [..., N'] estimated logits of h [..., d] -> z with each row's RESCORED largest (the first of equal values)
    recomputed from int8 rows ints [N', d], scales [N']: s_n · Σ_k w_nk · h_k, summed in fp64, then fp32 -> fp32 [..., N']."""
    k = min(RESCORED, z.shape[-1])
    order = torch.sort(z.float(), dim=-1, descending=True, stable=True).indices  # the first of equal values first
    idx = order[..., :k]  # [..., k]
    dot = (ints[idx].double() * h.double()[..., None, :]).sum(-1)  # [..., k]
    return z.float().scatter(-1, idx, dot.float() * scales[idx])


def _linear(x: torch.Tensor, lin: tuple) -> torch.Tensor:
    """x [..., in] → [..., out] through LeanDecoder's lin = (weight or None, int8_rows.Packed or None, bias)."""
    if lin[1] is not None:
        return int8_rows.mm(x, lin[1], lin[2])
    return nn.functional.linear(x, lin[0], lin[2])


class LeanDecoder(Decoder):
    """The self draft's decoding step: the target's own decoder weights (`layers` of them) and an output layer over token ids
    [0, head_size) ∪ `extra_ids` (−inf elsewhere: zero probability off the subset, which exact verification
    allows), run by a hand-written decoding step in plain torch ops instead of transformers' modules: q, k, v
    in one matrix with the query scale folded in, a preallocated self-attention cache, the window's
    cross-attention K/V (cross_kv; int8, pooled(), where quantized) and, on a CPU, `weights` int8 or int4 (its layers; the
    output layer int4 rescored from int8 rows in both; None: the model's own; options.TranscribeOptions).

    What it computes, as transformers' WhisperDecoder does (pre-norm; every projection has a bias but k's):
        x = embed[token] + pos[position]
        per layer:  x += out(attention(LN1(x)·Wq·s, LN1(x)·Wk, LN1(x)·Wv))      causal; s = head_dim^−½
                    x += out'(attention(LN2(x)·Wq'·s, K, V))                    K, V: the encoder output's
                    x += fc2(gelu(fc1(LN3(x))))
        logits = LN(x)·Wheadᵀ

    Built once per loaded target; `window(kv, hook)` gives a copy for one window (weights shared, empty cache)."""

    def __init__(self, whisper, layers: Sequence[int], head_size: int | None, extra_ids: Sequence[int] = (), *,
                 weights: str | None = None):
        from transformers.activations import ACT2FN

        super().__init__(whisper)
        decoder = whisper.model.decoder
        n = len(decoder.layers)
        layers = tuple(int(i) for i in layers)
        if not layers or any(not 0 <= i < n for i in layers) or list(layers) != sorted(set(layers)):
            raise SpecdecError(f"self draft layers {list(layers)}: need increasing layer numbers in 0..{n - 1}")
        self.layer_ids = layers
        config = whisper.config
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        self.activation = ACT2FN[config.activation_function]  # "gelu": exact (erf)
        self.weights = weight_form(weights, decoder.embed_tokens.weight)
        s = self.head_dim**-0.5  # transformers scales the query after its projection (bias included)

        def lin(weight, bias=None, bits=None):  # (weight, packed or None, bias) for _linear(); bits: the layers'
            if self.weights is not None:
                packed = int8_rows.pack(weight.detach(), bits or BITS[self.weights])
                return None, packed, None if bias is None else bias.detach().float()
            return weight, None, bias

        def norm(m: nn.LayerNorm):
            return m.weight, m.bias, m.eps

        self.embed = decoder.embed_tokens.weight  # [V, d]
        self.pos = decoder.embed_positions.weight  # [max_target_positions, d]
        self.layers = []
        for i in layers:
            layer, a, c = decoder.layers[i], decoder.layers[i].self_attn, decoder.layers[i].encoder_attn
            qkv = torch.cat([a.q_proj.weight * s, a.k_proj.weight, a.v_proj.weight])  # [3d, d]
            qkv_bias = torch.cat([a.q_proj.bias * s, torch.zeros_like(a.v_proj.bias), a.v_proj.bias])  # [3d]
            self.layers.append({
                "norm1": norm(layer.self_attn_layer_norm), "qkv": lin(qkv, qkv_bias),
                "out": lin(a.out_proj.weight, a.out_proj.bias),
                "norm2": norm(layer.encoder_attn_layer_norm), "q": lin(c.q_proj.weight * s, c.q_proj.bias * s),
                "cross_out": lin(c.out_proj.weight, c.out_proj.bias),
                "norm3": norm(layer.final_layer_norm), "fc1": lin(layer.fc1.weight, layer.fc1.bias),
                "fc2": lin(layer.fc2.weight, layer.fc2.bias),
            })
        self.final_norm = norm(decoder.layer_norm)
        weight = whisper.proj_out.weight  # [V, d]
        self.vocab = weight.shape[0]
        if head_size is None or not 1 <= head_size < self.vocab:
            self.keep = None  # the whole output layer
        else:
            extra = sorted({int(i) for i in extra_ids if head_size <= int(i) < self.vocab})
            rows = head_size + len(extra)
            pad = min(-rows % 16, self.vocab - rows)  # rows by 16, the int8 kernel's blocks: the next ids fill them
            ids = sorted(set(range(head_size + pad)) | set(extra))
            self.keep = torch.tensor(ids, dtype=torch.long, device=weight.device)  # [N']
            weight = weight.index_select(0, self.keep)  # [N', d]
        # quantized: an int4 estimate, its RESCORED largest recomputed from int8 rows (rescored()); else as it is
        self.head = lin(weight, bits=4)
        self.rescore = None if self.weights is None else int8_rows.quantize(weight.detach())  # [N', d] int8, [N']
        self.kv: list[tuple] = []  # per layer (K, V, K's scale or None, V's scale or None): cross_attention's
        self.keys = self.values = None
        self.fused: dict = {}  # "layers": the C++ loop over quantized layers (lean_layers) or None; shared by windows

    @property
    def description(self) -> str:
        head = "full output layer" if self.keep is None else f"output layer over {self.head_rows} of {self.vocab} tokens"
        low = f", int4 output layer, its top {RESCORED} from int8"
        form = {"int8": ", int8 layers" + low, "int4": ", int4 layers" + low}.get(self.weights or "", "")
        return f"layers {list(self.layer_ids)}, {head}{form}"

    @property
    def head_rows(self) -> int:
        return self.vocab if self.keep is None else len(self.keep)

    def window(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], hook=None) -> LeanDecoder:
        """A copy for one window: kv = every target layer's cross-attention (K, V), each [B, heads, S, head_dim]
        (cross_kv); hook = the logits hook. The weights are shared."""
        draft = copy.copy(self)
        mine = [kv[i] for i in self.layer_ids]
        if self.weights is not None and rows_attention.KERNEL.module():
            # a quantized draft reads the frames' K/V in int8 (the rows kernel widens them), each key and value the
            # mean of FRAMES adjacent frames': a step's largest read (4 windows: 147 MB of fp32 K/V for Whisper base)
            # an eighth; the target keeps its own K/V, so the output is the target's as ever
            low = [(pooled(k), pooled(v)) for k, v in mine]  # per layer ((K, its scale), (V, its scale))
            draft.kv = [(k, v, ks, vs.transpose(1, 2)) for (k, ks), (v, vs) in low]
        else:
            draft.kv = [(k, v, None, None) for k, v in mine]
        draft.logits_hook = hook
        draft.reset()
        return draft

    def reset(self) -> None:
        k = self.kv[0][0]
        shape = (len(self.layers), k.shape[0], self.heads, 64, self.head_dim)  # [layers, B, heads, slots, head_dim]
        self.keys = k.new_empty(shape, dtype=self.embed.dtype)
        self.values = k.new_empty(shape, dtype=self.embed.dtype)
        self.length = 0

    def _grow(self, slots: int) -> None:
        have = self.keys.shape[3]
        if slots > have:
            more = max(slots, 2 * have) - have
            self.keys, self.values = (torch.cat([t, t.new_empty(*t.shape[:3], more, t.shape[4])], 3)
                                      for t in (self.keys, self.values))

    def _layers(self, tokens, mask, positions) -> torch.Tensor:
        """tokens, positions [B, T] at slots length..length+T (mask [B, length+T] or None) -> hidden [B, T, d];
        their keys and values go into the cache."""
        B, T = tokens.shape
        start, end = self.length, self.length + T
        self._grow(end)
        x = self.embed[tokens] + self.pos[positions]  # [B, T, d]
        d = x.shape[-1]
        holes = None if mask is None else mask[:, None, None, :end]  # [B, 1, 1, end]
        fused = self._fused()
        if fused is not None:  # the loop below in C++: the same bits
            return fused.run(x, self.keys, self.values, start, holes, self.kv)
        for i, p in enumerate(self.layers):
            h = nn.functional.layer_norm(x, (d,), *p["norm1"])
            # q, k, v: [B, heads, T, head_dim] each
            q, k, v = _linear(h, p["qkv"]).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
            self.keys[i, :, :, start:end] = k
            self.values[i, :, :, start:end] = v
            a = self._attend(q, self.keys[i, :, :, :end], self.values[i, :, :, :end], holes, causal=True)
            x = x + _linear(a.reshape(B, T, d), p["out"])
            h = nn.functional.layer_norm(x, (d,), *p["norm2"])
            q = _linear(h, p["q"]).view(B, T, self.heads, self.head_dim).transpose(1, 2)  # [B, heads, T, head_dim]
            a = cross_attention(q, self.kv[i], lambda q, k, v: self._attend(q, k, v, None, causal=False))
            x = x + _linear(a.reshape(B, T, d), p["cross_out"])
            h = nn.functional.layer_norm(x, (d,), *p["norm3"])
            x = x + _linear(self.activation(_linear(h, p["fc1"])), p["fc2"])
        return x

    def _fused(self):
        """lean_layers' runner over these layers where every linear is int8_rows' (a CPU), else None."""
        if "layers" not in self.fused:
            quantized = self.weights is not None
            head = (self.final_norm, self.head, self.rescore, self.keep, self.vocab, RESCORED)
            self.fused["layers"] = lean_layers.runner(self.layers, head, self.heads, self.head_dim) if quantized else None
        return self.fused["layers"]

    def _attend(self, q, k, v, holes, causal: bool) -> torch.Tensor:
        """q [B, heads, T, head_dim] over k, v [B, heads, S, head_dim] (causal: q's rows are the last T of the S
        slots), holes [B, 1, 1, S] bool or None -> [B, T, heads, head_dim] in q's dtype. On a CPU the rows kernel,
        whatever T (one query over 1 500 frames ~45 µs, 11 ~0.2 ms, 300 ~4.4 ms; sdpa in fp32 first widens bf16 K/V:
        ~1.8 ms a call at any T, ~7 ms at 300); elsewhere, or where it did not build (K/V are then fp32:
        models.whisper.cross_attention_dtype), sdpa, in fp32 on a CPU (torch's bf16 kernel is ~8× slower there)."""
        if q.device.type == "cpu" and {q.dtype, k.dtype} <= {torch.float32, torch.bfloat16, torch.int8}:
            out = rows_attention.attend(q, k, v, holes, 1.0, causal)
            if out is not None:
                return out
        mask = holes
        if causal and q.shape[2] > 1:
            S, T = k.shape[2], q.shape[2]
            slot = torch.arange(S, device=q.device)
            mask = slot[None, :] <= slot[S - T :, None]  # [T, S]
            mask = mask if holes is None else mask & holes
        dtype = torch.float32 if q.device.type == "cpu" else k.dtype
        a = nn.functional.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=mask, scale=1.0)
        return a.to(q.dtype).transpose(1, 2)

    def _call(self, tokens, mask, positions, keep: int) -> torch.Tensor:
        hidden = self._layers(tokens, mask, positions)
        return self._logits(hidden[:, -keep:] if keep else hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The last layer's hidden [B, T, d] -> logits [B, T, V] (fp32 where quantized: rescored()'s)."""
        fused = self._fused()
        if fused is not None:  # the lines below in C++: the same candidates, values within an fp32 rounding
            return fused.head(hidden)
        h = nn.functional.layer_norm(hidden, hidden.shape[-1:], *self.final_norm)
        z = _linear(h, self.head)  # [B, T', N']
        if self.rescore is not None:
            z = rescored(z, h, *self.rescore)
        if self.keep is None:
            return z
        logits = z.new_full((*z.shape[:-1], self.vocab), -math.inf)  # [B, T', V]
        return logits.index_copy_(-1, self.keep, z)

    def prefill(self, tokens, mask, positions) -> None:
        self.reset()
        self._layers(tokens, mask, positions)  # no output layer: the prompt's logits are never read
        self.length, self.seen = tokens.shape[1], tokens

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def select(self, rows: torch.Tensor) -> None:
        self.keys, self.values = self.keys.index_select(1, rows), self.values.index_select(1, rows)
        self.seen = self.seen.index_select(0, rows)
        self.kv = [tuple(t if t is None else t.index_select(0, rows) for t in kv) for kv in self.kv]


def head_extras(target: LoadedModel, timestamps: bool = False) -> list[int]:
    """The ids a reduced draft output layer scores beyond [0, N): EOT, and with timestamps every timestamp
    id (the top of the vocabulary), so that the draft can propose what the timestamp rules ask for."""
    ids = special_ids(target)
    times = range(ids.timestamp_begin, target.output_size) if timestamps and ids.timestamp_begin is not None else ()
    return [ids.eot, *times]


class LeanDraft(ModelDraft):
    """The self draft of a Whisper target. Fitted to a batch of windows: a LeanDecoder over the windows'
    cross-attention K/V (the target's own: the audio and encoder output go unused). timestamps: its output
    layer scores the timestamp ids."""

    def __init__(self, lean: LeanDecoder, name: str, timestamps: bool):
        super().__init__(lean.model, vocab=lean.vocab)
        self.lean, self.name, self.timestamps = lean, name, timestamps

    def decoder_for(self, batch: Batch) -> LeanDecoder:
        refuse_timestamps(self.timestamps, batch)
        return self.lean.window(batch.window.kv, batch.logits_hook)


def refuse_timestamps(scores_timestamps: bool, batch: Batch) -> None:
    """A draft whose output layer leaves out the timestamp ids cannot draft for a task that decodes them."""
    if batch.window.timestamps and not scores_timestamps:
        raise SpecdecError("--timestamps: this draft's output layer leaves out the timestamp tokens "
                           "(load it with timestamps=True)")


def self_draft(target: LoadedModel, draft_spec: str = "self", head_size: int | None = None,
               weights: str | None = None, timestamps: bool = False) -> LeanDraft:
    """The self draft of `target` named by `draft_spec` (self, self:K, self:0-2,4: drafts/spec.py): a LeanDecoder
    over those decoder layers with an output layer over [0, head_size) ∪ head_extras (None, 0 or ≥ V: the whole
    output layer), `weights` (int8, int4 (its layers; BITS) or None: the model's own) on a CPU. The CLI's choice of
    weights is build()'s."""
    layers = spec.self_layers(draft_spec, len(decoder_layers(target)))
    if layers is None:
        raise ValueError(f"not a self draft: {draft_spec!r}")
    lean = LeanDecoder(target.model, layers, head_size or None, extra_ids=head_extras(target, timestamps), weights=weights)
    return LeanDraft(lean, f"{target.name} ({lean.description})", timestamps=lean.keep is None or timestamps)


def build(draft_spec: str, target: LoadedModel, opts: TranscribeOptions, progress: bool = True) -> LeanDraft:
    """`self`, `self:K` or `self:0-2,4` for a Whisper target, with the options' output layer and weights: int4 layers
    (the output layer int4, rescored), with the unmodified target and with --target-int8 alike. Measured (AMD EPYC
    Zen 5, 2 threads, one process, interleaved, medians of 6; benchmarks/README.md): on the bf16 target int4 layers
    decoded the 74 s / 297 s recordings 1.34x / 1.26x faster than the target alone where int8 ones did 1.21x / 1.16x
    (twentieth session); on the int8 target, since the output layer is int4 (twenty-third session), int4 layers
    decoded them in 0.245 / 0.859 s against its own int8 rows' 0.263 / 0.890 (acceptance 0.897 / 0.943 against
    0.978 / 0.963: a step of 1.41 against 1.65 ms, whose reads fit the L3 cache better)."""
    weights = "int4" if opts.draft_quantized else None
    return self_draft(target, draft_spec, opts.draft_vocab, weights, opts.timestamps)
