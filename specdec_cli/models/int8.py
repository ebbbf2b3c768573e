"""--target-int8: int8 weights for the Whisper target's decoder linears and output layer on a CPU, through
kernels/int8_rows (one weight scale per output row; each activation row quantized alone, integer sums exact), so a
speculative pass computes every row as a one-token step does: greedy speculative output is the int8 target's own
autoregressive output, token for token.

torch's dynamic int8 linear (fbgemm), used before, quantized a call's activations with one scale over all its rows:
a pass could round a row otherwise than a step, and the int8 speculative transcript of the 74 s recording differed
from the int8 autoregressive one. Per call, 2 threads of an AMD EPYC (AVX-512 VNNI), Whisper base's shapes, weights
read from memory, ms (int8_rows | fbgemm | bf16 F.linear; benchmarks/qmatmul_speed.py, benchmarks/README.md):
output layer 51 865 × 512, 1 row 0.58 | 0.57 | 2.8, 11 rows 0.72 | 1.08 | 3.6; fc1 2048 × 512, 1 row 0.029 | 0.048 |
0.132, 11 rows 0.053 | 0.071 | 0.163.

--encoder-int8 (on by default): the encoder's linears as int8 products on a CPU where qmatmul's prompt kernel runs
(AVX2, AVX-512 VNNI): their weights quantized at load to Q6_K blocks (six bits, an int8 scale per 16; a large
encoder's kept in the user cache, keyed by its weight files, and read back by the next load: base 0.8 → 0.2 s), each
frame's activations to int8 per 256 inside the kernel (per row and group: Whisper's outlier activations stay in
their own group; fbgemm's one scale over a whole call moved the encoder's output by 21 %). 1 500 frames of Whisper
base's shapes in 0.46–0.54 of MKL's fp32 time on an AMD EPYC Zen 3 (2 threads; a window's encoder 0.94 → 0.76 s).
Where a CPU's own bf16 or AMX product may be the faster, the load times the largest layer both ways and keeps the
faster. Every mode reads the same encoder output, so speculative output still equals autoregressive.

Both change the model: their output is measured against the unmodified one, by WER (benchmarks/README.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from torch import nn

from specdec_cli.kernels import gguf_blocks, int8_rows, qmatmul
from specdec_cli.models import cache
from specdec_cli.models.gguf_linear import GgufLinear
from specdec_cli.models.weights import replace_linears

DENSE_ROWS = 16  # a call of more rows (a draft's prompt) multiplies the kept original weight, where there is one


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with W in int8 (per output row), x of any float dtype [..., in] -> [..., out] in x's; each row of
    x computed alone (kernels/int8_rows). `dense`: keep the layer's own weight and bias (shared, not copied) for
    calls of more than DENSE_ROWS rows, where a kernel for a few rows is the slower (a draft's prompt). `weight` is
    that weight, else a meta tensor of its shape and dtype."""

    def __init__(self, linear: nn.Linear, dense: bool = False):
        super().__init__()
        self.packed = int8_rows.pack(linear.weight.detach())
        self.bias = None if linear.bias is None else linear.bias.detach().float().contiguous()  # [out]
        w = linear.weight  # [out, in]
        self.weight = w if dense else torch.empty(w.shape, dtype=w.dtype, device="meta")
        self.dense_bias = linear.bias if dense else None  # [out], the layer's own
        self.dense = dense
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense and x.numel() > DENSE_ROWS * self.in_features:
            return nn.functional.linear(x, self.weight, self.dense_bias)
        return int8_rows.mm(x, self.packed, self.bias)


def fits(linear: nn.Linear) -> bool:
    """Whether int8_rows takes the layer's weight: rows a multiple of 8 long."""
    return linear.in_features % 8 == 0


def quantize_linears(module: nn.Module) -> int:
    """Replace every nn.Linear inside `module` that fits() by an Int8Linear, in place; returns how many. CPU only."""
    return replace_linears(module, Int8Linear, fits)


ENCODER_QUANT = "q6_k"  # the encoder's weights under --encoder-int8 (a type qmatmul.prompt_mm takes)
CACHED_WEIGHTS = 1 << 20  # an encoder with more weights to quantize keeps its blocks in the cache (base: 0.8 s a load)
BLOCKS_FILE = "blocks.safetensors"


