"""The Whisper self draft's decoder layers and output layer in one C++ call each (lean_layers.cpp; its top states the
operations): the draft's own Python code (drafts/lean_whisper.LeanDecoder._layers, rescored) is its reference, the same
bits (the output layer's rescored values within an fp32 rounding), with ~25 Python calls a layer fewer.

    runner   a Layers over a LeanDecoder's int8_rows-packed layers, or None where it, int8_rows or rows_attention did
             not build (the Python loop then runs)
"""

from __future__ import annotations

from pathlib import Path

from specdec_cli.kernels import cpp, int8_rows, rows_attention

SOURCE = Path(__file__).with_name("lean_layers.cpp")
KERNEL = cpp.Extension("lean_layers", SOURCE, ["-O3", "-std=c++17"], "the self draft's layers run from Python")


def runner(layers: list[dict], head: tuple, heads: int, head_dim: int):
    """A C++ Layers over `layers` (LeanDecoder's: norms (weight, bias, eps), linears (None, Packed, bias)) and `head`
    (its final norm, int4 estimate, int8 rows and their scales, token ids or None, vocabulary, rows rescored), or None."""
    mods = KERNEL.module(), int8_rows.extension(), rows_attention.KERNEL.module()
    if any(m is None for m in mods):
        return None
    names = ("norm1", "qkv", "out", "norm2", "q", "cross_out", "norm3", "fc1", "fc2")

    def part(name, v):  # a norm as it is; a linear (None, Packed, bias) as (blocks, sums, scales, bias)
        return v if name.startswith("norm") else (v[1].blocks, v[1].sums, v[1].scales, v[2])

    flat = [tuple(part(n, p[n]) for n in names) for p in layers]
    norm, estimate, (ints, scales), keep, vocab, rescored = head
    out = (norm, part("head", estimate), ints, scales, keep, vocab, rescored)
    return mods[0].Layers(flat, out, heads, head_dim, mods[1].entry(), mods[2].entry())
