"""The inputs of a corpus: local paths, or URIs of any filesystem pyarrow reads (the filesystems Ray Data reads:
file://, s3://, gs://, hdfs://, abfs://, ...), files or folders of them.

The driver lists them (`expand`); each actor reads its own inputs (`local_copy`): a local path as it is (on a
multi-node cluster it must name the same file on every node, e.g. a shared mount), a URI copied to a temporary
file first, so the tasks' own readers (tasks.audio.load_audio, tasks.summarize.read_article) read every input and
say what is wrong with it in their words.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from specdec_cli.errors import SpecdecError, first_line
from specdec_cli.tasks.audio import AUDIO_SUFFIXES

SUFFIXES = {"summarize": (".txt",), "transcribe": AUDIO_SUFFIXES}  # what a folder's inputs end with
REFERENCE = ".ref.txt"  # <name>.ref.txt beside an input is its reference (bench), never an input


def is_uri(path: str) -> bool:
    return "://" in path


def _filesystem(uri: str):
    """(pyarrow filesystem, path inside it) for a URI; SpecdecError in one line when pyarrow cannot open it."""
    from pyarrow import fs

    try:
        return fs.FileSystem.from_uri(uri)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... by scheme
        raise SpecdecError(f"{uri}: cannot open it ({first_line(e)})") from None


def _is_input(name: str, task: str) -> bool:
    return name.lower().endswith(SUFFIXES[task]) and not name.endswith(REFERENCE)


def expand(task: str, paths: list[str]) -> list[str]:
    """`paths` with each folder replaced by the task's inputs inside it (sorted, not recursive); a missing path or a
    folder with none raises SpecdecError, before anything is started."""
    out = []
    for path in map(str, paths):
        if path == "-":
            raise SpecdecError("-: standard input cannot be read on a cluster: give files or folders")
        found = _expand_uri(task, path) if is_uri(path) else _expand_local(task, path)
        if found is None:
            raise SpecdecError(f"{path}: no such file or folder")
        if not found:
            raise SpecdecError(f"{path}: a folder with no inputs in it ({', '.join(SUFFIXES[task])})")
        out += found
    return out


def _expand_local(task: str, path: str) -> list[str] | None:
    p = Path(path)
    if p.is_dir():
        return sorted(str(f) for f in p.iterdir() if f.is_file() and _is_input(f.name, task))
    return [path] if p.exists() else None


def _expand_uri(task: str, uri: str) -> list[str] | None:
    from pyarrow import fs

    filesystem, inner = _filesystem(uri)
    info = filesystem.get_file_info(inner)
    if info.type == fs.FileType.NotFound:
        return None
    if info.type != fs.FileType.Directory:
        return [uri]
    scheme, _, _ = uri.partition("://")
    prefix = uri[: uri.index(inner)] if inner in uri else f"{scheme}://"  # the URI up to the path inside it
    found = filesystem.get_file_info(fs.FileSelector(inner))
    return sorted(prefix + f.path for f in found if f.type == fs.FileType.File and _is_input(f.base_name, task))


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
    """A local path holding the input `path`: itself, or for a URI a temporary copy (same suffix), removed after."""
    if not is_uri(path):
        yield path
        return
    filesystem, inner = _filesystem(path)
    with tempfile.TemporaryDirectory(prefix="specdec-input-") as folder:
        local = os.path.join(folder, "input" + PurePosixPath(inner).suffix)
        try:
            with filesystem.open_input_stream(inner) as src, open(local, "wb") as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
        except FileNotFoundError:
            raise SpecdecError(f"{path}: no such file") from None
        except OSError as e:
            raise SpecdecError(f"{path}: cannot read: {first_line(e)}") from None
        yield local
