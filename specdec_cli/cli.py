"""The `specdec` command: thin Typer commands that parse, call the library, and render.

Every option's rule and default lives in specdec_cli.options; the help below shows those defaults.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

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


app = typer.Typer(
    cls=OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",  # keeps the example lines of each command's help on lines of their own
    help="Faster transformer decoding with speculative sampling, verified by fused Triton kernels.",
)

S, T, D = opt.SummarizeOptions(), opt.TranscribeOptions(), opt.DecodeOptions()


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
            raise typer.Exit(2)
        except SpecdecError as e:
            render.error(str(e))
            raise typer.Exit(2)
        except BrokenPipeError:  # the reader left (`| head`): stop quietly, as the other tools in a pipe do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(1)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - the last resort: never a bare traceback
            if os.environ.get("SPECDEC_DEBUG") == "1":
                raise
            render.error(f"unexpected failure: {type(e).__name__}: {e} (set SPECDEC_DEBUG=1 for the traceback)")
            raise typer.Exit(1)

    return wrapper


# Options shared by several commands, defined once.
Device = Annotated[str, typer.Option(help="auto | cpu | cuda")]
Seed = Annotated[int, typer.Option(help="Random seed.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object per input on stdout (one per line) instead of text and tables.")]
Alpha = Annotated[float, typer.Option(help="Sigmoid approximation: lower logit constant α (paper eq. 5).")]
Beta = Annotated[float, typer.Option(help="Sigmoid approximation: upper logit constant β (paper eq. 5).")]
Mode = Annotated[str, typer.Option(help=" | ".join(opt.MODES))]
Gamma = Annotated[int, typer.Option(help=f"Draft tokens per step (γ, 1..{opt.MAX_GAMMA}); under auto the most tried.")]
GammaSchedule = Annotated[str, typer.Option(help="auto (γ in 0..--gamma from this machine's measured costs; 0 = a plain "
                                                 "step; sampled tokens then vary run to run, their distribution does not) "
                                                 "| constant | heuristic (+2 when all accepted, −1 otherwise).")]
Temperature = Annotated[float, typer.Option(help="0 = greedy: output identical to the target alone.")]
TopK = Annotated[int, typer.Option(help="Keep the k most likely tokens (0 = off).")]
TopP = Annotated[float, typer.Option(help="Nucleus sampling mass in (0, 1] (1 = off).")]
DType = Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16 (auto: bf16 on CPUs that have it).")]
Backend = Annotated[str, typer.Option(help="Kernel backend for exact/sigmoid: auto | torch | triton.")]
DraftStop = Annotated[float, typer.Option(help="End a round's drafting early once the draft gives its token less than this probability (0 = always draft γ); the output stays the target's.")]


@app.command("verify-kernel")
@handle_errors
def verify_kernel(
    mode: Annotated[str, typer.Option(help="exact | sigmoid")] = "exact",
    vocab: Annotated[int, typer.Option(help="Vocabulary size of the random cases.")] = 32000,
    gamma: Gamma = 5,
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 4,
    samples: Annotated[int, typer.Option(help="Draws for the distribution test.")] = 100_000,
    cases: Annotated[int, typer.Option(help="Random cases checked decision for decision.")] = 8,
    alpha: Alpha = D.alpha,
    beta: Beta = D.beta,
    device: Device = "auto",
    seed: Seed = 0,
    compile_for: Annotated[Optional[str], typer.Option(help="sm_80 | sm_90: compile every kernel of the mode for that GPU, here, without one; report registers, spills, shared memory.")] = None,
    as_json: Json = False,
):
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
    from specdec_cli.models import resolve_device

    if compile_for is not None:
        with render.status(f"verify-kernel --mode {mode} --compile-for {compile_for}", quiet=as_json) as step:
            compiled = kernel_check.compile_for(mode, compile_for, progress=step)
        if as_json:
            print(json.dumps(compiled.to_dict()))
        else:
            render.compile_report(compiled)
        raise typer.Exit(0 if compiled.passed else 1)

    kernel_check.validate(mode, vocab, gamma, batch, samples, alpha, beta, cases)
    device = resolve_device(device)
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
    gamma: Annotated[str, typer.Option(help=f"Draft lengths γ, comma-separated (1..{opt.MAX_GAMMA}).")] = "1,5,10",
    batch: Annotated[str, typer.Option(help="Batch sizes B, comma-separated (a decoding task runs at the smallest).")] = "1,8",
    modes: Annotated[str, typer.Option(help="Comma-separated: baseline, exact, sigmoid, and (synthetic only) hf, transformers' own (B = 1), and flashinfer (a CUDA GPU with FlashInfer). A task always runs autoregressive too.")] = "baseline,exact,sigmoid,hf",
    device: Device = "auto",
    dtype: Annotated[Optional[str], typer.Option(help="synthetic: the logits' dtype, float32 (default) | bfloat16 | float16; a task: the models' dtype, auto (default) or one of those.")] = None,
    overlap: Annotated[float, typer.Option(help="Synthetic draft/target overlap Σ min(p, q), i.e. the expected α.")] = 0.8,
    repeat: Annotated[Optional[int], typer.Option(help="synthetic: timed calls per provider (default 50; more while under 0.1 s). A task: passes over the inputs per (γ, mode), the fastest kept (default 1).")] = None,
    backend: Backend = D.backend,
    alpha: Alpha = D.alpha,
    beta: Beta = D.beta,
    seed: Seed = D.seed,
    threads: Annotated[Optional[str], typer.Option(help="torch intra-op threads (default: torch's, one per core); a task sweeps a list, e.g. 1,all.")] = None,
    gamma_schedule: Annotated[Optional[str], typer.Option(help=f"A task's γ schedules, comma-separated: {', '.join(opt.GAMMA_SCHEDULES)}; each runs at every --gamma (auto: its upper bound). Default: auto,constant.")] = None,
    data: Annotated[Optional[Path], typer.Option(help="A task's inputs: a directory of articles (*.txt) or audio, or with an articles/ or audio/ folder; <name>.ref.txt beside an input is its reference. Default: the examples shipped with specdec (transcribe: the LibriVox clips of pocketsphinx-testdata when installed).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="A task: only the first N inputs.")] = None,
    target: Annotated[Optional[str], typer.Option(help="A task's target model, as for specdec summarize|transcribe (default: embedded).")] = None,
    draft: Annotated[Optional[str], typer.Option(help=f"A task's draft model, as for specdec summarize|transcribe (default: summarize {S.draft}, transcribe {T.draft}).")] = None,
    draft_vocab: Annotated[Optional[str], typer.Option(help=f"A task's draft output layer sizes, comma-separated, as for specdec summarize|transcribe (default: summarize {S.draft_vocab}, transcribe {T.draft_vocab}; 0 = full).")] = None,
    draft_quantized: Annotated[Optional[str], typer.Option(help="A task's draft weights: on (summarize int8, transcribe int4; the default), off, or on,off to compare.")] = None,
    target_int8: Annotated[Optional[str], typer.Option(help="transcribe: the target's weights: off (the default: the model itself), on (int8 decoder linears and output layer, as specdec transcribe --target-int8), or off,on to compare.")] = None,
    peers: Annotated[Optional[str], typer.Option(help="Other tools run beside, on the same inputs and threads, comma-separated: faster-whisper (transcribe; pip install 'specdec[peers]'; float32 and int8, fed the embedded Whisper's CTranslate2 files); hf-assisted (summarize; transformers' generate() with the draft as assistant_model, and with prompt_lookup_num_tokens). One that is not installed is skipped with one line.")] = None,
    draft_stop: Annotated[Optional[float], typer.Option(help=f"A task's --draft-stop, as for specdec summarize|transcribe (default: summarize {S.draft_stop}, transcribe {T.draft_stop}).")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help=f"A task: new tokens per input (default: summarize {S.max_new_tokens}, transcribe {T.max_new_tokens} per 30 s window).")] = None,
    language: Annotated[Optional[str], typer.Option(help=f"transcribe: the language, as for specdec transcribe (default: {T.language}); --peers run with it too.")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="A task: 0 = greedy (default; every mode then verifies by argmax match), > 0 samples and compares the verifications.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write every figure, the command line and the machine as JSON.")] = None,
    csv: Annotated[Optional[Path], typer.Option(help="Write one CSV row per (grid point, mode).")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write PNG plots into this directory.")] = None,
    as_json: Json = False,
):
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
    """
    from specdec_cli import render
    from specdec_cli.bench import config as cfg
    from specdec_cli.bench import harness, results
    from specdec_cli.models import resolve_device

    opt.one_of("--task", task, cfg.TASKS)
    task_options = {"data": data, "limit": limit, "target": target, "draft": draft, "draft_stop": draft_stop,
                    "max_new_tokens": max_new_tokens, "temperature": temperature, "language": language}
    sweeps = {"draft_vocab": draft_vocab, "draft_quantized": draft_quantized, "gamma_schedule": gamma_schedule,
              "target_int8": target_int8, "peers": peers}
    thread_counts = cfg.parse_threads(threads)
    if task == "synthetic":
        given = [k for k, v in {**task_options, **sweeps}.items() if v is not None]
        if given:
            raise SpecdecError(f"--{given[0].replace('_', '-')} is for --task summarize or transcribe, not synthetic")
        if thread_counts is not None and len(thread_counts) > 1:
            raise SpecdecError("--threads: one count for --task synthetic (a task sweeps a list)")
        config = cfg.SyntheticConfig(
            vocabs=cfg.parse_ints(vocab, "--vocab"), gammas=cfg.parse_ints(gamma, "--gamma"),
            batches=cfg.parse_ints(batch, "--batch"), modes=cfg.parse_names(modes, "--modes", cfg.SYNTHETIC_MODES),
            device=device, dtype=dtype or "float32", overlap=overlap, repeat=50 if repeat is None else repeat,
            backend=backend, alpha=alpha, beta=beta, seed=seed, threads=None if thread_counts is None else thread_counts[0],
        )
    else:
        names = cfg.parse_names(modes, "--modes", ("autoregressive", *cfg.SYNTHETIC_MODES))
        config = cfg.TaskConfig(
            task=task, gammas=cfg.parse_ints(gamma, "--gamma"), batch=cfg.parse_ints(batch, "--batch")[0],
            modes=[m for m in names if m in cfg.TASK_MODES],  # autoregressive always runs; hf is synthetic only
            device=device, dtype=dtype or D.dtype, repeat=1 if repeat is None else repeat, backend=backend,
            alpha=alpha, beta=beta, seed=seed, threads=thread_counts,
            schedules=cfg.parse_names(gamma_schedule or ",".join(cfg.DEFAULT_SCHEDULES), "--gamma-schedule",
                                      opt.GAMMA_SCHEDULES),
            draft_vocabs=None if draft_vocab is None else cfg.parse_ints(draft_vocab, "--draft-vocab"),
            draft_quantized=cfg.parse_switches(draft_quantized, "--draft-quantized"),
            target_int8=cfg.parse_switches(target_int8, "--target-int8"),
            peers=[] if peers is None else cfg.parse_names(peers, "--peers", cfg.peers.PEERS),
            options={k: (str(v) if isinstance(v, Path) else v) for k, v in task_options.items() if v is not None},
        )
    config.device = resolve_device(device)
    config.validate()
    results.check_outputs(out=out, csv_path=csv, plot_dir=plot)  # before the run, not after it
    notes = cfg.warnings_for(config)
    for w in notes:
        render.warn(w)
    with render.bench_progress(harness.total_steps(config), quiet=as_json) as advance:
        measured = harness.run(config, progress=advance, warnings=notes)
    if as_json:
        print(json.dumps(measured.to_dict()), flush=True)
    else:
        render.bench_table(measured)
    for w in measured.warnings[len(notes):]:
        render.warn(w)
    render.written(results.write_outputs(measured, out=out, csv_path=csv, plot_dir=plot))  # the table is shown first


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
def cache_verify(keys: Annotated[Optional[list[str]], typer.Argument(help="Entries to check (default: all).")] = None):
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
    keys: Annotated[Optional[list[str]], typer.Argument(help="Entries to delete.")] = None,
    all_entries: Annotated[bool, typer.Option("--all", help="Delete every entry.")] = False,
):
    """Delete cached models (they are rebuilt from their packages when next needed).

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


def _cache_entries(keys):
    from specdec_cli.models import cache

    entries = {e.key: e for e in cache.entries()}
    unknown = [k for k in keys or () if k not in entries]
    if unknown:
        raise SpecdecError(f"no cache entry {unknown[0]!r} in {cache.models_dir()} (see specdec cache list)")
    return [entries[k] for k in keys] if keys else list(entries.values())


def emit_results(results, *, as_json: bool, device: str, title: str, text: bool = True):
    """Texts to stdout (none when text=False: they went to files), or one JSON object per input; the stats
    table to stderr."""
    from specdec_cli import render

    for r in results:
        if as_json:
            print(json.dumps(render.result_json(r, device)), flush=True)
        elif text:
            if len(results) > 1:
                print(f"==> {r.input} <==")
            print(r.text, flush=True)
    if not as_json:
        render.stats_table(results, device=device, title=title)


@app.command()
@handle_errors
def summarize(
    articles: Annotated[list[str], typer.Argument(help="Text files to summarize; '-' reads stdin.")],
    target: Annotated[str, typer.Option(help="Target model: embedded, a Hugging Face id, a local directory, or a .gguf file.")] = S.target,
    draft: Annotated[str, typer.Option(help="Draft model: as --target, or self:K (the target's own first K layers); lookup (prompt lookup, no model: the tokens that followed the longest tail seen earlier in the article; lookup:N for tails of N tokens at most); lookup+DRAFT (lookup where a tail matches, DRAFT elsewhere).")] = S.draft,
    mode: Mode = S.mode,
    gamma: Gamma = S.gamma,
    gamma_schedule: GammaSchedule = S.gamma_schedule,
    temperature: Temperature = S.temperature,
    top_k: TopK = S.top_k,
    top_p: TopP = S.top_p,
    seed: Seed = S.seed,
    max_new_tokens: Annotated[int, typer.Option(help="Never generate more than this many tokens per input.")] = S.max_new_tokens,
    device: Device = S.device,
    dtype: DType = S.dtype,
    batch_size: Annotated[int, typer.Option(help="Inputs decoded together.")] = S.batch_size,
    alpha: Alpha = S.alpha,
    beta: Beta = S.beta,
    backend: Backend = S.backend,
    truncate: Annotated[bool, typer.Option(help="Cut articles too long for the model's context instead of refusing them, to --max-input-tokens.")] = S.truncate,
    max_input_tokens: Annotated[int, typer.Option(help="With --truncate: the prompt tokens kept (a long prompt takes long to read on a CPU).")] = S.max_input_tokens,
    draft_vocab: Annotated[int, typer.Option(help="Score only this many of the most frequent tokens (+ the prompt's) in the draft's output layer: a cheaper draft, the same output. 0 = the full vocabulary.")] = S.draft_vocab,
    draft_int8: Annotated[bool, typer.Option(help="Give the draft int8 weights (CPU only): a cheaper draft, the same output.")] = S.draft_quantized,
    draft_stop: DraftStop = S.draft_stop,
    as_json: Json = False,
):
    """Summarize articles with a causal-LM target and a cheaper draft.

    The default pair is the embedded Qwen2.5-Coder 1.5B (target) and 0.5B
    (draft). The summary goes to stdout, the decoding stats to stderr.

    [bold]Examples[/]

      specdec summarize examples/articles/bumblebees.txt
      specdec summarize --mode autoregressive examples/articles/*.txt
      cat article.txt | specdec summarize - --temperature 0.7 --seed 1 --json
      specdec summarize a.txt --target ./my-model --draft self:4
      specdec summarize a.txt --draft lookup
      specdec summarize a.txt --draft lookup+embedded
    """
    from specdec_cli import render
    from specdec_cli.tasks import summarize as task

    opts = opt.SummarizeOptions(
        target=target, draft=draft, mode=mode, gamma=gamma, gamma_schedule=gamma_schedule, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens, batch_size=batch_size, device=device,
        dtype=dtype, backend=backend, alpha=alpha, beta=beta, draft_vocab=draft_vocab, draft_stop=draft_stop,
        draft_quantized=draft_int8, truncate=truncate, max_input_tokens=max_input_tokens,
    ).validate()
    inputs = [task.read_article(a) for a in articles]  # every input is checked before models load
    tgt, drf = task.load_pair(opts, progress=not as_json)
    with render.progress("summarizing", total=len(inputs), quiet=as_json) as advance:
        results = task.summarize(tgt, drf, inputs, opts, on_batch=advance, on_prefill=advance.reading)
    emit_results(results, as_json=as_json, device=str(tgt.device), title=f"summarize --mode {mode}")


@app.command()
@handle_errors
def transcribe(
    audio: Annotated[list[str], typer.Argument(help="Audio files: wav, flac, ogg, mp3, ... (any rate, mono or stereo), or folders of them.")],
    target: Annotated[str, typer.Option(help="Whisper target: embedded (Whisper base), embedded:tiny.en, a Hugging Face id, or a local directory.")] = T.target,
    draft: Annotated[str, typer.Option(help="self (the target's own decoder weights, int4, with a reduced output layer, in a lean decoding step), self:K (its first K layers), self:0-2,4 (those layers), or another Whisper model with the same vocabulary; lookup (prompt lookup within each window: no model) or lookup+DRAFT.")] = T.draft,
    mode: Mode = T.mode,
    gamma: Gamma = T.gamma,
    gamma_schedule: GammaSchedule = T.gamma_schedule,
    temperature: Temperature = T.temperature,
    top_k: TopK = T.top_k,
    top_p: TopP = T.top_p,
    seed: Seed = T.seed,
    max_new_tokens: Annotated[int, typer.Option(help="Never generate more than this many tokens per 30 s window.")] = T.max_new_tokens,
    device: Device = T.device,
    dtype: DType = T.dtype,
    batch_size: Annotated[int, typer.Option(help="30 s windows decoded together.")] = T.batch_size,
    alpha: Alpha = T.alpha,
    beta: Beta = T.beta,
    backend: Backend = T.backend,
    language: Annotated[str, typer.Option(help="auto (detected per file; English-only models: en) or a language code: en, de, fr, ...")] = T.language,
    task_name: Annotated[str, typer.Option("--task", help="transcribe | translate (into English; multilingual models only).")] = T.task,
    draft_vocab: Annotated[int, typer.Option(help="The draft's output layer scores only the token ids below this (+ end of text, + the timestamp tokens with --timestamps): a cheaper draft, the same output. 0 = the full vocabulary.")] = T.draft_vocab,
    draft_int4: Annotated[bool, typer.Option(help="Give the self draft int4 weights (CPU only): a cheaper draft, the same output.")] = T.draft_quantized,
    draft_stop: DraftStop = T.draft_stop,
    timestamps: Annotated[bool, typer.Option("--timestamps", help="Decode Whisper's timestamp tokens: segments with start and end times (on for srt, vtt, tsv).")] = T.timestamps,
    output_format: Annotated[str, typer.Option(help=f"{' | '.join(opt.OUTPUT_FORMATS)}: to stdout for one input, or one file per input with --output-dir.")] = T.output_format,
    output_dir: Annotated[Optional[Path], typer.Option(help="Write one file per input here: the input's name with the format's extension.")] = None,
    skip_existing: Annotated[bool, typer.Option("--skip-existing", help="With --output-dir: skip the inputs whose file is already there (resume a folder).")] = False,
    target_int8: Annotated[bool, typer.Option(help="Give the target int8 weights in its decoder linear layers and output layer (CPU only; the encoder stays): faster, but no longer the unmodified model (its output may differ from the default's; speculative decoding then reproduces the int8 target's own output).")] = T.target_int8,
    as_json: Json = False,
):
    """Transcribe speech with a Whisper target and a speculative draft.

    The default is Whisper base, drafting with its own decoder weights in
    int4 and a reduced output layer. Audio longer than 30 s is transcribed
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
    """
    from specdec_cli import render
    from specdec_cli.models.whisper import check_language_task, check_timestamps
    from specdec_cli.tasks import formats
    from specdec_cli.tasks import transcribe as tx
    from specdec_cli.tasks.audio import audio_files

    opts = opt.TranscribeOptions(
        target=target, draft=draft, mode=mode, gamma=gamma, gamma_schedule=gamma_schedule, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens, batch_size=batch_size, device=device,
        dtype=dtype, backend=backend, alpha=alpha, beta=beta, draft_vocab=draft_vocab, draft_stop=draft_stop,
        draft_quantized=draft_int4, language=language.lower(), task=task_name, timestamps=timestamps,
        output_format=output_format, target_int8=target_int8,
    ).validate()
    files = audio_files(audio)  # folders: the audio files inside
    opt.check_output(opts.output_format, output_dir, skip_existing, len(files), as_json)
    paths = {}
    if output_dir is not None:
        formats.check_output_dir(output_dir)
        paths = dict(zip(files, formats.output_paths(files, output_dir, opts.output_format)))
        if skip_existing:
            files = [f for f in files if not paths[f].exists()]
            if len(files) < len(paths):
                render.note(f"skipping {len(paths) - len(files)} of {len(paths)} inputs: their files are in {output_dir}")
            if not files:
                return
    audios = tx.check_inputs(files)  # every input is read before models load
    tgt, drf = tx.load_pair(opts, progress=not as_json)
    check_language_task(tgt, opts.language, opts.task)
    if opts.timestamps:
        check_timestamps(tgt)
    device = str(tgt.device)

    def write(t):
        if t.input in paths:
            formats.write(paths[t.input], formats.render(t, opts.output_format, timestamps=opts.timestamps,
                                                         header=render.result_json(t, device)))
            render.written([paths[t.input]])

    with render.progress("transcribing", total=sum(tx.count_windows(a) for a in audios), quiet=as_json) as advance:
        results = tx.transcribe(tgt, drf, files, opts, audios=audios, on_window=advance, on_transcript=write)
    title = f"transcribe --mode {mode}"
    if paths or (opts.output_format == "txt" and not opts.timestamps):
        emit_results(results, as_json=as_json, device=device, title=title, text=not paths)
        return
    for r in results:
        if len(results) > 1:
            print(f"==> {r.input} <==")
        print(formats.render(r, opts.output_format, timestamps=opts.timestamps, header=render.result_json(r, device)),
              end="", flush=True)
    render.stats_table(results, device=device, title=title)


def main():  # pragma: no cover - the console script
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
