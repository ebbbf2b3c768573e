"""GGUF weights run as they are: a causal LM whose linear layers multiply the file's own blocks (Q4_K, Q5_K, Q6_K,
Q8_0, Q4_0/1, Q5_0/1) with kernels/qmatmul (on a CPU), the rest (embeddings, norms, biases) dequantized as today.
A prompt's prefill (more tokens than any pass: PREFILL_TOKENS) goes through qmatmul's int8 prompt kernel where it
runs (the K-quants on AVX-512 VNNI or AVX2: activations quantized as the steps quantize them; the 32-element types'
packed form on AVX-512 VNNI: the steps' bits), else multiplies the same weights dequantized to x's dtype. Steps and
passes of Q4_K, Q5_K and Q6_K layers there, and of the 32-element types' (Q8_0, Q4_0/1, Q5_0/1), run from the
weights packed once at load (GgufLinear.pack, qmatmul.packed_mm; the blocks then let go; the 32-element types'
prompts there too on AVX2): a 9-row pass then costs little more than a step (AVX2: about two).

    GgufLinear          one tensor's blocks [N, row_bytes] uint8 and its bias: y = x · Wᵀ + b in x's dtype
    join                layers that read the same input (q, k, v; gate, up) laid side by side in one buffer, and the
                        one GgufLinear over it (their `joint`): one call for all (decoding/llama_like.py)
    attach_gguf_blocks  replace a loaded model's nn.Linear layers by GgufLinear on the GGUF file's tensors
    load_gguf_causal_lm a causal LM spec (embedded, a .gguf file) read from the file: its linears on their blocks,
                        the rest dequantized

Each row of a call computes alike whatever the other rows (kernels/qmatmul.cpp), so with exact_rows' attention a
multi-token pass gives every token the bits of a one-token step, and greedy speculative output is the
autoregressive output of this model. It is the model the file means (weights exact; activations rounded inside each
product, to int8 per group of 256 for the K-quants as llama.cpp does, to int16 per 32 for the others), not the
bf16-dequantized one: its logits differ from that one's slightly (the 32-element types packed: int8 per 32).
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import torch
from torch import nn

from specdec_cli import internals, options
from specdec_cli.kernels import gguf_blocks, qmatmul
from specdec_cli.models import gguf_tensors
from specdec_cli.models.progress import build_kernels

# A call over more tokens than a verification pass scores (γ + 1 ≤ this) is a prompt's prefill: every mode prefills
# alike, so it may compute otherwise than steps do: qmatmul.prompt_mm (500 rows: 1.3–1.5× oneDNN's bf16 GEMM with
# AVX-512 VNNI, 1.4–1.6× the fp32 GEMM with AVX2 only), else a dense product of the dequantized weights in x's dtype.
PREFILL_TOKENS = options.MAX_GAMMA + 1
PREFILL_TILE = 2048  # weight rows dequantized at a time (a few MB, reused: no page faults, in cache for the GEMM)


_scratch_of = threading.local()  # per thread: {dtype: a flat tensor}, grown to the largest tile asked for


def _scratch(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """A [rows, cols] tensor of `dtype` reused from call to call (a fresh one each tile would fault its pages in
    every time: half the time of a prefill's dequantizing)."""
    held = getattr(_scratch_of, "held", None)
    if held is None:
        held = _scratch_of.held = {}
    flat = held.get(dtype)
    if flat is None or flat.numel() < rows * cols:
        flat = held[dtype] = torch.empty(rows * cols, dtype=dtype)
    return flat[: rows * cols].view(rows, cols)


def _padded(rows: int) -> int:
    """The rows of a layer's packed form: whole groups of 16."""
    return -(-rows // 16) * 16


class GgufLinear(nn.Module):
    """y = x · Wᵀ + b with W [out, in] in its GGUF blocks. `weight` is a meta tensor: its shape and dtype, no values
    (dequantized() gives them)."""

    rows_alike = True  # each row computes alike whatever the other rows (decoding/exact_rows.py keeps it as it is)
    joint: GgufLinear | None = None  # the layer whose output rows joint_start.. are this one's (join)
    joint_start = 0

    def __init__(self, blocks: torch.Tensor | None, qtype: str, in_features: int, out_features: int,
                 bias: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16,
                 packed: torch.Tensor | None = None):
        """blocks [out, row_bytes] uint8, or None with `packed`: qmatmul.pack's form of them (their rows padded to a
        multiple of 16, _padded), held instead."""
        super().__init__()
        self.qtype = gguf_blocks.type_name(qtype)
        self.type_id = gguf_blocks.type_id(qtype)  # what the kernels take
        self.in_features, self.out_features = in_features, out_features
        self.packed_rows = _padded(out_features)  # the packed form's: whole groups of 16
        want = (out_features, gguf_blocks.row_bytes(self.qtype, in_features))
        if packed is not None:
            shape = (self.packed_rows // 16, in_features // qmatmul.packed_group(self.qtype))
            if blocks is not None or tuple(packed.shape[:2]) != shape:
                raise ValueError(f"the packed form of a [{out_features}, {in_features}] weight is "
                                 f"[{shape[0]}, {shape[1]}, bytes], without blocks")
        elif blocks is None or tuple(blocks.shape) != want or blocks.dtype != torch.uint8:
            raise ValueError(f"{self.qtype} blocks of a [{out_features}, {in_features}] weight must be uint8 {want}, "
                             f"not {None if blocks is None else (blocks.dtype, tuple(blocks.shape))}")
        self.register_buffer("blocks", None if blocks is None else blocks.contiguous(), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().float(), persistent=False)
        self.register_buffer("packed", packed, persistent=False)  # qmatmul.pack's form where held (blocks: None)
        self.weight = torch.empty(out_features, in_features, dtype=dtype, device="meta")

    def pack(self) -> GgufLinear:
        """Hold the weights in qmatmul's packed form instead of the blocks where its kernel runs here (qmatmul.packs:
        the K-quants and the 32-element types on AVX-512 VNNI or AVX2): steps, passes and the prompt then run from it,
        a pass's cost nearly flat in its rows. Returns self."""
        n = self.packed_rows
        if self.packed is None and qmatmul.packs(self.qtype, n):
            blocks = self.blocks
            if n > self.out_features:  # zero rows (d = 0: outputs 0) to whole groups of 16; their outputs dropped
                blocks = torch.cat([blocks, blocks.new_zeros(n - self.out_features, blocks.shape[1])])
            self.hold_packed(qmatmul.pack(blocks, self.qtype, n, self.in_features))
        return self

    def hold_packed(self, packed: torch.Tensor) -> None:
        """Run from `packed` (pack()'s form of these weights) and let the blocks go: it keeps every bit of them
        (file_blocks)."""
        self.packed, self.blocks = packed, None

    def file_blocks(self) -> torch.Tensor:
        """The file's blocks [out, row_bytes] uint8: held, else rebuilt from the packed form (a copy)."""
        if self.blocks is not None:
            return self.blocks
        return qmatmul.unpack(self.packed, self.qtype, self.packed_rows, self.in_features)[: self.out_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() >= 2 and x.shape[-2] > PREFILL_TOKENS:  # [.., T, in] with T past any pass: a prefill
            return self.prefill(x)
        packed = self.packed
        if packed is not None:
            return self._from_packed(x, packed, prompt=False)
        return qmatmul.gguf_mm(x, self.blocks, self.qtype, self.out_features, self.in_features, self.bias)

    _bias_padded: tuple | None = None  # (bias, bias padded to the packed rows): _padded_bias

    def _padded_bias(self) -> torch.Tensor | None:
        """The bias with zeros for the packed form's padding rows, made once for the bias held."""
        bias, held = self.bias, self._bias_padded
        if bias is None:
            return None
        if held is None or held[0] is not bias:
            held = self._bias_padded = (bias, torch.cat([bias, bias.new_zeros(self.packed_rows - len(bias))]))
        return held[1]

    def _from_packed(self, x: torch.Tensor, packed: torch.Tensor, prompt: bool) -> torch.Tensor:
        """x · Wᵀ + b from the packed form: a prompt by the prompt kernel where it runs (the K-quants; the 32-element
        types on AVX-512 VNNI), else (a step, a pass, a 32-element type's prompt on AVX2) by the packed kernel; the
        padding rows' outputs dropped.
        (Lean: a step calls ~110 layers; lookups here cost ~0.7 ms of a ~20 ms Qwen2.5-1.5B step, AMD EPYC Zen 5.)"""
        N, n, K = self.out_features, self.packed_rows, self.in_features
        bias = self.bias if n == N else self._padded_bias()
        y = qmatmul.prompt_mm(x, None, self.type_id, n, K, bias, packed) if prompt else None
        if y is None:
            y = qmatmul.packed_mm(x, packed, self.type_id, n, K, bias)
        return y if n == N else y[..., :N].contiguous()

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        """x · Wᵀ + b from the packed form where held, else by the prompt kernel, else as a dense product in x's
        dtype, PREFILL_TILE output rows at a time."""
        if self.packed is not None:
            return self._from_packed(x, self.packed, prompt=True)
        y = qmatmul.prompt_mm(x, self.blocks, self.qtype, self.out_features, self.in_features, self.bias)
        if y is not None:
            return y
        out = []
        into = x.dtype if x.dtype in (torch.float32, torch.bfloat16) else torch.float32  # what dequantize writes
        blocks = self.blocks
        for n0 in range(0, self.out_features, PREFILL_TILE):
            n1 = min(self.out_features, n0 + PREFILL_TILE)
            w = qmatmul.dequantize(blocks[n0:n1], self.qtype, n1 - n0, self.in_features,
                                   out=_scratch(n1 - n0, self.in_features, into)).to(x.dtype)
            out.append(nn.functional.linear(x, w, None if self.bias is None else self.bias[n0:n1].to(x.dtype)))
        return out[0] if len(out) == 1 else torch.cat(out, -1)

    @classmethod
    def quantized(cls, linear: nn.Linear, qtype: str, dtype: torch.dtype | None = None) -> GgufLinear:
        """`linear` with its weight quantized into `qtype` blocks (gguf_blocks.quantize), its bias kept; dtype: the
        compute dtype (default: the weight's)."""
        w = linear.weight.detach()
        return cls(gguf_blocks.quantize(qtype, w), qtype, linear.in_features, linear.out_features, linear.bias,
                   dtype or w.dtype)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return gguf_blocks.dequantize(self.qtype, self.file_blocks(), self.out_features, self.in_features).to(dtype)

    def rows(self, ids: torch.Tensor) -> GgufLinear:
        """The layer restricted to output rows `ids` (a subset head): each row's blocks are its own. From the packed
        form only the 16-row groups holding ids are unpacked (and packed again: the same arithmetic as the whole
        layer's); ids that fill their groups in order (the n lowest) take those groups packed as they are."""
        bias = None if self.bias is None else self.bias[ids]
        if self.packed is None:
            return GgufLinear(self.blocks[ids], self.qtype, self.in_features, len(ids), bias, self.weight.dtype)
        group = ids.div(16, rounding_mode="floor")
        groups = torch.unique(group)  # sorted
        at = torch.searchsorted(groups, group) * 16 + ids % 16  # ids' rows in groups'
        part = self.packed[groups]  # [len(groups), K / group, bytes]: a copy
        if torch.equal(at, torch.arange(len(ids))):  # the first rows of their groups, in order: the groups as they are
            return GgufLinear(None, self.qtype, self.in_features, len(ids), bias, self.weight.dtype, packed=part)
        blocks = qmatmul.unpack(part, self.qtype, 16 * len(groups), self.in_features)[at]
        return GgufLinear(blocks, self.qtype, self.in_features, len(ids), bias, self.weight.dtype).pack()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.qtype}, bias={self.bias is not None}"


def join(parts: list[GgufLinear]) -> GgufLinear | None:
    """One GgufLinear over the blocks of `parts` (one type and input size), which are moved into one buffer, each
    part's `blocks` a view of its rows there (nothing kept twice) and its `joint` the new layer; None (nothing
    moved) for parts of different types or sizes. A missing bias joins as zeros (y + 0 is y). Every output is
    computed alone (kernels/qmatmul.cpp), so the joint layer's outputs are the parts' bit for bit."""
    if len(parts) < 2 or len({(p.qtype, p.in_features, p.weight.dtype) for p in parts}) != 1:
        return None
    bias = None
    if any(p.bias is not None for p in parts):
        bias = torch.cat([p.bias if p.bias is not None else torch.zeros(p.out_features) for p in parts])
    joint = GgufLinear(torch.cat([p.blocks for p in parts]), parts[0].qtype, parts[0].in_features,
                       sum(p.out_features for p in parts), bias, parts[0].weight.dtype)
    start = 0
    for p in parts:
        p.blocks = joint.blocks[start : start + p.out_features]
        # a plain attribute, not a submodule: the joint's blocks are the parts', counted once in the module tree
        p.__dict__.update(joint=joint, joint_start=start)
        start += p.out_features
    return joint


def _pack(model: nn.Module) -> None:
    """pack() every GgufLinear of `model` whose product runs from the packed form here; a joined part's form is a
    view of its joint layer's rows (its rows a whole number of 16-row blocks), so nothing is packed twice."""
    for layer in gguf_layers(model):
        joint, start, n = layer.joint, layer.joint_start, layer.out_features
        if joint is not None and joint.pack().packed is not None and start % 16 == 0 and n % 16 == 0:
            layer.hold_packed(joint.packed[start // 16 : (start + n) // 16])
        else:
            layer.pack()


def _join_siblings(model: nn.Module) -> int:
    """join() every module's q_proj, k_proj, v_proj (else q_proj, k_proj: a Q4_K_M file keeps some v in Q6_K) and
    its gate_proj, up_proj where they are GgufLinear -> how many joint layers."""
    joined = 0
    for module in list(model.modules()):
        for names in (("q_proj", "k_proj", "v_proj"), ("q_proj", "k_proj"), ("gate_proj", "up_proj")):
            parts = [getattr(module, n, None) for n in names]
            if all(isinstance(p, GgufLinear) and p.joint is None for p in parts) and join(parts) is not None:
                joined += 1
    return joined


def _reverse_permute(rows: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama's q/k rows from GGUF's rotary order back to Hugging Face's (what transformers' GGUF loader does to the
    dequantized weight, done to whole rows of blocks)."""
    dim = rows.shape[0] // n_head // 2
    return rows.reshape(n_head, dim, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def _on_blocks(model: nn.Module, tensors: dict[str, gguf_tensors.GgufTensor]) -> dict[str, tuple[str, gguf_tensors.GgufTensor]]:
    """{module name: (GGUF name, tensor)} for every nn.Linear of `model` whose GGUF tensor is of a type the kernel
    takes; an output layer tied to the embeddings takes token_embd's blocks (as "output.weight")."""
    to_hf = internals.gguf_to_hf_names(model)
    head = model.get_output_embeddings()
    if "output.weight" not in tensors and head is not None and "token_embd.weight" in tensors:
        hf_head = next(name for name, module in model.named_modules() if module is head)
        to_hf = {**to_hf, "output.weight": f"{hf_head}.weight"}
        tensors = {**tensors, "output.weight": tensors["token_embd.weight"]}
    plan = {}
    for gname, t in tensors.items():
        hf = to_hf.get(gname)
        if hf is None or not hf.endswith(".weight") or t.type_id not in gguf_blocks.BY_ID:
            continue
        module = hf[: -len(".weight")]
        if type(model.get_submodule(module)) is nn.Linear:
            plan[module] = (gname, t)
    return plan


def _attach(model: nn.Module, gguf_path: Path, plan: dict[str, tuple[str, gguf_tensors.GgufTensor]]) -> dict[str, int]:
    """Each planned nn.Linear (_on_blocks) replaced by a GgufLinear on its tensor's blocks, read now; then siblings
    joined and the K-quants packed. Returns {GGUF type: layers}."""
    config = model.config
    counts: dict[str, int] = {}
    dtype = next(model.parameters()).dtype
    for module, (gname, t) in plan.items():
        parent_name, _, child_name = module.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, child_name)
        blocks = torch.from_numpy(gguf_tensors.read_blocks(gguf_path, t))  # [out, row_bytes], in RAM
        if config.model_type == "llama" and (".attn_q." in gname or ".attn_k." in gname):
            heads = config.num_attention_heads if ".attn_q." in gname else config.num_key_value_heads
            blocks = _reverse_permute(blocks, heads)
        layer = GgufLinear(blocks, gguf_blocks.BY_ID[t.type_id], linear.in_features, linear.out_features,
                           linear.bias, dtype)
        setattr(parent, child_name, layer)
        counts[layer.qtype] = counts.get(layer.qtype, 0) + 1
    if getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False  # the head is its own module now: transformers must not re-tie it
    join_and_pack(model)
    return counts


def join_and_pack(model: nn.Module) -> None:
    """Join the GgufLinear siblings of `model` (q, k, v; gate, up) and pack every layer whose type has a packed form
    here (GgufLinear.pack), once its layers are all in place."""
    _join_siblings(model)
    _pack(model)


def attach_gguf_blocks(model: nn.Module, gguf_path: Path) -> dict[str, int]:
    """Replace, in place, every nn.Linear of `model` (loaded from `gguf_path` by transformers, e.g. through the
    cache) whose GGUF tensor is of a type the kernel takes by a GgufLinear on that tensor's blocks; an output layer
    tied to the embeddings takes token_embd's blocks. The embeddings, norms and biases stay as they are.
    Returns {GGUF type: layers} (F32/F16 tensors and others are left dequantized)."""
    return _attach(model, gguf_path, _on_blocks(model, gguf_tensors.read_tensors(gguf_path)))


def gguf_layers(model: nn.Module) -> list[GgufLinear]:
    return [m for m in model.modules() if isinstance(m, GgufLinear)]


def load_gguf_causal_lm(spec: str = "embedded", *, role: str = "target", dtype: torch.dtype | str = torch.bfloat16,
                        progress: bool = True, path: Path | None = None):
    """A causal LM from a GGUF (`embedded[:NAME]`, a .gguf file, a folder holding one) with its linears on the file's
    blocks, on a CPU, read from the file alone: the model built on the meta device (causal_lm.gguf_skeleton), the
    layers that run on blocks given theirs, every other tensor dequantized to `dtype` as transformers' GGUF loader
    does it (the same values as the cached dequantized model's). The embedded target's first run: 13 s, peak RSS
    2.4 GB, 11 MB cached (through the dequantized copy: 54 s, 5.7 GB, 3.4 GB); later runs 3.9 s (5.9–6.8 s while the
    blocks were read rather than mapped, gguf_tensors.read_raw, and packed a byte at a time), 2.3 GB (that copy,
    its embeddings mapped from disk: 6.3 s, 1.9 GB). path: the file (causal_lm.gguf_file), where the caller found it
    already. -> models.LoadedModel, weights "gguf"."""
    import time

    from specdec_cli.errors import SpecdecError
    from specdec_cli.models.causal_lm import gguf_file, gguf_skeleton
    from specdec_cli.models.device import resolve_dtype
    from specdec_cli.models.progress import status

    start = time.perf_counter()
    build_kernels(progress, (qmatmul.KERNEL,))  # its dequantizer reads the embeddings: built first, said so
    path = path or gguf_file(spec, role, progress)
    if path is None:
        raise SpecdecError(f"'{spec}' is not a GGUF model: its weights have no GGUF blocks to run on")
    loaded, header = gguf_skeleton(spec, path, role, resolve_dtype(dtype, "cpu"), progress)
    model = loaded.model
    tensors = header.tensors
    plan = _on_blocks(model, tensors)
    skip = {gname for gname, _ in plan.values()}
    with status(progress, f"Reading {loaded.name}"):
        loads = ((name, functools.partial(_values, path, t)) for name, t in tensors.items() if name not in skip)
        state = internals.gguf_state_dict(model, header.architecture, loads, loaded.dtype)
        model.load_state_dict(state, strict=False, assign=True)
        if getattr(model.config, "tie_word_embeddings", False):
            model.tie_weights()
        _attach(model, path, plan)
        internals.init_meta_buffers(model)
    missing = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if missing:
        raise SpecdecError(f"cannot load GGUF file '{path}': {missing[0]} is not in it"
                           + (f" ({len(missing) - 1} more)" if len(missing) > 1 else ""))
    model.eval().requires_grad_(False)
    build_kernels(progress, step_kernels(model))
    loaded.weights = "gguf"
    loaded.load_s = time.perf_counter() - start
    return loaded


def _values(path: Path, t: gguf_tensors.GgufTensor, dtype: torch.dtype | None = None):
    """Tensor `t`'s values as the file means them: fp32 numpy shaped as gguf.dequantize shapes them (dtype None),
    else a torch tensor in `dtype`. A 2-D tensor of a type kernels/qmatmul takes goes through its dequantizer (exact
    in fp32, where gguf's Q6_K rounds d·sc first; 9× gguf's numpy on the embedded target's embeddings; fp32 or bf16
    written directly, bf16 rounded once as .to() rounds), any other through gguf's."""
    import gguf

    from specdec_cli.errors import SpecdecError, first_line

    if t.type_id in gguf_blocks.BY_ID and len(t.dims) == 2:
        blocks = torch.from_numpy(gguf_tensors.read_blocks(path, t))
        direct = dtype in (torch.float32, torch.bfloat16)
        out = torch.empty(t.rows, t.dims[0], dtype=dtype if direct else torch.float32)
        values = qmatmul.dequantize(blocks, gguf_blocks.BY_ID[t.type_id], t.rows, t.dims[0], out=out)
        return values.numpy() if dtype is None else values.to(dtype)
    raw = gguf_tensors.read_raw(path, t)
    try:
        values = gguf.dequantize(raw, gguf.GGMLQuantizationType(t.type_id))
    except NotImplementedError as e:
        raise SpecdecError(f"'{path}': tensor {t.name} cannot be dequantized: {first_line(e)}") from None
    return values if dtype is None else torch.from_numpy(values).to(dtype)


def step_kernels(model: nn.Module) -> tuple:
    """The C++ kernels a step of `model` runs on a CPU: the products where it holds GgufLinear layers, then
    llama_like.cpu_kernels (attention by rows, and the fused norms, rotary embedding and a prompt's attention where
    decoding/llama_like drives the model)."""
    from specdec_cli.decoding import llama_like

    on_blocks = any(isinstance(m, GgufLinear) for m in model.modules())
    return (*((qmatmul.KERNEL,) if on_blocks else ()), *llama_like.cpu_kernels(model))
