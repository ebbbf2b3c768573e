"""The tensors of a GGUF file, from its header alone: each one's name, GGML type, dimensions and where its bytes are.

gguf's GGUFReader builds every metadata value before the tensors (a vocabulary's 150 000 strings one numpy slice at
a time: 6 of the embedded target's 15 s of load here); the tensors need only that metadata walked past. The layout
(GGUF v2 and v3, little-endian):

    magic "GGUF", version u32, tensor count u64, metadata count u64
    each metadata entry   key (u64 length, bytes), value type u32, value: a scalar, a string (u64 length, bytes)
                          or an array (element type u32, count u64, the elements)
    each tensor           name (a string), dimension count u32, dimensions u64 (the row length first), type u32,
                          offset u64 from the data
    the data              from the first multiple of general.alignment (32 unless the file says) after the header
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdec_cli.errors import SpecdecError
from specdec_cli.kernels import gguf_blocks

MAGIC = b"GGUF"
VERSIONS = (2, 3)
SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
STRING, ARRAY, UINT32 = 8, 9, 4
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class GgufTensor:
    name: str
    type_id: int  # GGML type (gguf.GGMLQuantizationType)
    dims: tuple[int, ...]  # the row length first
    start: int  # its first byte, from the start of the file

    @property
    def rows(self) -> int:
        return math.prod(self.dims[1:])


@dataclass(frozen=True)
class GgufHeader:
    architecture: str | None  # general.architecture ("llama", "qwen2", "gemma3", ...)
    tensors: dict[str, GgufTensor]  # by name, in the file's order
    version: int  # the GGUF version: 2 or 3


HEADER_KEYS = ("general.alignment", "general.architecture")  # the metadata the header reads


def read_header(path: str | Path) -> GgufHeader:
    """The header of the GGUF file at `path`; SpecdecError (one line) when it is not one."""
    return _mapped(path, lambda m: _walk(m, HEADER_KEYS.__contains__)[0])


def _mapped(path: str | Path, read):
    """read(the file at `path`, memory-mapped); SpecdecError (one line) when it is not a GGUF file read can take."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return read(m)
    except (struct.error, UnicodeDecodeError, ValueError) as e:  # mmap: ValueError for an empty file
        raise SpecdecError(f"'{path}' is not a GGUF file specdec can read: {e}") from None


def read_tensors(path: str | Path) -> dict[str, GgufTensor]:
    """{name: GgufTensor} of the GGUF file at `path`, in the file's order."""
    return read_header(path).tensors


@dataclass(frozen=True)
class GgufField:
    """One metadata entry: `types` [value type] or [ARRAY, element type] (gguf.GGUFValueType), `values` the value
    ([v] for a scalar, an array's elements), strings as their bytes."""
    types: list[int]
    values: list


def read_metadata(path: str | Path) -> tuple[GgufHeader, dict[str, GgufField]]:
    """The header and every metadata entry of the GGUF file at `path`, in one walk (what internals.gguf_parsed_once
    hands transformers)."""
    return _mapped(path, lambda m: _walk(m, lambda key: True))


SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_fields(path: str | Path) -> dict[str, GgufField]:
    """{key: GgufField} of every metadata entry of the GGUF file at `path`, in the file's order (a 150 000-token
    vocabulary in 0.08 s where GGUFReader takes 6), the tensors not read; SpecdecError (one line) when it is not a
    GGUF file."""
    return _mapped(path, lambda m: _metadata(m, lambda key: True)[2])


def _metadata(m, keep) -> tuple[int, int, dict[str, GgufField], int]:
    """(version, tensor count, {key: GgufField} of the entries keep(key) wants, the others walked past, where the
    tensor table starts)."""
    if m[:4] != MAGIC:
        raise ValueError("no GGUF magic")
    (version,) = struct.unpack_from("<I", m, 4)
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version} (v2 and v3 little-endian are read)")
    n_tensors, n_kv = struct.unpack_from("<QQ", m, 8)

    def values(kind: int, at: int, count: int, read: bool) -> tuple[list, int]:  # `count` values of type `kind`
        if kind in SCALAR_FORMATS:
            end = at + count * SCALAR_BYTES[kind]
            return list(struct.unpack_from(f"<{count}{SCALAR_FORMATS[kind]}", m, at)) if read else [], end
        if kind == STRING:
            out = []
            for _ in range(count):
                if read:
                    v, at = _string(m, at)
                    out.append(v)
                else:
                    at += 8 + struct.unpack_from("<Q", m, at)[0]
            return out, at
        if kind == ARRAY and not read:  # an array of arrays, walked past
            for _ in range(count):
                inner, n = struct.unpack_from("<IQ", m, at)
                at = values(inner, at + 12, n, False)[1]
            return [], at
        raise ValueError(f"unknown metadata value type {kind}")

    fields, at = {}, 24
    for _ in range(n_kv):
        raw, at = _string(m, at)
        key = raw.decode("utf-8")
        read = keep(key)
        (kind,) = struct.unpack_from("<I", m, at)
        if kind == ARRAY:
            inner, n = struct.unpack_from("<IQ", m, at + 4)
            vals, at = values(inner, at + 16, n, read)
            types = [ARRAY, inner]
        else:
            vals, at = values(kind, at + 4, 1, read)
            types = [kind]
        if read:
            fields[key] = GgufField(types, vals)
    return version, n_tensors, fields, at


