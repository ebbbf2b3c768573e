"""The decoding tasks as bench sees them: where each finds its inputs, which options it runs, and one runner
that decodes every contender (contenders.run_contenders) for any task registered in RUNNERS.

A task registers here with a `Runner`: its options class (the CLI's defaults), how it reads an input, how it
loads its (target, draft), and how it decodes inputs. The tasks know nothing of bench.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from specdec_cli import options
from specdec_cli.bench import peers
from specdec_cli.bench.contenders import (
    WARMUP_TOKENS,
    Contender,
    Progress,
    Run,
    TaskRecord,
    contenders_of,
    run_contenders,
)
from specdec_cli.decoding import GenerationStats, merge_stats
from specdec_cli.drafts import spec
from specdec_cli.errors import SpecdecError
from specdec_cli.tasks import audio, summarize, transcribe


@dataclass(frozen=True)
class Runner:
    options: type[options.DecodeOptions]  # its defaults are the CLI's
    read: Callable[[str], Any]  # path -> input, SpecdecError when unusable
    load_pair: Callable[..., tuple[Any, Any]]  # (options, progress) -> (target, draft)
    decode: Callable[..., list]  # (target, draft, inputs, options) -> results with .text and .stats
    folder: str  # its inputs under --data DIR: DIR/<folder> when that exists, else DIR
    suffixes: tuple[str, ...]  # files with these suffixes are inputs, except *.ref.txt (references)
    what: str  # how an error names the inputs


def _transcribe(target, draft, inputs, opts):
    return transcribe.transcribe(target, draft, [path for path, _ in inputs], opts,
                                 audios=[audio for _, audio in inputs])


RUNNERS: dict[str, Runner] = {
    "summarize": Runner(options.SummarizeOptions, summarize.read_article, summarize.load_pair, summarize.summarize,
                        "articles", (".txt",), "*.txt articles"),
    "transcribe": Runner(options.TranscribeOptions, lambda p: (p, audio.load_audio(p)), transcribe.load_pair,
                         _transcribe, "audio", audio.AUDIO_SUFFIXES,
                         "audio files"),
}

# A task's own settings (TaskConfig.options), each the `specdec bench` option of that name ("max_new_tokens" ->
# --max-new-tokens); an option left out is the CLI's default. Library callers may also pass "inputs" (paths)
# and "references" (texts) instead of "data".
# Any other field of the task's options class (e.g. "language") may be given too, by library callers.
TASK_OPTIONS = ("data", "limit", "target", "draft", "draft_vocab", "draft_stop", "max_new_tokens", "temperature",
                "language", "target_quant")


def task_options(config) -> options.DecodeOptions:
    """The decoding options a task bench runs (mode and γ vary per contender): the CLI's defaults, with what
    the bench command sets. One difference, on purpose: inputs too long for the model are cut (summarize's
    --truncate), so that one long article does not end a long run."""
    cls = RUNNERS[config.task].options
    names = {f.name for f in dataclasses.fields(cls)}
    given = {k: v for k, v in config.options.items() if k in names and v is not None}
    if config.batch is not None:
        given["batch_size"] = config.batch
    opts = cls(**given).replace(
        device=config.device, dtype=config.dtype, backend=config.backend,
        alpha=config.alpha, beta=config.beta, seed=config.seed)
    return opts.replace(truncate=True) if hasattr(opts, "truncate") else opts


@dataclass(frozen=True)
class Setting:
    """One point of a bench sweep: the thread count and the draft's options the contenders run with."""

    threads: int
    options: options.DecodeOptions
    draft: str  # the draft's options in words, for the tables
    target_int8: bool = False  # transcribe --target-int8: the target's linears in int8
    encoder_int8: bool | None = None  # transcribe --encoder-int8: the encoder's linears in int8; None: no encoder

    @property
    def target(self) -> tuple[int, bool, bool | None]:
        """What autoregressive decoding depends on: it runs once per (threads, target) of a sweep."""
        return self.threads, self.target_int8, self.encoder_int8


def task_settings(config) -> list[Setting]:
    """Every threads × target-int8 × encoder-int8 × draft-vocab × draft-quantized point of `config` (a TaskConfig); a
    sweep left out is the task's default (for threads: torch's current count)."""
    base = task_options(config)
    int8 = config.target_int8 or [getattr(base, "target_int8", False)]
    encoder = config.encoder_int8 or [getattr(base, "encoder_int8", None)]  # None: a task without an encoder
    points = itertools.product(config.threads or [torch.get_num_threads()], int8, encoder,
                               config.draft_vocabs or [base.draft_vocab], config.draft_quantized or [base.draft_quantized])
    out = []
    for t, i, e, v, q in points:
        opts = base.replace(threads=str(t), draft_vocab=v, draft_quantized=q, **({"target_int8": i} if i else {}),
                            **({"encoder_int8": e} if e is not None else {}))
        label = _draft_label(opts.draft, v, q) + (", int8 target" if i else "") + (", own encoder" if e is False else "")
        out.append(Setting(t, opts, label, i, e))
    return out


def _draft_label(draft: str, vocab: int, quantized: bool) -> str:
    """A setting's draft as the results name it: the model draft's vocabulary and weights (a lookup draft has
    neither: its spec alone)."""
    lookup, model = spec.split_lookup(draft)
    if model is None:
        return lookup
    return (f"{lookup}+" if lookup else "") + f"vocab {vocab or 'full'}, {'quantized' if quantized else 'unquantized'}"


def examples_dir() -> Path:
    """The example inputs shipped with specdec (`examples/` of the source tree, package data of a wheel)."""
    return Path(str(resources.files("specdec_cli.examples")))


