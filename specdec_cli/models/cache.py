"""The user cache: where converted models live, how an entry is written safely, and how damage is found.

Layout (root = $SPECDEC_CACHE, else platformdirs' user cache dir for "specdec", e.g. ~/.cache/specdec):

    <root>/models/<key>/                one complete model: config.json, model.safetensors, tokenizer files,
                                        and specdec.json (the marker, written last: no marker, no entry)
    <root>/models/encoder-q6_k-<hash>/  a Whisper encoder's linears on Q6_K blocks (models/int8.py, --encoder-int8)
    <root>/models/.tmp-<key>-<pid>-*/   an entry being written (or removed) by process <pid>
    <root>/kernels/<name>-<hash>/       a C++ kernel built at first use (kernels/cpp.py), rebuilt when missing
                                        ($SPECDEC_KERNEL_CACHE, when set, holds them instead)

An entry is written in a temporary sibling directory and renamed into place, so a reader never sees half a
model; when two processes race, the first rename wins and the other's copy is thrown away. The marker
records every file's size and checksum (crc32), whole and sampled (files up to WHOLE bytes whole, larger ones
SAMPLE bytes of every SAMPLE_EVERY): a load checks the sizes and the sample (milliseconds: 4 MB of a 3.4 GB
model), `specdec cache verify` every byte. Temporaries left by
killed processes are swept whenever the cache is opened.

A cache that cannot take an entry (a full disk, a read-only folder) raises CacheUnwritable, one line that
names the folder and the space needed and free, or the permission missing; the loaders then run without it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specdec_cli.errors import SpecdecError
from specdec_cli.kernels.cpp import cache_root, kernels_dir  # the cache directories, defined where kernels need them

MARKER = "specdec.json"
SAMPLE, SAMPLE_EVERY, WHOLE = 4096, 1 << 20, 64 << 20  # the quick check: 4 KiB of every MiB past 64 MiB
_CHUNK = 8 << 20  # bytes read at a time while hashing or joining
_SPACE_MARGIN = 64 << 20  # left free on top of what an entry needs


class CacheUnwritable(SpecdecError):
    """The cache cannot take an entry: no space left, or no permission to write there."""


def models_dir() -> Path:
    return cache_root() / "models"


def remove_kernels() -> int:
    """Delete the kernels built at first use (kernels_dir()); returns the bytes freed (0 when there were none)."""
    folder = kernels_dir()
    if not folder.is_dir():
        return 0
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    _remove_aside(folder, folder.with_name(f".kernels-{os.getpid()}-removed"))
    return size


def entry_path(key: str) -> Path:
    """Where the model cached under `key` lives (whether or not it exists yet)."""
    return models_dir() / key


def _marker(key: str) -> dict | None:
    try:
        return json.loads((entry_path(key) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def read_entry(key: str) -> dict | None:
    """The metadata a complete entry was written with, or None when there is no complete entry. Opening the
    cache sweeps what killed processes left behind."""
    sweep_stale_temporaries()
    marker = _marker(key)
    if marker is None:
        return None
    marker.pop("files", None)
    return marker


# --------------------------------------------------------------------------------------------------
# Checksums: what a sound entry holds


def human(n: float) -> str:
    """Bytes for a person: 3.4 GB, 512 MB, 12 kB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def _sampled_crc(path: Path, size: int) -> int:
    if size <= WHOLE:
        return _full_crc(path)
    crc = 0
    with open(path, "rb") as f:
        for offset in range(0, size, SAMPLE_EVERY):
            f.seek(offset)
            crc = zlib.crc32(f.read(SAMPLE), crc)
    return crc


def _full_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def fingerprint(folder: Path) -> dict[str, dict]:
    """{file name: {size, crc32, sampled}} of every file in an entry's folder but the marker."""
    out = {}
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.name != MARKER:
            size = p.stat().st_size
            out[p.name] = {"size": size, "crc32": _full_crc(p), "sampled": _sampled_crc(p, size)}
    return out


def damage(key: str, full: bool = False) -> str | None:
    """What is wrong with the complete entry `key`, in a few words, or None when it is sound (or absent).
    Checks each recorded file's size and sampled checksum; `full` also reads every byte. An entry written
    before checksums were recorded passes the quick check and fails the full one."""
    marker = _marker(key)
    if marker is None:
        return None
    if "files" not in marker:
        return "no checksums: written by an older specdec (clear it to rebuild)" if full else None
    folder = entry_path(key)
    for name, want in marker["files"].items():
        p = folder / name
        try:
            size = p.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != want["size"]:
            return f"{name} holds {human(size)} of {human(want['size'])}"
        try:
            if _sampled_crc(p, size) != want["sampled"] or (full and _full_crc(p) != want["crc32"]):
                return f"{name} is not what was written (checksum)"
        except OSError as e:
            return f"{name} cannot be read ({e.strerror or e})"
    return None


