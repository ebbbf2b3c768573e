"""The `specdec` command: thin Typer commands that parse, call the library, and render.

Every option's rule and default lives in specdec_cli.options; the help below shows those defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import re
import sys
import typing
import warnings
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from specdec_cli import options as opt
from specdec_cli.errors import NonFiniteLogitsError, SpecdecError, SpecdecWarning

# Typer ≥ 0.2x vendors click; its usage errors derive from typer.TyperException (public). With an older Typer
# they are click's own.
try:
    _UsageErrors = typer.TyperException
except AttributeError:  # pragma: no cover - Typer < 0.2x on a machine we do not control (the GPU one)
    import click

    _UsageErrors = click.ClickException


class OneLineErrors(TyperGroup):
    """Usage errors (an unknown option, --gamma abc, a missing argument) in one line, exit 2, like every
    other error; Typer would draw a box of five lines."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            args = ray_address_args(list(sys.argv[1:] if args is None else args))
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _UsageErrors as e:
            from specdec_cli import render

            message = e.format_message().strip()
            if message:  # empty: the help was just shown (`specdec` with no command)
                where = f" (see {e.ctx.command_path} --help)" if getattr(e, "ctx", None) is not None else ""
                render.error(f"{message}{where}")
            code = e.exit_code
        except typer.Abort:
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code or 0)


# What `--ray ADDRESS` may be followed by when it names a cluster, not an input: auto, local, ray://..., HOST:PORT
_RAY_ADDRESS = re.compile(r"^(auto|local|ray://\S+|[\w.\-\[\]:]+:\d+)$")


def ray_address_args(args: list[str]) -> list[str]:
    """`--ray=ADDRESS`, and `--ray ADDRESS` where ADDRESS looks like one and is no file, as `--ray --ray-address
    ADDRESS` (a Typer option cannot take a value that may be left out); everything else as it was."""
    out, rest = [], list(args)
    while rest:
        a = rest.pop(0)
        if a == "--":
            return out + [a] + rest
        if a.startswith("--ray="):
            out += ["--ray", "--ray-address", a.partition("=")[2]]
        elif a == "--ray" and rest and _RAY_ADDRESS.match(rest[0]) and not os.path.exists(rest[0]):
            out += ["--ray", "--ray-address", rest.pop(0)]
        else:
            out.append(a)
    return out


app = typer.Typer(
    cls=OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",  # keeps the example lines of each command's help on lines of their own
    help="Faster transformer decoding with speculative sampling, verified by fused Triton kernels.",
)