def quantize_encoder(encoder: nn.Module, frames: int = 1500, measure: bool = True, source: Path | None = None) -> int:
    """Replace every nn.Linear inside a Whisper encoder whose input is a multiple of 256 long and output of 16 by a
    GgufLinear over ENCODER_QUANT blocks of its weight (its `frames` go through qmatmul.prompt_mm), in place; returns
    how many. 0 where that kernel does not run (qmatmul.prompt_runs), or where `measure` finds it slower than the
    layer as it is (int8_is_faster: on CPUs whose bf16 or AMX product outruns int8 on AVX-512 VNNI). CPU only.
    `source`: the folder the model's weights were read from; the blocks of a large encoder are cached under its
    files' identity (the user cache, models/cache.py) and read from there by later loads."""
    if not qmatmul.prompt_runs():
        return 0

    def fits(linear: nn.Linear) -> bool:
        return linear.in_features % 256 == 0 and linear.out_features % 16 == 0

    names = {m: name for name, m in encoder.named_modules() if type(m) is nn.Linear and fits(m)}
    if not names:
        return 0
    key = _blocks_key(source, names) if sum(m.weight.numel() for m in names) >= CACHED_WEIGHTS else None
    stored = _read_blocks(key)

    def held(linear: nn.Linear) -> GgufLinear:
        blocks = stored.get(names[linear])
        if blocks is None:
            return GgufLinear.quantized(linear, ENCODER_QUANT)
        return GgufLinear(blocks, ENCODER_QUANT, linear.in_features, linear.out_features, linear.bias,
                          linear.weight.dtype)

    largest = max(names, key=lambda linear: linear.weight.numel())
    first = held(largest)  # it decides for all, before the others are quantized
    if measure and not int8_is_faster(largest, first, frames):
        return 0
    made = {name: first if linear is largest else held(linear) for linear, name in names.items()}
    count = replace_linears(encoder, lambda linear: made[names[linear]], fits)
    if key is not None and not stored:
        _write_blocks(key, source, made)
    return count


def _blocks_key(source: Path | None, names: dict[nn.Linear, str]) -> str | None:
    """The cache key of an encoder's blocks: its model's weight files (cache.file_fingerprint), its layers and shapes, and
    the quantizer's source; None without weight files to name it by."""
    files = sorted(p for pattern in ("*.safetensors", "*.bin") for p in source.glob(pattern)) if source else []
    if not files:
        return None
    digest = hashlib.sha256(Path(gguf_blocks.__file__).read_bytes())
    for p in files:
        digest.update(cache.file_fingerprint(p).encode())
    for linear, name in names.items():
        digest.update(f"|{name}:{tuple(linear.weight.shape)}".encode())
    return f"encoder-{ENCODER_QUANT}-{digest.hexdigest()[:16]}"


def _read_blocks(key: str | None) -> dict[str, torch.Tensor]:
    """{layer name: blocks} of a sound cache entry; {} when there is none (a damaged one is removed)."""
    if key is None or cache.read_entry(key) is None:
        return {}
    if cache.damage(key) is None:
        try:
            return safetensors.torch.load_file(cache.entry_path(key) / BLOCKS_FILE)
        except (OSError, safetensors.SafetensorError):
            pass
    cache.remove_entry(key)
    return {}


def _write_blocks(key: str, source: Path | None, made: dict[str, GgufLinear]) -> None:
    """Cache the blocks (atomically); a cache that cannot take them is left as it is: the next load quantizes again."""
    meta = {"source": f"{ENCODER_QUANT} blocks of the encoder of {source}"}
    with contextlib.suppress(cache.CacheUnwritable), cache.atomic_entry(key, meta) as tmp:
        safetensors.torch.save_file({name: layer.blocks for name, layer in made.items()}, str(tmp / BLOCKS_FILE))


def int8_is_faster(dense: nn.Linear, q: nn.Module, frames: int, rounds: int = 3) -> bool:
    """Whether `q` multiplies `frames` rows of the layer's input faster than `dense` does (one warm call each, then
    the best of `rounds`, alternated): a few tenths of a second at load for Whisper base."""
    x = torch.randn(1, frames, dense.in_features, dtype=dense.weight.dtype)
    best = {dense: float("inf"), q: float("inf")}
    with torch.inference_mode():
        for r in range(rounds + 1):
            for layer in best:
                t0 = time.perf_counter()
                layer(x)
                if r:
                    best[layer] = min(best[layer], time.perf_counter() - t0)
    return best[q] < best[dense]