# --------------------------------------------------------------------------------------------------
# Writing and removing entries


def _unwritable(folder: Path, error: OSError, needed: int | None = None) -> CacheUnwritable:
    """The one line for an OSError met while writing into `folder`."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        free = _free(folder)
        need = f", about {human(needed)} needed" if needed else ""
        return CacheUnwritable(f"no space left in {folder} ({human(free)} free{need})")
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CacheUnwritable(f"cannot write into {folder}: {error.strerror or 'permission denied'}")
    return CacheUnwritable(f"cannot write into {folder}: {error.strerror or error}")


def _free(folder: Path) -> int:
    for p in (folder, *folder.parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(p).free
    return 0


def require_space(folder: Path, needed: int) -> None:
    """CacheUnwritable unless `folder`'s filesystem has room for `needed` more bytes (and a margin)."""
    free = _free(folder)
    if free < needed + _SPACE_MARGIN:
        raise CacheUnwritable(f"no space left in {folder} ({human(free)} free, about {human(needed)} needed)")


@contextlib.contextmanager
def atomic_entry(key: str, meta: dict) -> Iterator[Path]:
    """Yield a temporary directory to fill; on success write the marker (meta and every file's checksum) and
    rename it to `key`. On any exception the temporary directory is removed and nothing is left behind;
    an OSError of a full or read-only cache becomes CacheUnwritable.

    >>> with atomic_entry("demo-bf16", {"source": "x"}) as tmp:   # doctest: +SKIP
    ...     model.save_pretrained(tmp)
    """
    parent = models_dir()
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-{os.getpid()}-", dir=parent))
    except OSError as e:
        raise _unwritable(parent, e) from None
    sweep_stale_temporaries()
    try:
        try:
            yield tmp
            marker = {**meta, "files": fingerprint(tmp)}
            (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS):
                raise _unwritable(parent, e) from None
            raise
        final = entry_path(key)
        if final.exists() and _marker(key) is None:
            shutil.rmtree(final, ignore_errors=True)  # a stale, incomplete entry
        try:
            os.rename(tmp, final)
        except OSError:
            if _marker(key) is None:  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_entry(key: str) -> None:
    """Remove an entry: renamed aside first (a reader never sees it half removed), then deleted."""
    path = entry_path(key)
    if not path.exists():
        return
    _remove_aside(path, path.with_name(f".tmp-{key}-{os.getpid()}-removed"))


def _remove_aside(path: Path, aside: Path) -> None:
    """Rename `path` to `aside` (a reader never sees it half removed), then delete it; in place if it cannot move."""
    try:
        os.rename(path, aside)
    except OSError:
        aside = path
    shutil.rmtree(aside, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but not ours
        return True
    return True


def _owner(name: str) -> int | None:
    found = re.search(r"-(\d+)-[^-]*$", name)
    return int(found.group(1)) if found else None


def sweep_stale_temporaries() -> None:
    """Remove temporary entries left by killed processes (named .tmp-<key>-<pid>-*, pid no longer alive).

    Assumes the cache is not shared between machines (a pid means something on this machine only)."""
    with contextlib.suppress(OSError):
        for tmp in models_dir().glob(".tmp-*"):
            pid = _owner(tmp.name)
            if pid is not None and pid != os.getpid() and not _alive(pid):
                shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# What `specdec cache` shows


@dataclass
class Entry:
    key: str
    path: Path
    size: int  # bytes on disk
    meta: dict | None  # None: no marker (an incomplete entry)

    @property
    def source(self) -> str:
        m = self.meta or {}
        return m.get("model") or m.get("file") or m.get("source") or "?"


def entries() -> list[Entry]:
    """Every entry of the cache (complete or not), by key; temporaries of running builds left out."""
    sweep_stale_temporaries()
    out = []
    with contextlib.suppress(OSError):
        for p in sorted(models_dir().iterdir()):
            if p.is_dir() and not p.name.startswith("."):
                size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
                out.append(Entry(p.name, p, size, read_entry(p.name)))
    return out


# --------------------------------------------------------------------------------------------------


def hash_and_join(parts: list[Path], dest: Path | None, on_bytes=None) -> str:
    """sha256 of the concatenation of `parts`; also write it to `dest` unless dest is None.

    `on_bytes(n)` is called after each chunk (for a progress bar).
    """
    digest = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(dest, "wb")) if dest is not None else None
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
                    if out is not None:
                        out.write(chunk)
                    if on_bytes is not None:
                        on_bytes(len(chunk))
    return digest.hexdigest()


def file_fingerprint(path: Path) -> str:
    """A cheap identity for a local file: its resolved path, inode, size, mtime and ctime (no full read). The ctime
    moves whenever the file is written, so a file replaced in place with the same size and mtime (copied with its
    times kept, or its mtime set back) is another file here.

    >>> len(file_fingerprint(Path(__file__)))
    16
    """
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]