def _version(value: bool):
    if value:
        from specdec_cli import __version__

        print(f"specdec {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                 help="Print the version and exit.")] = False):
    """Faster transformer decoding with speculative sampling, verified by fused Triton kernels."""


def handle_errors(fn):
    """SpecdecError → one line, exit 2. Anything else → one line, exit 1 (traceback with SPECDEC_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from specdec_cli import render

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always", SpecdecWarning)
                shown = warnings.showwarning
                warnings.showwarning = lambda message, category, *a, **k: (
                    render.warn(str(message)) if issubclass(category, SpecdecWarning) else shown(message, category, *a, **k))
                return fn(*args, **kwargs)
        except NonFiniteLogitsError as e:  # a model that never did this before may be a damaged file
            render.error(f"{e} (if this model worked before, `specdec cache verify` checks its cached files)")
            raise typer.Exit(2) from None
        except SpecdecError as e:
            if os.environ.get("SPECDEC_DEBUG") == "1" and e.__cause__ is not None:
                raise  # a failure inside a library, said in one line: its traceback on request
            render.error(str(e))
            raise typer.Exit(2) from None
        except BrokenPipeError:  # the reader left (`| head`): stop quietly, as the other tools in a pipe do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(1) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as e:
            if os.environ.get("SPECDEC_DEBUG") == "1":
                raise
            render.error(f"unexpected failure: {type(e).__name__}: {e} (set SPECDEC_DEBUG=1 for the traceback)")
            raise typer.Exit(1) from None

    return wrapper


# ----------------------------------------------------------------------------------------------------
# From an options dataclass to Typer parameters: each option's name, default and help come from options.py


def with_options(*classes):
    """A command whose first parameters are objects of `classes` (options dataclasses, e.g. TranscribeOptions and
    RayOptions): each field becomes a Typer option (options.option: its flag, default and help), placed after the
    command's arguments and before its other options; the command receives `cls(**fields).validate()` for each
    class that has validate, else `cls(**fields)`."""

    def decorate(fn):
        own = list(inspect.signature(fn, eval_str=True).parameters.values())[len(classes):]
        fields = {cls: [f.name for f in dataclasses.fields(cls)] for cls in classes}
        params = []
        for cls in classes:
            hints, defaults = typing.get_type_hints(cls), cls()
            for name in fields[cls]:
                help_text, flag = opt.help_of(cls, name)
                info = typer.Option(*([flag] if flag else []), help=help_text)
                params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=getattr(defaults, name),
                                                annotation=Annotated[hints[name], info]))
        arguments = [p for p in own if p.default is inspect.Parameter.empty]
        rest = [p for p in own if p.default is not inspect.Parameter.empty]

        @functools.wraps(fn)
        def command(**kwargs):
            values = [cls(**{name: kwargs.pop(name) for name in fields[cls]}) for cls in classes]
            return fn(*(v.validate() if hasattr(v, "validate") else v for v in values), **kwargs)

        signature = inspect.Signature([p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in (*arguments, *params, *rest)])
        command.__signature__ = signature  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        return command

    return decorate


Json = Annotated[bool, typer.Option("--json", help="Print one JSON object per input on stdout (one per line) instead of text and tables.")]


@app.command("verify-kernel")
@handle_errors
@with_options(opt.KernelCheckOptions)
def verify_kernel(o: opt.KernelCheckOptions, as_json: Json = False):
    """Prove a verification kernel right, or measure how far sigmoid moves the output.

    The Triton kernel (compiled on CUDA, under the Triton interpreter on a
    CPU) runs against the reference on random cases, decision for decision;
    then the output distribution is tested. sigmoid, lossy by design, is
    held against its own torch reference, and how far it moves the output
    from the target's distribution is reported. Exits 0 only if every
    check passed.

    [bold]Examples[/]

      specdec verify-kernel --mode exact
      specdec verify-kernel --mode exact --vocab 151936 --gamma 10 --batch 2 --json
      specdec verify-kernel --mode sigmoid --alpha -1000 --beta 1000
      specdec verify-kernel --mode exact --compile-for sm_90
    """
    from specdec_cli import render
    from specdec_cli.bench import kernel_check

    if o.compile_for is not None:
        with render.status(f"verify-kernel --mode {o.mode} --compile-for {o.compile_for}", quiet=as_json) as step:
            report = kernel_check.compile_for(o.mode, o.compile_for, progress=step)
        render.compile_report(report, as_json=as_json)
    else:
        with render.status(f"verify-kernel --mode {o.mode}", quiet=as_json) as step:
            report = kernel_check.run_options(o, progress=step)
        render.kernel_report(report, as_json=as_json)
    raise typer.Exit(0 if report.passed else 1)


@app.command("bench")
@handle_errors
@with_options(opt.BenchOptions, opt.RayOptions)
def bench(o: opt.BenchOptions, ray: opt.RayOptions, as_json: Json = False):
    """Time the verification step, or whole decoding tasks, per γ and mode.

    synthetic: one verification step on LM-like logits; per (V, B, γ) every
    mode is timed side by side. Reports ms per step (median), the ratio to
    baseline and to transformers' own hf (B = 1), and each acceptance rate.

    summarize | transcribe: the task over the inputs of --data,
    autoregressive once, then every schedule × γ × mode, with the options
    of specdec summarize|transcribe at their defaults unless given here;
    all of it for each --threads count and draft setting listed.
    Reports tokens/s, the speedup over autoregressive beside the one
    Leviathan et al.'s formula predicts from the measured α and cost ratio
    c (and the γ it says is best), the target's pass over its one-token
    step, acceptance, verification ms per call, peak memory, and ROUGE or
    WER against the references.

    [bold]Examples[/]

      specdec bench --task synthetic
      specdec bench --vocab 151936 --gamma 5 --batch 1 --json
      specdec bench --out results.json --csv results.csv --plot plots/
      specdec bench --task summarize --gamma 2,4 --temperature 1 --limit 3
      specdec bench --task transcribe --data clips/ --target embedded:tiny.en
      specdec bench --task transcribe --threads 1,all --draft-quantized on,off
      specdec bench --task transcribe --target-int8 off,on --peers faster-whisper
      specdec bench --task summarize --limit 2 --modes exact --peers hf-assisted
      specdec bench --task transcribe --data clips/ --modes baseline,exact --gamma 5 --ray
    """
    from specdec_cli import render
    from specdec_cli.bench import config as cfg
    from specdec_cli.bench import harness, results

    config = cfg.build(o, ray)  # every option checked, the inputs read, the outputs' folders too: before the run
    notes = cfg.warnings_for(config)
    for w in notes:
        render.warn(w)
    with render.bench_progress(harness.total_steps(config), quiet=as_json) as advance:
        measured = harness.run(config, progress=advance, warnings=notes)
    render.bench_results(measured, as_json=as_json, new_warnings=measured.warnings[len(notes):])
    render.written(results.write_outputs(measured, out=o.out, csv_path=o.csv, plot_dir=o.plot))


cache_app = typer.Typer(cls=OneLineErrors, no_args_is_help=True, rich_markup_mode="rich",
                        help="List, verify and clear the models specdec converted and cached.")
app.add_typer(cache_app, name="cache")


@cache_app.command("list")
@handle_errors
def cache_list(as_json: Json = False):
    """List the cached models: size, where each came from, and whether it is sound (a quick check).

    [bold]Examples[/]

      specdec cache list
      SPECDEC_CACHE=/data/specdec specdec cache list --json
    """
    from specdec_cli import render
    from specdec_cli.models import cache

    rows = [(e, cache.damage(e.key) if e.meta is not None else "incomplete") for e in cache.entries()]
    if as_json:
        print(json.dumps({"root": str(cache.models_dir()), "entries": [
            {"key": e.key, "path": str(e.path), "bytes": e.size, "source": e.source, "problem": p} for e, p in rows]}))
    else:
        render.cache_table(cache.models_dir(), rows)


@cache_app.command("verify")
@handle_errors
def cache_verify(keys: Annotated[list[str] | None, typer.Argument(help="Entries to check (default: all).")] = None):
    """Read every byte of the cached models against the checksums recorded when they were written.

    Exits 1 when an entry is damaged; the next run that needs it rebuilds it from its package.

    [bold]Examples[/]

      specdec cache verify
      specdec cache verify qwen2.5-coder-1.5b-cc324af070c2-bfloat16
    """
    from specdec_cli import render
    from specdec_cli.models import cache

    entries = _cache_entries(keys)
    rows = [(e, cache.damage(e.key, full=True) if e.meta is not None else "incomplete") for e in entries]
    render.cache_table(cache.models_dir(), rows, title="verified: every byte")
    raise typer.Exit(1 if any(p for _, p in rows) else 0)


@cache_app.command("clear")
@handle_errors
def cache_clear(
    keys: Annotated[list[str] | None, typer.Argument(help="Entries to delete.")] = None,
    all_entries: Annotated[bool, typer.Option("--all", help="Delete every entry, and the kernels built at first use.")] = False,
):
    """Delete cached models (they are rebuilt from their packages when next needed); --all also the GGUF
    matmul kernel compiled at first use (rebuilt by the next run that needs it).

    [bold]Examples[/]

      specdec cache clear whisper-base
      specdec cache clear --all
    """
    from specdec_cli import render
    from specdec_cli.models import cache

    if not keys and not all_entries:
        raise SpecdecError("name the entries to delete (see specdec cache list), or pass --all")
    for e in cache.entries() if all_entries else _cache_entries(keys):
        cache.remove_entry(e.key)
        render.note(f"deleted {e.path} ({cache.human(e.size)})")
    if all_entries and cache.kernels_dir().is_dir():
        render.note(f"deleted {cache.kernels_dir()} ({cache.human(cache.remove_kernels())}: built kernels)")


def _cache_entries(keys):
    from specdec_cli.models import cache

    entries = {e.key: e for e in cache.entries()}
    unknown = [k for k in keys or () if k not in entries]
    if unknown:
        raise SpecdecError(f"no cache entry {unknown[0]!r} in {cache.models_dir()} (see specdec cache list)")
    return [entries[k] for k in keys] if keys else list(entries.values())


OutputDir = Annotated[Path | None, typer.Option(help="Write one file per input here: the input's name with the format's extension.")]
SkipExisting = Annotated[bool, typer.Option("--skip-existing", help="With --output-dir: skip the inputs whose file is already there (resume a folder).")]


@app.command()
@handle_errors
@with_options(opt.SummarizeOptions, opt.RayOptions)
def summarize(
    opts: opt.SummarizeOptions,
    ray: opt.RayOptions,
    articles: Annotated[list[str], typer.Argument(help="Text files to summarize; '-' reads stdin. With --ray: files or folders of *.txt, paths or URIs.")],
    output_dir: OutputDir = None,
    skip_existing: SkipExisting = False,
    as_json: Json = False,
):
    """Summarize articles with a causal-LM target and a cheaper draft.

    The default target is the embedded Qwen2.5-Coder 1.5B on its GGUF blocks,
    drafted by prompt lookup (no second model); --draft embedded takes its
    0.5B model draft. The summary goes to stdout, the decoding stats to stderr.

    [bold]Examples[/]

      specdec summarize examples/articles/bumblebees.txt
      specdec summarize --mode autoregressive examples/articles/*.txt
      cat article.txt | specdec summarize - --temperature 0.7 --seed 1 --json
      specdec summarize a.txt --target ./my-model --draft self:4
      specdec summarize a.txt --draft embedded --mode sigmoid
      specdec summarize a.txt --draft lookup+embedded --target-quant none
      specdec summarize articles/ --ray --output-dir summaries/ --skip-existing
    """
    from specdec_cli import render
    from specdec_cli.tasks import formats
    from specdec_cli.tasks import summarize as task

    if ray.ray:
        _on_ray("summarize", opts, ray, articles, output_dir, skip_existing, as_json, "txt", lambda rec: rec.text + "\n")
    outputs = formats.plan_outputs(articles, output_dir, "txt", skip_existing, as_json)
    if outputs.skipped:
        render.note(f"skipping {outputs.skipped} of {len(outputs.paths)} inputs: their files are in {output_dir}")
    if not outputs.todo:
        return
    inputs = [task.read_article(a) for a in outputs.todo]  # every input is checked before models load
    tgt, drf = task.load_pair(opts, progress=not as_json)
    with render.progress("summarizing", total=len(inputs), quiet=as_json) as advance:
        results = task.summarize(tgt, drf, inputs, opts, on_batch=advance, on_prefill=advance.reading)
    for r in results if outputs.paths else ():
        formats.write(outputs.paths[r.input], r.text + "\n")
    render.written([outputs.paths[r.input] for r in results if outputs.paths])
    render.results(results, as_json=as_json, device=str(tgt.device), title=f"summarize --mode {opts.mode}",
                   text=not outputs.paths)


@app.command()
@handle_errors
@with_options(opt.TranscribeOptions, opt.RayOptions)
def transcribe(
    opts: opt.TranscribeOptions,
    ray: opt.RayOptions,
    audio: Annotated[list[str], typer.Argument(help="Audio files: wav, flac, ogg, mp3, ... (any rate, mono or stereo), or folders of them; with --ray, paths or URIs.")],
    output_dir: OutputDir = None,
    skip_existing: SkipExisting = False,
    as_json: Json = False,
):
    """Transcribe speech with a Whisper target and a speculative draft.

    The default is Whisper base, drafting with its own decoder weights in
    int4 and a reduced int4 output layer. Audio longer than 30 s is transcribed
    window by window, cut in pauses. The transcript goes to stdout (or a
    file per input with --output-dir), the decoding stats to stderr.

    [bold]Examples[/]

      specdec transcribe examples/audio/librivox-sense-and-sensibility-0870.wav
      specdec transcribe talk.mp3 --mode autoregressive --json
      specdec transcribe talk.mp3 --timestamps
      specdec transcribe talk.mp3 --output-format srt > talk.srt
      specdec transcribe recordings/ --output-format vtt --output-dir subtitles/ --skip-existing
      specdec transcribe a.wav b.flac --output-format json --output-dir out/
      specdec transcribe interview.flac --language de --task translate
      specdec transcribe a.wav --target embedded:tiny.en --gamma 3
      specdec transcribe a.wav --target ./my-whisper --draft ./my-whisper-small
      specdec transcribe clips/ --ray --output-dir out/ --output-format json --skip-existing
      specdec transcribe s3://bucket/clips/ --ray=ray://head:10001 --ray-actors 8 --output-dir out/
    """
    from specdec_cli import render
    from specdec_cli.tasks import formats
    from specdec_cli.tasks import transcribe as tx
    from specdec_cli.tasks.audio import audio_files

    if ray.ray:
        def file_text(rec):
            t = rec.result()
            return formats.render(t, opts.output_format, timestamps=opts.timestamps, header=render.result_json(t, rec.device))

        _on_ray("transcribe", opts, ray, audio, output_dir, skip_existing, as_json, opts.output_format, file_text)

    outputs = formats.plan_outputs(audio_files(audio), output_dir, opts.output_format, skip_existing, as_json)
    if outputs.skipped:
        render.note(f"skipping {outputs.skipped} of {len(outputs.paths)} inputs: their files are in {output_dir}")
    if not outputs.todo:
        return
    audios = tx.check_inputs(outputs.todo)  # every input is read before models load
    tgt, drf = tx.load_pair(opts, progress=not as_json)
    tx.check_target(tgt, opts)
    device = str(tgt.device)

    def write(t):
        if t.input in outputs.paths:
            formats.write(outputs.paths[t.input], formats.render(t, opts.output_format, timestamps=opts.timestamps,
                                                                 header=render.result_json(t, device)))
            render.written([outputs.paths[t.input]])

    with render.progress("transcribing", total=sum(tx.count_windows(a) for a in audios), quiet=as_json) as advance:
        results = tx.transcribe(tgt, drf, outputs.todo, opts, audios=audios, on_window=advance, on_transcript=write)
    render.transcripts(results, opts, as_json=as_json, device=device, to_files=bool(outputs.paths))


def _on_ray(task: str, opts, ray: opt.RayOptions, inputs: list[str], output_dir, skip_existing: bool, as_json: bool,
            fmt: str, file_text) -> typing.NoReturn:
    """--ray: the corpus on a Ray cluster (distributed.corpus), a bar over its inputs with the time left, each output
    and its manifest line written as its record arrives, then a table per actor. Exits 0 when every input was done,
    2 when some were bad (1 when one failed otherwise): the last line says how many."""
    from specdec_cli import render
    from specdec_cli.distributed import corpus

    plan = corpus.plan(task, inputs, output_dir, fmt, skip_existing, as_json)
    corpus.require_ray()
    if plan.skipped:
        render.note(f"skipping {plan.skipped} of {len(plan.inputs)} inputs: their files are in {output_dir}")
    if not plan.todo:
        raise typer.Exit(0)

    def on_record(rec, summary):
        for w in rec.warnings:
            render.warn(w)
        if not rec.ok:
            render.error(rec.error_line())
        if as_json:
            print(json.dumps(render.result_json(rec.result(), rec.device) if rec.ok else
                             {"input": rec.input, "error": rec.error}), flush=True)
        advance(len(summary.done) + len(summary.failed), len(plan.todo))

    with render.progress(f"{task} on ray", total=len(plan.todo), quiet=as_json, eta=True) as advance:
        summary = corpus.run(task, opts, ray, plan, file_text=file_text, on_record=on_record,
                             on_start=lambda pool: render.note(f"ray: {pool.describe()}, {len(plan.todo)} inputs"))
    render.corpus_summary(summary)
    raise typer.Exit(summary.exit_code)


def main():  # pragma: no cover - the console script
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
