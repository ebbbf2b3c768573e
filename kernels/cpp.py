"""C++ kernels built at first use with torch.utils.cpp_extension (a C++ compiler is needed then; no network) and
cached under <kernels_dir()>/<name>-<key>: $SPECDEC_KERNEL_CACHE, else the kernels/ folder of the model cache
($SPECDEC_CACHE, else the user cache dir). The key names the hash of the source and the headers it includes, torch's
version and folder, Python's version, the compiler flags and the CPU's flags, so a machine never loads another's
build. A failed build says so in one line, once, and the caller's fallback runs instead.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import threading
from pathlib import Path

OPENMP = ["-fopenmp"]  # at::parallel_for is OpenMP in torch's CPU builds: libgomp.so.1, torch's own at run time
KERNELS: list[Extension] = []  # every Extension made (a kernel module makes its own at import)


def cache_root() -> Path:
    """The cache directory: $SPECDEC_CACHE if set, else the platform's user cache dir for specdec (models/cache.py's
    root too: kernels import nothing above them)."""
    env = os.environ.get("SPECDEC_CACHE")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("specdec"))


def kernels_dir() -> Path:
    """Where kernels are built and cached: $SPECDEC_KERNEL_CACHE if set (one folder of builds for several model
    caches: the test suite's, and Ray actors given another model cache), else <cache_root()>/kernels."""
    env = os.environ.get("SPECDEC_KERNEL_CACHE")
    return Path(env).expanduser() if env else cache_root() / "kernels"


def cpu_flags() -> str:
    """The CPU's flags line from /proc/cpuinfo (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((" ".join(sorted(line.split(":", 1)[1].split())) for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def includes(text: str) -> list[str]:
    """The names a C++ text includes from beside it (`#include "name.h"`), in order."""
    return re.findall(r'^\s*#include\s+"([^"]+)"', text, re.M)


class Extension:
    """One C++ source built into a module at first use(), or None where it cannot be (said once: `fallback` names
    what runs instead)."""

    def __init__(self, name: str, source: Path, cflags: list[str], fallback: str):
        self.name, self.source, self.cflags, self.fallback = name, source, cflags, fallback
        self.error: str | None = None
        self._lock = threading.Lock()
        self._module = None
        self._tried = False
        KERNELS.append(self)

    def headers(self) -> list[Path]:
        """The headers beside the source that it includes (`#include "name.h"`), and those they include, which its
        build reads too."""
        found: list[Path] = []
        todo = [self.source]
        while todo:
            for name in includes(todo.pop().read_text()):
                header = self.source.with_name(name)
                if header not in found:
                    found.append(header)
                    todo.append(header)
        return found

    def key(self) -> str:
        import torch

        text = b"".join(f.read_bytes() for f in [self.source, *self.headers()])
        torch_dir = Path(torch.__file__).parent  # its headers and libraries: another venv's torch builds apart
        text += f"|{torch.__version__}|{torch_dir}|{sys.version_info[:2]}|{self.cflags}|{cpu_flags()}".encode()
        return hashlib.sha256(text).hexdigest()[:16]

    def folder(self) -> Path:
        """Where this machine's build of it is cached."""
        return kernels_dir() / f"{self.name}-{self.key()}"

    def cached(self) -> bool:
        """Whether a build for this machine is in the cache (module() then only loads it)."""
        return any(self.folder().glob("*.so"))

    def build(self):
        from torch.utils import cpp_extension

        where = self.folder()
        where.mkdir(parents=True, exist_ok=True)
        source = self.staged(where)
        import logging

        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        name = re.sub(r"\W", "_", f"specdec_{where.name}")  # a Python module's name: specdec_<name>_<key>
        # fresh lists: load() appends torch's libraries to the ones it is given, and a shared list would carry them
        # into the next kernel's command, so a kernel's command (which ninja rebuilds on) would depend on the kernels
        # built before it in the process: alternating commands rebuilt one kernel after another (~1 min each)
        return cpp_extension.load(name=name, sources=[str(source)], build_directory=str(where),
                                  extra_cflags=[*self.cflags, *OPENMP], extra_ldflags=list(OPENMP), verbose=False)

    def staged(self, where: Path) -> Path:
        """The source and its headers copied into the build folder `where` (once: the key holds their text), so the
        build's command names the same file wherever specdec is installed. ninja rebuilds when the command changes:
        naming the checkout's file, a second install of the same sources (make gpu's build/gpu, a Ray actor's, a
        test's) rebuilt the cached kernels, each install undoing the other's (~1 min each on 2 cores)."""
        for f in [self.source, *self.headers()]:
            copy = where / f.name
            if not copy.exists():  # never rewritten: a new mtime would rebuild
                part = where / f".{f.name}.{os.getpid()}.{threading.get_ident()}"
                shutil.copyfile(f, part)
                os.replace(part, copy)
        return where / self.source.name

    def module(self):
        """The built module, or None when it cannot be built here (said once, on stderr)."""
        if self._module is not None:  # built: no lock (a step calls kernels ~250 times)
            return self._module
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    self._module = self.build()
                except Exception as e:  # no compiler, a compile error, a read-only cache: fall back
                    lines = [line for line in str(e).strip().splitlines() if line.strip()]
                    self.error = f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]
                    from specdec_cli.errors import warn

                    warn(f"the {self.name} kernel did not build ({self.error}): {self.fallback}")
            return self._module


def load_all(extensions: list[Extension] | None = None, workers: int | None = None) -> None:
    """Load every one of `extensions` (default every kernel imported), building those not in the cache first,
    `workers` at a time (default one a core): each build is one compiler process (~40 s on 2 cores), so a fresh
    cache's builds take a core's share of the time they take one after another."""
    from concurrent.futures import ThreadPoolExecutor

    extensions = KERNELS if extensions is None else extensions
    todo = [e for e in extensions if not e.cached()]
    if todo:
        with ThreadPoolExecutor(max(1, min(len(todo), workers or os.cpu_count() or 1))) as pool:
            list(pool.map(lambda e: e.module(), todo))
    for e in extensions:
        e.module()
