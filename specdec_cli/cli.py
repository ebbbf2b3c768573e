"""The `specdec` command: thin Typer commands that parse, call the library, and render."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from specdec_cli import models
from specdec_cli.errors import SpecdecError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    help="Faster transformer decoding with speculative sampling, verified by fused Triton kernels.",
)
err = Console(stderr=True)


@app.callback()
def _root():
    """Faster transformer decoding with speculative sampling, verified by fused Triton kernels."""


def handle_errors(fn):
    """SpecdecError → one line, exit 2. Anything else → one line, exit 1 (traceback with SPECDEC_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SpecdecError as e:
            err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - the last resort: never a bare traceback
            if os.environ.get("SPECDEC_DEBUG") == "1":
                raise
            err.print(f"[bold red]error:[/] unexpected failure: {type(e).__name__}: {e} (set SPECDEC_DEBUG=1 for the traceback)", highlight=False, soft_wrap=True)
            raise typer.Exit(1)

    return wrapper


# Options shared by several commands, defined once.
Device = Annotated[str, typer.Option(help="auto | cpu | cuda")]
Seed = Annotated[int, typer.Option(help="Random seed.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of tables.")]
Alpha = Annotated[float, typer.Option(help="Sigmoid approximation: lower logit constant α (paper eq. 5).")]
Beta = Annotated[float, typer.Option(help="Sigmoid approximation: upper logit constant β (paper eq. 5).")]


@app.command("verify-kernel")
@handle_errors
def verify_kernel(
    mode: Annotated[str, typer.Option(help="exact | sigmoid")] = "exact",
    vocab: Annotated[int, typer.Option(help="Vocabulary size of the random cases.")] = 32000,
    gamma: Annotated[int, typer.Option(help="Draft tokens per step (1..32).")] = 5,
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 4,
    samples: Annotated[int, typer.Option(help="Draws for the distribution test.")] = 100_000,
    cases: Annotated[int, typer.Option(help="Random cases checked decision for decision.")] = 8,
    alpha: Alpha = -1e4,
    beta: Beta = 1e4,
    device: Device = "auto",
    seed: Seed = 0,
    as_json: Json = False,
):
    """Prove a verification kernel right: the Triton kernel (compiled on CUDA, under the Triton
    interpreter on a CPU) against the reference on random cases, then the output distribution.

    For `sigmoid`, which is lossy by design, it checks the kernel against its own torch reference and
    reports how far the output distribution moves from the target's. Exits 0 only if every check passed.

    Examples:

        specdec verify-kernel --mode exact
        specdec verify-kernel --mode exact --vocab 151936 --gamma 10 --batch 2 --json
        specdec verify-kernel --mode sigmoid --alpha -1000 --beta 1000
    """
    from specdec_cli import kernel_check, render

    if mode not in ("exact", "sigmoid"):
        raise SpecdecError(f"--mode must be exact or sigmoid (got {mode!r})")
    kernel_check.validate(vocab, gamma, batch, samples, alpha, beta, cases)
    device = models.resolve_device(device)
    with render.status(f"verify-kernel --mode {mode}", quiet=as_json) as step:
        report = kernel_check.run(
            mode, vocab=vocab, gamma=gamma, batch=batch, samples=samples, alpha=alpha, beta=beta,
            device=device, seed=seed, cases=cases, progress=step,
        )
    if as_json:
        print(json.dumps(report.to_dict()))
    else:
        render.kernel_report(report)
    raise typer.Exit(0 if report.passed else 1)


@app.command("bench")
@handle_errors
def bench(
    task: Annotated[str, typer.Option(help="synthetic | summarize | transcribe")] = "synthetic",
    vocab: Annotated[str, typer.Option(help="Vocabulary sizes V, comma-separated (synthetic).")] = "32000,151936",
    gamma: Annotated[str, typer.Option(help="Draft lengths γ, comma-separated (1..32).")] = "1,5,10",
    batch: Annotated[str, typer.Option(help="Batch sizes B, comma-separated (a decoding task runs at the smallest).")] = "1,8",
    modes: Annotated[str, typer.Option(help="Comma-separated: baseline, exact, sigmoid, and hf (transformers' own, synthetic, B = 1 only). A task always runs autoregressive too.")] = "baseline,exact,sigmoid,hf",
    device: Device = "auto",
    dtype: Annotated[Optional[str], typer.Option(help="synthetic: the logits' dtype, float32 (default) | bfloat16 | float16; a task: the models' dtype, auto (default) or one of those.")] = None,
    overlap: Annotated[float, typer.Option(help="Synthetic draft/target overlap Σ min(p, q), i.e. the expected α.")] = 0.8,
    repeat: Annotated[Optional[int], typer.Option(help="synthetic: timed calls per provider (default 50; more while under 0.1 s). A task: passes over the inputs per (γ, mode), the fastest kept (default 1).")] = None,
    backend: Annotated[str, typer.Option(help="exact/sigmoid kernels: auto (triton on CUDA, torch on CPU) | torch | triton.")] = "auto",
    alpha: Alpha = -1e4,
    beta: Beta = 1e4,
    seed: Seed = 0,
    threads: Annotated[Optional[int], typer.Option(help="torch intra-op threads (default: torch's, one per core).")] = None,
    data: Annotated[Optional[Path], typer.Option(help="A task's inputs: a directory of articles (*.txt) or audio, or with an articles/ or audio/ folder; <name>.ref.txt beside an input is its reference. Default: examples/ (transcribe: the LibriVox clips of pocketsphinx-testdata when installed).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="A task: only the first N inputs.")] = None,
    target: Annotated[Optional[str], typer.Option(help="A task's target model, as for `specdec summarize|transcribe` (default: embedded).")] = None,
    draft: Annotated[Optional[str], typer.Option(help="A task's draft model, as for `specdec summarize|transcribe` (default: embedded; transcribe: self).")] = None,
    draft_vocab: Annotated[Optional[int], typer.Option(help="A task's draft output layer size, as for `specdec summarize|transcribe` (0 = full).")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="A task: new tokens per input (default 100; transcribe: 224 per 30 s window).")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="A task: 0 = greedy (default; every mode then verifies by argmax match), > 0 samples and compares the verifications.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write every figure, the command line and the machine as JSON.")] = None,
    csv: Annotated[Optional[Path], typer.Option(help="Write one CSV row per (grid point, mode).")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write PNG plots into this directory.")] = None,
    as_json: Json = False,
):
    """Time the verification step on synthetic logits, or whole decoding tasks, per γ and mode.

    synthetic: one verification step on LM-like logits; per (V, B, γ) every mode is timed side by
    side. Reports ms per step (median), the ratio to `baseline` and to transformers' own `hf` (B = 1),
    and the acceptance rate of each mode.

    summarize | transcribe: the task over the inputs of --data, autoregressive once, then every γ × mode.
    Reports tokens/s, the speedup over autoregressive beside the one Leviathan et al.'s formula predicts
    from the measured α and cost ratio c (and the γ it says is best), acceptance, verification ms per
    call, peak memory, and ROUGE or WER against the references.

    Examples:

        specdec bench --task synthetic
        specdec bench --vocab 151936 --gamma 5 --batch 1 --json
        specdec bench --out results.json --csv results.csv --plot plots/
        specdec bench --task summarize --gamma 2,4 --modes exact,sigmoid --temperature 1 --limit 3
        specdec bench --task transcribe --data my-clips/ --target embedded:tiny.en --plot plots/
    """
    from specdec_cli import bench as lib
    from specdec_cli import render

    if task not in lib.TASKS:
        raise SpecdecError(f"--task must be one of {', '.join(lib.TASKS)} (got {task!r})")
    options = {"data": data, "limit": limit, "target": target, "draft": draft, "draft_vocab": draft_vocab,
               "max_new_tokens": max_new_tokens, "temperature": temperature}
    if task == "synthetic":
        given = [k for k, v in options.items() if v is not None]
        if given:
            raise SpecdecError(f"--{given[0].replace('_', '-')} is for --task summarize or transcribe, not synthetic")
        config = lib.SyntheticConfig(
            vocabs=lib.parse_ints(vocab, "--vocab"), gammas=lib.parse_ints(gamma, "--gamma"),
            batches=lib.parse_ints(batch, "--batch"), modes=lib.parse_names(modes, "--modes", lib.SYNTHETIC_MODES),
            device=device, dtype=dtype or "float32", overlap=overlap, repeat=50 if repeat is None else repeat,
            backend=backend, alpha=alpha, beta=beta, seed=seed, threads=threads,
        )
    else:
        names = lib.parse_names(modes, "--modes", ("autoregressive", *lib.SYNTHETIC_MODES))
        config = lib.TaskConfig(
            task=task, gammas=lib.parse_ints(gamma, "--gamma"), batch=lib.parse_ints(batch, "--batch")[0],
            modes=[m for m in names if m in lib.TASK_MODES],  # autoregressive always runs; hf is synthetic only
            device=device, dtype=dtype or "auto", repeat=1 if repeat is None else repeat, backend=backend,
            alpha=alpha, beta=beta, seed=seed, threads=threads,
            options={k: (str(v) if isinstance(v, Path) else v) for k, v in options.items() if v is not None},
        )
    config.validate()
    config.device = models.resolve_device(device)
    warnings = lib.warnings_for(config)
    for w in warnings:
        render.warn(w)
    with render.bench_progress(lib.total_steps(config), quiet=as_json) as advance:
        results = lib.run(config, progress=advance, warnings=warnings)
    paths = lib.write_outputs(results, out=out, csv_path=csv, plot_dir=plot)
    if as_json:
        print(json.dumps(results.to_dict()))
    else:
        render.bench_table(results)
    for w in results.warnings[len(warnings):]:
        render.warn(w)
    render.written(paths)


# Options shared by summarize and transcribe (and the model tasks of bench).
Target = Annotated[str, typer.Option(help="Target model: `embedded`, a Hugging Face id, a local directory, or a .gguf file.")]
Draft = Annotated[str, typer.Option(help="Draft model: as --target, or `self:K` (the target's own first K layers).")]
Mode = Annotated[str, typer.Option(help="autoregressive | baseline | exact | sigmoid")]
Gamma = Annotated[int, typer.Option(help="Draft tokens per step (γ).")]
GammaSchedule = Annotated[str, typer.Option(help="constant | heuristic (start at γ, +2 when all accepted, −1 otherwise).")]
Temperature = Annotated[float, typer.Option(help="0 = greedy (the default): output identical to the target alone.")]
TopK = Annotated[int, typer.Option(help="Keep the k most likely tokens (0 = off).")]
TopP = Annotated[float, typer.Option(help="Nucleus sampling mass in (0, 1] (1 = off).")]
MaxNew = Annotated[int, typer.Option(help="Never generate more than this many tokens per input.")]
DType = Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16 (auto: bf16 on CPUs that have it).")]
BatchSize = Annotated[int, typer.Option(help="Inputs decoded together.")]
Backend = Annotated[str, typer.Option(help="Kernel backend for exact/sigmoid: auto | torch | triton.")]

MODES = ("autoregressive", "baseline", "exact", "sigmoid")


def check_draft_options(draft_vocab: int, draft_stop: float):
    if draft_vocab < 0:
        raise SpecdecError(f"--draft-vocab must be 0 (off) or a number of tokens (got {draft_vocab})")
    if not 0.0 <= draft_stop < 1.0:
        raise SpecdecError(f"--draft-stop must be in [0, 1) (got {draft_stop})")


def check_decoding_options(mode: str, gamma: int, max_new_tokens: int, batch_size: int, backend: str, gamma_schedule: str):
    from specdec_cli import sampling  # noqa: F401 - SamplingParams validates the sampling options

    if mode not in MODES:
        raise SpecdecError(f"--mode must be one of {', '.join(MODES)} (got {mode!r})")
    if gamma < 1:
        raise SpecdecError(f"--gamma must be at least 1 (got {gamma})")
    if max_new_tokens < 1:
        raise SpecdecError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    if batch_size < 1:
        raise SpecdecError(f"--batch-size must be at least 1 (got {batch_size})")
    if backend not in ("auto", "torch", "triton"):
        raise SpecdecError(f"--backend must be auto, torch or triton (got {backend!r})")
    if gamma_schedule not in ("constant", "heuristic"):
        raise SpecdecError(f"--gamma-schedule must be constant or heuristic (got {gamma_schedule!r})")


def emit_results(results, *, as_json: bool, device: str, title: str):
    """Texts to stdout (or one JSON object per input), the stats table to stderr."""
    from specdec_cli import render

    for r in results:
        if as_json:
            print(json.dumps(render.result_json(r, device)), flush=True)
        else:
            if len(results) > 1:
                print(f"==> {r.input} <==")
            print(r.text, flush=True)
    if not as_json:
        render.stats_table(results, device=device, title=title)


@app.command()
@handle_errors
def summarize(
    articles: Annotated[list[str], typer.Argument(help="Text files to summarize; '-' reads stdin.")],
    target: Target = "embedded",
    draft: Draft = "embedded",
    mode: Mode = "exact",
    gamma: Gamma = 4,  # with --draft-stop 0.4: measured on the embedded pair (benchmarks/README.md)
    gamma_schedule: GammaSchedule = "constant",
    temperature: Temperature = 0.0,
    top_k: TopK = 0,
    top_p: TopP = 1.0,
    seed: Seed = 0,
    max_new_tokens: MaxNew = 100,
    device: Device = "auto",
    dtype: DType = "auto",
    batch_size: BatchSize = 1,
    alpha: Alpha = -1e4,
    beta: Beta = 1e4,
    backend: Backend = "auto",
    truncate: Annotated[bool, typer.Option(help="Cut articles too long for the model's context instead of refusing them.")] = False,
    draft_vocab: Annotated[int, typer.Option(help="Score only this many of the most frequent tokens (+ the prompt's) in the draft's output layer: a cheaper draft, the same output. 0 = the full vocabulary.")] = 32768,
    draft_int8: Annotated[bool, typer.Option(help="Give the draft int8 weights (CPU only): a cheaper draft, the same output.")] = True,
    draft_stop: Annotated[float, typer.Option(help="End a round's drafting early once the draft gives its token less than this probability (0 = always draft γ); the output stays the target's.")] = 0.4,
    as_json: Json = False,
):
    """Summarize articles with a causal-LM target and a smaller draft (default: the embedded
    Qwen2.5-Coder 1.5B / 0.5B pair). The summary goes to stdout, the decoding stats to stderr.

    Examples:

        specdec summarize examples/articles/bumblebees.txt
        specdec summarize --mode autoregressive examples/articles/*.txt
        cat article.txt | specdec summarize - --temperature 0.7 --seed 1 --json
        specdec summarize a.txt --target ./my-model --draft self:4 --gamma-schedule heuristic
    """
    from specdec_cli import render
    from specdec_cli import summarize as task
    from specdec_cli.sampling import SamplingParams

    check_decoding_options(mode, gamma, max_new_tokens, batch_size, backend, gamma_schedule)
    check_draft_options(draft_vocab, draft_stop)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    inputs = [task.read_article(a) for a in articles]  # every input is checked before models load
    tgt, drf = task.load_pair(target, draft, mode=mode, dtype=dtype, device=device, progress=not as_json)
    with render.progress("summarizing", total=len(inputs), quiet=as_json) as advance:
        results = task.summarize(
            tgt, drf, inputs, mode=mode, gamma=gamma, gamma_schedule=gamma_schedule, params=params,
            max_new_tokens=max_new_tokens, batch_size=batch_size, truncate=truncate, alpha=alpha, beta=beta,
            backend=backend, draft_vocab=draft_vocab, draft_int8=draft_int8, draft_stop=draft_stop, on_batch=advance,
        )
    emit_results(results, as_json=as_json, device=str(tgt.device), title=f"summarize --mode {mode}")


@app.command()
@handle_errors
def transcribe(
    audio: Annotated[list[str], typer.Argument(help="Audio files: wav, flac, ogg, mp3, ... (any rate, mono or stereo).")],
    target: Annotated[str, typer.Option(help="Whisper target: `embedded` (Whisper base), `embedded:tiny.en`, a Hugging Face id, or a local directory.")] = "embedded",
    draft: Annotated[str, typer.Option(help="`self` (the target's own decoder weights, int4, with a reduced output layer, in a lean decoding step), `self:K` (its first K layers), or another Whisper model with the same vocabulary.")] = "self",
    mode: Mode = "exact",
    gamma: Gamma = 10,  # transcribe.DEFAULT_GAMMA: measured (benchmarks/transcribe-cpu.json)
    gamma_schedule: GammaSchedule = "constant",
    temperature: Temperature = 0.0,
    top_k: TopK = 0,
    top_p: TopP = 1.0,
    seed: Seed = 0,
    max_new_tokens: Annotated[int, typer.Option(help="Never generate more than this many tokens per 30 s window.")] = 224,
    device: Device = "auto",
    dtype: DType = "auto",
    batch_size: Annotated[int, typer.Option(help="30 s windows decoded together.")] = 1,
    alpha: Alpha = -1e4,
    beta: Beta = 1e4,
    backend: Backend = "auto",
    language: Annotated[str, typer.Option(help="auto (detected per file; English-only models: en) or a language code: en, de, fr, ...")] = "auto",
    task_name: Annotated[str, typer.Option("--task", help="transcribe | translate (into English; multilingual models only).")] = "transcribe",
    draft_vocab: Annotated[int, typer.Option(help="The draft's output layer scores only the token ids below this (+ end of text): a cheaper draft, the same output. 0 = the full vocabulary.")] = 16384,
    draft_int4: Annotated[bool, typer.Option(help="Give the self draft int4 weights (CPU only): a cheaper draft, the same output.")] = True,
    draft_stop: Annotated[float, typer.Option(help="End a round's drafting early once the draft gives its token less than this probability (0 = always draft γ); the output stays the target's.")] = 0.8,  # transcribe.DEFAULT_DRAFT_STOP
    as_json: Json = False,
):
    """Transcribe speech with a Whisper target and a speculative draft (default: Whisper base, drafting
    with its own decoder weights in int4 and a reduced output layer). Audio longer than 30 s is transcribed window by
    window, cut in pauses. The transcript goes to stdout, the decoding stats to stderr.

    Examples:

        specdec transcribe examples/audio/librivox-sense-and-sensibility-0870.wav
        specdec transcribe talk.mp3 --mode autoregressive --json
        specdec transcribe interview.flac --language de --task translate
        specdec transcribe a.wav --target embedded:tiny.en --gamma 3
        specdec transcribe a.wav --target ./my-whisper --draft ./my-whisper-small
    """
    from specdec_cli import render
    from specdec_cli import transcribe as tx
    from specdec_cli.sampling import SamplingParams

    check_decoding_options(mode, gamma, max_new_tokens, batch_size, backend, gamma_schedule)
    check_draft_options(draft_vocab, draft_stop)
    if task_name not in tx.TASKS:
        raise SpecdecError(f"--task must be transcribe or translate (got {task_name!r})")
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    audios = tx.check_inputs(audio)  # every input is read before models load
    tgt, drf = tx.load_pair(target, draft, mode=mode, dtype=dtype, device=device, head_size=draft_vocab or None,
                            int4=draft_int4, progress=not as_json)
    tx.check_language_task(tgt, language.lower(), task_name)
    with render.progress("transcribing", total=sum(tx.count_windows(a) for a in audios), quiet=as_json) as advance:
        results = tx.transcribe(
            tgt, drf, audio, audios=audios, mode=mode, gamma=gamma, gamma_schedule=gamma_schedule, params=params,
            max_new_tokens=max_new_tokens, batch_size=batch_size, language=language, task=task_name, alpha=alpha,
            beta=beta, backend=backend, draft_stop=draft_stop, on_window=advance,
        )
    emit_results(results, as_json=as_json, device=str(tgt.device), title=f"transcribe --mode {mode}")


def main():  # pragma: no cover - the console script
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
