"""Whisper models behind `--target` and `--draft` for transcribe: loading (the embedded models converted from
their CTranslate2 packages by whisper_convert.py, local directories, hub ids; the route: loading.load_model),
and what a prompt needs: the special token ids, the prompt itself, the language and task checks.

    embedded | embedded:base   faster-whisper base (multilingual), converted once and cached
    embedded:tiny.en           faster-whisper tiny.en (English only)
    DIR                        a directory written by `save_pretrained` (with its WhisperProcessor)
    ORG/NAME                   a Hugging Face hub id, from the local HF cache or the network
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_cli import internals, options
from specdec_cli.errors import SpecdecError, first_line
from specdec_cli.kernels import rows_attention
from specdec_cli.models import whisper_convert
from specdec_cli.models.loading import Family, LoadedModel, load_model
from specdec_cli.models.progress import status

EMBEDDED_DEFAULT = "base"  # what a bare `--target embedded` means
SAMPLE_RATE = 16_000  # Hz: what Whisper's feature extractor takes
TIME_PER_TOKEN = 0.02  # seconds between timestamp tokens: <|0.00|>, <|0.02|>, ... <|30.00|>


def cross_attention_dtype(model) -> torch.dtype:
    """The dtype the frames' cross-attention keys and values are kept in (cross_kv). On a CPU with sdpa attention:
    - bf16 for an fp32 or bf16 model where the rows kernel (kernels/rows_attention) builds: it reads them widened
      exactly, at half the bytes. A step reads every layer's (Whisper base at three windows, fp32: 18 MB a layer;
      six layers 10.5 against 5.2 ms on an AMD EPYC Zen 3, 0.4 of an fp32 target's step, half an int8 one's). An
      fp32 model's K/V are rounded once a window, as a bf16 model's encoder output is;
    - else fp32 for a bf16 or fp16 model (torch's CPU sdpa is ~8× slower in bf16 than in fp32 for a few queries
      over the 1 500 frames: 851 against 89 µs, Whisper base's 8 heads, two threads), the model's dtype otherwise.
    Elsewhere the model's dtype. The target's steps and passes, and the lean draft, all read these: one rule, so
    that autoregressive and speculative decoding compute alike."""
    if not (model.device.type == "cpu" and internals.attention_implementation(model.config) == "sdpa"):
        return model.dtype
    if model.dtype in (torch.float32, torch.bfloat16) and rows_attention.KERNEL.module() is not None:
        return torch.bfloat16
    return torch.float32 if model.dtype in (torch.bfloat16, torch.float16) else model.dtype


class WhisperFamily(Family):
    kind = "a Whisper model"

    def embedded(self, name: str, role: str, dtype: torch.dtype, progress: bool) -> LoadedModel:
        name = name or EMBEDDED_DEFAULT
        if name not in whisper_convert.EMBEDDED:
            raise SpecdecError(
                f"unknown embedded Whisper model '{name}': choose one of {', '.join(whisper_convert.EMBEDDED)}")
        with status(progress, f"Loading Whisper {name}"):
            model, processor = whisper_convert.load_embedded_whisper(name, dtype=dtype, show_progress=progress)
        return LoadedModel(model, processor.tokenizer, f"whisper-{name}", "embedded", f"embedded:{name}",
                           whisper_convert.cache_dir(name), processor=processor)

    def read(self, where, dtype, local_only):
        from transformers import AutoConfig, WhisperForConditionalGeneration, WhisperProcessor

        config = AutoConfig.from_pretrained(where, local_files_only=local_only)
        if getattr(config, "model_type", None) != "whisper":
            raise SpecdecError(
                f"'{where}' is not a Whisper model (model_type {getattr(config, 'model_type', None)!r}); "
                "transcribe needs a Whisper-family encoder-decoder"
            )
        model = WhisperForConditionalGeneration.from_pretrained(where, dtype=dtype, local_files_only=local_only)
        try:
            processor = WhisperProcessor.from_pretrained(where, local_files_only=local_only)
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise SpecdecError(
                f"'{where}' has no usable Whisper processor (tokenizer + feature extractor): {first_line(e)}") from e
        return model, processor.tokenizer, processor


WHISPER = WhisperFamily()


def load_whisper(spec: str = "embedded", *, role: str = "target", dtype: torch.dtype | str = "auto",
                 device: str = "cpu", progress: bool = True) -> LoadedModel:
    """A Whisper model from a spec (see the module docstring), in eval mode on `device`."""
    return load_model(spec, WHISPER, role=role, dtype=dtype, device=device, progress=progress)


def decoder_layers(model: LoadedModel):
    """The decoder layers of a Whisper model (a ModuleList)."""
    return model.model.model.decoder.layers


# ----------------------------------------------------------------------------------------------------
# Token ids and prompts


@dataclass(frozen=True)
class SpecialIds:
    eot: int
    sot: int
    no_timestamps: int | None
    no_speech: int | None
    transcribe: int | None
    translate: int | None
    languages: dict  # "en" → id (empty for an English-only model)
    multilingual: bool
    timestamp_begin: int | None = None  # <|0.00|>; ids from it to the vocabulary's end are times, 0.02 s apart
    max_initial_timestamp: int = 50  # the first timestamp is at most <|1.00|> (OpenAI's max_initial_timestamp)


def _token_id(tokenizer, token: str) -> int | None:
    i = tokenizer.convert_tokens_to_ids(token)
    unk = tokenizer.unk_token_id
    return None if i is None or (i == unk and token != tokenizer.unk_token) else int(i)


def special_ids(model: LoadedModel) -> SpecialIds:
    """The special tokens the prompt and the stop need, from the generation config, else the tokenizer."""
    g = model.model.generation_config
    tok = model.tokenizer
    eot = g.eos_token_id if isinstance(g.eos_token_id, int) else (g.eos_token_id or [None])[0]
    eot = eot if eot is not None else _token_id(tok, "<|endoftext|>")
    sot = g.decoder_start_token_id if g.decoder_start_token_id is not None else _token_id(tok, "<|startoftranscript|>")
    if eot is None or sot is None:
        raise SpecdecError(f"model '{model.name}' lacks <|endoftext|> / <|startoftranscript|> token ids")
    lang_to_id = getattr(g, "lang_to_id", None) or {}
    translate = _token_id(tok, "<|translate|>")
    if not lang_to_id and translate is not None:  # OpenAI's layout: the language tokens lie between the two
        lang_to_id = {t: i for t, i in tok.get_vocab().items() if sot < i < translate}
    multilingual = getattr(g, "is_multilingual", None)
    if multilingual is None:  # OpenAI's English-only vocabulary has 51 864 tokens (its language tokens unused)
        multilingual = model.output_size != 51864 and bool(lang_to_id) and _token_id(tok, "<|transcribe|>") is not None
    task_to_id = getattr(g, "task_to_id", None) or {}
    no_ts = getattr(g, "no_timestamps_token_id", None)
    no_speech = _token_id(tok, "<|nospeech|>") or _token_id(tok, "<|nocaptions|>")
    no_ts = int(no_ts) if no_ts is not None else _token_id(tok, "<|notimestamps|>")
    ts_begin = _token_id(tok, "<|0.00|>")  # right after <|notimestamps|> in every Whisper vocabulary
    if ts_begin is None or no_ts is None or ts_begin != no_ts + 1 or ts_begin >= model.output_size:
        ts_begin = None
    initial = getattr(g, "max_initial_timestamp_index", None)
    return SpecialIds(
        eot=int(eot), sot=int(sot),
        no_timestamps=no_ts,
        no_speech=no_speech,
        transcribe=task_to_id.get("transcribe", _token_id(tok, "<|transcribe|>")),
        translate=task_to_id.get("translate", _token_id(tok, "<|translate|>")),
        languages={t.strip("<|>"): int(i) for t, i in lang_to_id.items()} if multilingual else {},
        multilingual=bool(multilingual),
        timestamp_begin=ts_begin,
        **({} if initial is None else {"max_initial_timestamp": int(initial)}),
    )


def check_language_task(target: LoadedModel, language: str, task: str) -> None:
    """Refuse, in one line, a language or task this model cannot do (before any audio is decoded)."""
    ids = special_ids(target)
    options.one_of("--task", task, options.WHISPER_TASKS)
    if not ids.multilingual:
        if task == "translate":
            raise SpecdecError(f"--task translate needs a multilingual model; '{target.name}' is English-only")
        if language not in ("auto", "en"):
            raise SpecdecError(f"--language {language}: '{target.name}' is English-only (use en or auto)")
        return
    if language != "auto" and language.lower() not in ids.languages:
        raise SpecdecError(f"--language {language!r}: unknown to '{target.name}' (e.g. en, de, fr, or auto)")
    if ids.transcribe is None or (task == "translate" and ids.translate is None):
        raise SpecdecError(f"model '{target.name}' lacks the <|{task}|> token")


def check_timestamps(target: LoadedModel) -> None:
    """Refuse, in one line, --timestamps with a model whose vocabulary has no timestamp tokens."""
    if special_ids(target).timestamp_begin is None:
        raise SpecdecError(f"--timestamps: '{target.name}' has no timestamp tokens (<|0.00|> after <|notimestamps|>)")


def prompt_ids(ids: SpecialIds, language: str | None, task: str, timestamps: bool = False) -> list[int]:
    """[<sot>, <lang>, <task>, <notimestamps>] (English-only: [<sot>, <notimestamps>]); with timestamps the
    last token is left out, so that the model writes them."""
    out = [ids.sot]
    if ids.multilingual:
        out += [ids.languages[language or "en"], ids.translate if task == "translate" else ids.transcribe]
    if ids.no_timestamps is not None and not timestamps:
        out.append(ids.no_timestamps)
    return out
