"""The user cache: where dequantized models live, and how a cache entry is written safely.

Layout (root = $SPECDEC_CACHE, else platformdirs' user cache dir for "specdec", e.g. ~/.cache/specdec):

    <root>/models/<key>/            one complete model: config.json, model.safetensors, tokenizer files,
                                    and specdec.json (the marker, written last: no marker, no entry)
    <root>/models/.tmp-<key>-*/     an entry being written; renamed into place when complete

An entry is written in a temporary sibling directory and renamed into place, so a reader never sees
half a model; when two processes race, the first rename wins and the other's copy is thrown away.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

MARKER = "specdec.json"
_CHUNK = 8 << 20  # bytes read at a time while hashing or joining


def cache_root() -> Path:
    """The cache directory: $SPECDEC_CACHE if set, else the platform's user cache dir for specdec."""
    env = os.environ.get("SPECDEC_CACHE")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("specdec"))


def models_dir() -> Path:
    return cache_root() / "models"


def entry_path(key: str) -> Path:
    """Where the model cached under `key` lives (whether or not it exists yet)."""
    return models_dir() / key


def read_entry(key: str) -> dict | None:
    """The marker's metadata of a complete entry, or None when there is no complete entry."""
    marker = entry_path(key) / MARKER
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def atomic_entry(key: str, meta: dict) -> Iterator[Path]:
    """Yield a temporary directory to fill; on success write the marker and rename it to `key`.

    On an exception the temporary directory is removed and nothing is left behind.

    >>> with atomic_entry("demo-bf16", {"source": "x"}) as tmp:   # doctest: +SKIP
    ...     model.save_pretrained(tmp)
    """
    parent = models_dir()
    parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temporaries()
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-{os.getpid()}-", dir=parent))
    try:
        yield tmp
        (tmp / MARKER).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        final = entry_path(key)
        if final.exists() and read_entry(key) is None:
            shutil.rmtree(final, ignore_errors=True)  # a stale, incomplete entry
        try:
            os.rename(tmp, final)
        except OSError:
            if read_entry(key) is None:  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but not ours
        return True
    return True


def sweep_stale_temporaries() -> None:
    """Remove temporary entries left by killed processes (named .tmp-<key>-<pid>-*, pid no longer alive).

    Assumes the cache is not shared between machines (a pid means something on this machine only).
    """
    for tmp in models_dir().glob(".tmp-*"):
        found = re.search(r"-(\d+)-[^-]*$", tmp.name)
        if found and int(found.group(1)) != os.getpid() and not _alive(int(found.group(1))):
            shutil.rmtree(tmp, ignore_errors=True)


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
    """A cheap identity for a local file: its resolved path, size and mtime (no full read).

    >>> len(file_fingerprint(Path(__file__)))
    16
    """
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]