def data_files(task: str, data: str | Path | None) -> list[str]:
    """The input files of `task` under --data (default: the shipped examples), sorted; SpecdecError when none."""
    root = Path(data) if data is not None else examples_dir()
    if not root.is_dir():
        raise SpecdecError(f"--data {root}: no such directory")
    r = RUNNERS[task]
    where = root / r.folder if (root / r.folder).is_dir() else root
    files = sorted(p for p in where.iterdir()
                   if p.is_file() and p.suffix.lower() in r.suffixes and not p.name.endswith(".ref.txt"))
    if not files:
        raise SpecdecError(f"--data {root}: no usable files for --task {task} (expected {r.what} in it or in "
                           f"{r.folder}/, with <name>.ref.txt references beside them)")
    return [str(p) for p in files]


def task_inputs(config) -> tuple[list[str], list[str] | None]:
    """(input paths, their references; None unless every input has one), the first --limit of them, from:
    options["inputs"] (+ options["references"]) when given; else the files under --data (data_files);
    else the task's default: the shipped examples, and for transcribe first the LibriVox clips of Debian's
    pocketsphinx-testdata when installed (5 clips; the examples hold one of them)."""
    opts = config.options
    if opts.get("inputs"):
        inputs = [str(p) for p in opts["inputs"]]
        refs = list(opts.get("references") or [audio.reference_for(p) for p in inputs])
    elif opts.get("data") is None and config.task == "transcribe" and audio.librivox_clips():
        inputs, refs = map(list, zip(*((str(w), r) for w, r in audio.librivox_clips())))
    else:
        inputs = data_files(config.task, opts.get("data"))
        refs = [audio.reference_for(p) for p in inputs]
    limit = opts.get("limit") or len(inputs)
    inputs, refs = inputs[:limit], refs[:limit]
    return inputs, (refs if all(r is not None for r in refs) else None)


def read_inputs(task: str, paths: list[str]) -> list:
    """Every input read as its task reads it (SpecdecError on an empty, binary or unreadable one)."""
    return [RUNNERS[task].read(p) for p in paths]


def run_task(config, progress: Progress | None = None) -> list[TaskRecord]:
    """Every contender of `config` (a TaskConfig) over its inputs, at every point of its sweep (task_settings):
    autoregressive once per thread count (and target: --target-int8), the speculative contenders once per draft
    setting, the --peers tools at each thread count in the rounds of its first setting (beside the target alone).
    One TaskRecord each (contenders.aggregate derives the speedups). wall_s is the decoding loops' time (prefill included;
    reading inputs and, for transcribe, the encoder left out). Leaves torch's thread count as it found it."""
    r = RUNNERS[config.task]
    paths, refs = task_inputs(config)
    inputs = read_inputs(config.task, paths)  # every input is checked before the models load
    progress = progress or (lambda _msg: None)
    records, saved, previous = [], torch.get_num_threads(), None
    try:
        for threads, group in itertools.groupby(task_settings(config), key=lambda s: s.threads):
            torch.set_num_threads(threads)
            for i, setting in enumerate(group):
                target, draft = r.load_pair(setting.options.replace(mode=config.modes[0]), progress=False)

                def decode(c: Contender, short: bool, opts=setting.options, target=target, draft=draft):
                    o = opts.replace(mode=c.mode, gamma=max(c.gamma, 1), gamma_schedule=c.schedule or "constant")
                    if short:
                        o = o.replace(max_new_tokens=min(o.max_new_tokens, WARMUP_TOKENS))
                    results = r.decode(target, None if c.mode == "autoregressive" else draft,
                                       inputs[:1] if short else inputs, o)
                    per_input = [x.stats for x in results]  # each input its share of its batch's
                    stats = merge_stats(per_input, GenerationStats(c.mode, c.gamma, o.gamma_schedule, o.batch_size))
                    return [x.text for x in results], stats.finish(), stages(per_input)

                first = setting.target != previous
                previous = setting.target
                # the --peers tools in the rounds of the group's first setting, beside the target alone
                beside = peer_runs(config, inputs, refs, threads) if i == 0 else []
                records += run_contenders(config, contenders_of(config, autoregressive=first), decode, refs,
                                          progress, peers=beside, threads=threads, draft=setting.draft,
                                          target_int8=setting.target_int8, encoder_int8=setting.encoder_int8)
                del target, draft, decode, beside  # one pair in memory at a time
    finally:
        torch.set_num_threads(saved)
    return records


def stages(stats: list) -> dict:
    """{"input_wall_s": each input's share of its batch's wall_s (all of it at batch 1)}, and {"end_to_end_s", "encoder_s"} summed
    over a task's per-input stats where it times them (transcribe's TranscribeStats: total_s, encoder_s)."""
    out: dict = {"input_wall_s": [s.wall_s for s in stats]}
    if stats and all(hasattr(s, "total_s") for s in stats):
        out.update(end_to_end_s=sum(s.total_s for s in stats), encoder_s=sum(s.encoder_s for s in stats))
    return out


def peer_runs(config, inputs: list, refs: list[str] | None, threads: int) -> list[Run]:
    """The runs (contenders.Run) of every --peers tool that can run here (peers.skipped: the one line the bench
    showed for those that cannot), at this thread count, on the same inputs, each tool in a process of its own
    (peers.served)."""
    out = []
    opts = task_options(config)
    for name in config.peers:
        if peers.skipped(name, opts.target) is not None:
            continue
        if name == "faster-whisper":
            out += peers.served(name, opts.target, [audio for _, audio in inputs], refs, threads=threads,
                                language=getattr(opts, "language", "auto"), max_new_tokens=opts.max_new_tokens)
        else:  # hf-assisted (on the run's device), llama.cpp
            out += peers.served(name, opts, inputs, refs, threads=threads,
                                device=config.device if name == "hf-assisted" else "cpu")
    return out