def _string(m, at: int) -> tuple[bytes, int]:
    """The string at `at` (u64 length, bytes) and where it ends."""
    (n,) = struct.unpack_from("<Q", m, at)
    if at + 8 + n > len(m):
        raise ValueError("a string runs past the end of the file")
    return m[at + 8 : at + 8 + n], at + 8 + n


def _walk(m, keep) -> tuple[GgufHeader, dict[str, GgufField]]:
    """The header, and the metadata entries keep(key) wants (HEADER_KEYS among them)."""
    version, n_tensors, fields, at = _metadata(m, keep)
    alignment, architecture = DEFAULT_ALIGNMENT, None
    if (f := fields.get("general.alignment")) and f.types == [UINT32]:
        alignment = f.values[0]
    if (f := fields.get("general.architecture")) and f.types == [STRING]:
        architecture = f.values[0].decode("utf-8")
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment {alignment} is not a power of two")
    infos = []
    for _ in range(n_tensors):
        raw, at = _string(m, at)
        name = raw.decode("utf-8")
        (n_dims,) = struct.unpack_from("<I", m, at)
        dims = struct.unpack_from(f"<{n_dims}Q", m, at + 4)
        kind, offset = struct.unpack_from("<IQ", m, at + 4 + 8 * n_dims)
        at += 4 + 8 * n_dims + 12
        infos.append((name, kind, tuple(dims), offset))
    data = -(-at // alignment) * alignment
    tensors = {name: GgufTensor(name, kind, dims, data + offset) for name, kind, dims, offset in infos}
    end = max((t.start + t.rows * row for t in tensors.values() if (row := _row_bytes(t)) is not None), default=0)
    if end > len(m):
        raise ValueError(f"the file is cut short: its tensors end at byte {end}, the file at {len(m)}")
    return GgufHeader(architecture, tensors, version), fields


def _row_bytes(t: GgufTensor) -> int | None:
    """The bytes of one row of `t` (its first dimension), or None for a type the gguf package does not know."""
    import gguf

    try:
        block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.type_id)]
    except (ValueError, KeyError):
        return None
    return t.dims[0] // block * nbytes


def read_raw(path: str | Path, t: GgufTensor) -> np.ndarray:
    """The bytes of tensor `t`, shaped as gguf's reader shapes them: the dimensions last to first, the row (the first
    dimension) as its bytes. uint8, for gguf.dequantize or, blocks of a type kernels/gguf_blocks takes, the kernels.

    Mapped from the file, not copied (as llama.cpp maps a GGUF): its pages are the page cache's until a write, which
    goes to a private copy (the file is never written). A model's blocks are packed at load (models/gguf_linear.py),
    so most mappings live only that long; the embedded target's 1.0 GB of blocks were read into fresh memory in
    1.2–1.6 s of its 5.9 s load (AMD EPYC, 2 threads), and held beside their packed form until then. A file cut
    short or replaced in place while mapped would fault: the models specdec caches are written whole, then renamed.
    Where the file system cannot map a file, its bytes are read."""
    row = _row_bytes(t)
    if row is None:
        import gguf

        raise SpecdecError(f"'{path}': tensor {t.name} has GGML type {t.type_id}, which gguf "
                           f"{getattr(gguf, '__version__', '')} does not know")
    shape, size = (*reversed(t.dims[1:]), row), t.rows * row
    first = t.start - t.start % mmap.ALLOCATIONGRANULARITY  # a mapping starts at a multiple of it
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < t.start + size:
            raise SpecdecError(f"'{path}' ends inside tensor {t.name}: the file is cut short")
        try:
            m = mmap.mmap(f.fileno(), t.start + size - first, offset=first, access=mmap.ACCESS_COPY)
        except (OSError, ValueError):  # a file system that cannot map a file, or no bytes to map: read instead
            return np.fromfile(f, dtype=np.uint8, count=size, offset=t.start).reshape(shape)
    return np.frombuffer(m, dtype=np.uint8, count=size, offset=t.start - first).reshape(shape)  # holds m while viewed


def read_blocks(path: str | Path, t: GgufTensor) -> np.ndarray:
    """The blocks of tensor `t` (a type kernels/gguf_blocks takes): [rows, row_bytes] uint8."""
    gguf_blocks.row_bytes(gguf_blocks.BY_ID[t.type_id], t.dims[0])  # KeyError / ValueError for what it cannot take
    return read_raw(path, t).reshape(t.rows, -1)
