"""What the CLI shows on the terminal: rich tables and progress, all on stderr."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

err = Console(stderr=True)


def error(message: str) -> None:
    """One line: what is wrong (the CLI's exit 2 or 1 follows)."""
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def note(message: str) -> None:
    err.print(message, markup=False, highlight=False, soft_wrap=True)  # as given: "[ray]" is text, not a style


def cache_table(root, rows, title: str = "") -> None:
    """rows: (cache.Entry, problem or None) — one line each: key, size, source, state."""
    from specdec_cli.models.cache import human

    t = Table(title=f"{root}" + (f" ({title})" if title else ""), box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False, collapse_padding=True)
    t.add_column("entry", no_wrap=True)
    t.add_column("size", justify="right", no_wrap=True)
    t.add_column("from", overflow="fold")
    t.add_column("state", overflow="fold")
    for e, problem in rows:
        t.add_row(e.key, human(e.size), e.source, f"[red]{problem}[/]" if problem else "[green]ok[/]")
    err.print(t if rows else f"{root}: no cached models")


@contextlib.contextmanager
def status(title: str, quiet: bool = False):
    """A spinner with a changing message; yields step(msg)."""
    if quiet or not err.is_terminal:
        yield lambda msg: None
        return
    with err.status(title) as s:
        yield lambda msg: s.update(f"{title}: {msg}")


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def kernel_report(report, as_json: bool = False) -> None:
    """verify-kernel's report: its checks and figures (stderr), or one JSON object (stdout)."""
    from specdec_cli.decoding import VERIFIERS

    if as_json:
        print(json.dumps(report.to_dict()))
        return
    t = Table(title=f"verify-kernel --mode {report.mode}  ({report.backend}, {report.device})")
    t.add_column("check")
    t.add_column("result")
    t.add_column("detail")
    for c in report.checks:
        t.add_row(c.name, "[green]pass[/]" if c.passed else "[red]FAIL[/]", c.detail)
    err.print(t)
    f = Table(title=f"figures  (V={report.vocab}, γ={report.gamma}, B={report.batch})")
    f.add_column("figure")
    f.add_column("value", justify="right")
    for k, v in report.figures.items():
        f.add_row(k, _fmt(v))
    err.print(f)
    if not VERIFIERS[report.mode].lossless:
        fig = report.figures
        err.print(
            f"{report.mode} moves the output: TV to the target {fig['tv_to_target']:.3f} "
            f"(exact: {fig['tv_exact_to_target']:.3f}, the draft alone: {fig['tv_draft_to_target']:.3f}); "
            f"acceptance rate {fig['acceptance_rate']:.3f} vs exact {fig['acceptance_rate_exact']:.3f}",
            highlight=False,
        )
    err.print("[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/]")


def compile_report(report, as_json: bool = False) -> None:
    """verify-kernel --compile-for: what ptxas said of every kernel (stderr), or one JSON object (stdout)."""
    if as_json:
        print(json.dumps(report.to_dict()))
        return
    """One row per compiled kernel: what ptxas and Triton report."""
    t = Table(title=f"verify-kernel --mode {report.mode} --compile-for {report.arch}", box=box.SIMPLE_HEAD,
              pad_edge=False, show_edge=False, collapse_padding=True)
    for name, justify in (("kernel", "left"), ("dtype", "left"), ("GAMMA_P2/SPLITS_P2/BLOCK", "left"), ("regs", "right"),
                          ("spill B", "right"), ("smem B", "right"), ("s", "right")):
        t.add_column(name, justify=justify)
    for k in report.kernels:
        c = k.get("constexprs") or {}
        plan = "/".join(str(c.get(key, "–")) for key in ("GAMMA_P2", "SPLITS_P2", "BLOCK"))
        if not k["ok"]:
            t.add_row(k["kernel"], k.get("dtype", ""), plan, f"[red]FAILED: {k.get('error')}[/]", "", "", "")
            continue
        t.add_row(k["kernel"].strip("_").removesuffix("_kernel"), k["dtype"], plan, _opt(k["registers"], "d"),
                  _opt(k["spill_bytes"], "d"), _opt(k["shared_bytes"], "d"), f"{k['seconds']:.1f}")
    err.print(t)
    ok = sum(k["ok"] for k in report.kernels)
    err.print(f"{ok} of {len(report.kernels)} kernels compiled for {report.arch}: "
              + ("[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/]"))


@contextlib.contextmanager
def progress(title: str, total: int, quiet: bool = False, eta: bool = False):
    """A progress bar over inputs (with `eta`, the time left beside the time taken); yields advance(done, total),
    whose .reading(done, total) shows a second, passing bar while a long prompt is read."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if quiet or not err.is_terminal:
        def advance(done, total):
            return None

        advance.reading = advance
        yield advance
        return
    left = [TextColumn("left"), TimeRemainingColumn()] if eta else []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), *left,
                  console=err) as bar:
        task, prompt = bar.add_task(title, total=total), None

        def advance(done, total):
            bar.update(task, completed=done)

        def reading(done, total):
            nonlocal prompt
            if prompt is None:
                prompt = bar.add_task("reading the prompt (tokens)", total=total)
            bar.update(prompt, completed=done, total=total, visible=done < total)
            if done >= total:
                prompt = None

        advance.reading = reading
        yield advance


STAT_FIELDS = (
    "new_tokens", "target_calls", "draft_tokens", "accepted_tokens", "acceptance_rate",
    "mean_accepted_per_call", "wall_s", "tokens_per_s", "verify_ms_per_call",
)


def result_json(result, device: str) -> dict:
    """DESIGN.md's JSON object for one input; its stats are its share of its batch's (decoding.stats.rows_share)."""
    stats = result.stats.to_dict()
    return {
        "input": result.input,
        "text": result.text,
        "mode": stats["mode"],
        "backend": stats.get("backend") or "torch",
        "device": device,
        "finish_reason": result.finish_reason,
        **({"weights": result.weights} if getattr(result, "weights", None) else {}),
        "stats": {k: stats.get(k) for k in STAT_FIELDS} | {k: v for k, v in stats.items() if k not in STAT_FIELDS},
    }


def results(items, *, as_json: bool, device: str, title: str, text: bool = True) -> None:
    """Texts to stdout (none when text=False: they went to files), or one JSON object per input; the stats
    table to stderr."""
    for r in items:
        if as_json:
            print(json.dumps(result_json(r, device)), flush=True)
        elif text:
            if len(items) > 1:
                print(f"==> {r.input} <==")
            print(r.text, flush=True)
    if not as_json:
        stats_table(items, device=device, title=title)


def transcripts(items, opts, *, as_json: bool, device: str, to_files: bool) -> None:
    """transcribe's results: as `results` for plain text, JSON or files written; else each in its
    --output-format on stdout (with --timestamps, txt is timed), then the stats table."""
    from specdec_cli.tasks import formats

    title = f"transcribe --mode {opts.mode}"
    if to_files or (opts.output_format == "txt" and not opts.timestamps):
        results(items, as_json=as_json, device=device, title=title, text=not to_files)
        return
    for r in items:
        if len(items) > 1:
            print(f"==> {r.input} <==")
        print(formats.render(r, opts.output_format, timestamps=opts.timestamps, header=result_json(r, device)),
              end="", flush=True)
    stats_table(items, device=device, title=title)


def stats_table(results, *, device: str, title: str) -> None:
    """One row per input (its share of its batch's stats: decoding.stats.rows_share), named by its file name."""
    rows = []
    for r in results:
        s = r.stats
        rows.append((Path(r.input).name, str(s.new_tokens), f"{s.target_calls:.4g}", _opt(s.acceptance_rate, ".3f"),
                     _opt(s.mean_accepted_per_call, ".2f"), f"{s.tokens_per_s:.2f}", f"{s.wall_s:.2f}",
                     _opt(s.verify_ms_per_call, ".3f")))
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=0)  # the box's one space between
    t.add_column("input", overflow="fold")  # a long name folds onto a second line; a figure is never cut
    for i, name in enumerate(("new\ntokens", "target\ncalls", "accept\nrate", "accepted\nper call", "tok/s", "wall s",
                              "verify\nms/call"), 1):
        width = max(max(map(len, name.split("\n"))), max(len(row[i]) for row in rows))
        t.add_column(name, justify="right", no_wrap=True, min_width=width)
    for row in rows:
        t.add_row(*row)
    err.print(t)
    s = results[0].stats
    err.print(f"mode {s.mode}, backend {s.backend or 'torch'}, device {device}, γ {s.gamma} ({s.gamma_schedule})", highlight=False)
    if s.mode != "autoregressive":
        from specdec_cli.decoding.stats import add_counts

        rounds: list = []
        for r in results:
            add_counts(rounds, r.stats.rounds_per_gamma)
        shared = s.batch_size > 1 and len(results) > 1  # a round of a batch counts once for each input in it
        err.print("rounds at each γ" + (", each input's summed" if shared else "") + ": "
                  + ", ".join(f"γ{g} {n}" for g, n in enumerate(rounds) if n)
                  + (" (γ0: plain steps)" if rounds and rounds[0] else ""), highlight=False)
    est = s.schedule
    if est and est.get("c"):  # the auto schedule's cost model, as last measured
        ratios = est["pass_ratio"]
        longest = max(ratios)
        err.print(f"measured: draft step {est['draft_step_ms']:.1f} ms = {est['c']:.2f}× a target step of "
                  f"{est['target_step_ms']:.1f} ms, a pass over {longest} tokens {ratios[longest]:.2f}× one, "
                  f"α {est['alpha']:.2f}", highlight=False)


def _opt(v, fmt):
    return "-" if v is None else format(v, fmt)


def corpus_summary(summary) -> None:
    """The close of a --ray run (a distributed.corpus.CorpusSummary): one row per actor and one for all, the failed
    inputs (the first 10), then the last line: how many failed, or that all were done."""
    t = Table(title=f"{summary.plan.task} on ray · {summary.pool.describe()}", box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False, collapse_padding=True)
    for name in ("actor", "inputs", "failed", "new\ntokens", "accept\nrate", "tok/s\nper actor", "decoding s"):
        t.add_column(name, justify="left" if name == "actor" else "right", no_wrap=True)
    for row in summary.per_actor():
        if row["worker"] == "all":
            t.add_section()
        rate = row["accepted_tokens"] / row["draft_tokens"] if row["draft_tokens"] else None
        t.add_row(row["worker"], str(row["inputs"]), str(row["failed"]), str(row["new_tokens"]), _opt(rate, ".3f"),
                  f"{row['new_tokens'] / row['wall_s']:.2f}" if row["wall_s"] else "-", f"{row['wall_s']:.1f}")
    err.print(t)
    n = len(summary.done)
    err.print(f"{n} inputs in {summary.wall_s:.1f} s ({n / summary.wall_s if summary.wall_s else 0:.2f} inputs/s, "
              f"models loaded included); outputs and manifest in {summary.plan.manifest.parent}", highlight=False)
    for r in summary.failed[:10]:
        err.print(f"  failed: {r.error_line()}", highlight=False, soft_wrap=True)
    if len(summary.failed) > 10:
        err.print(f"  ... and {len(summary.failed) - 10} more (manifest.jsonl has each)", highlight=False)
    (error if summary.failed else note)(summary.last_line())


# ------------------------------------------------------------------------------------------------ bench


def warn(msg: str) -> None:
    """One line: something the user should know; the run goes on."""
    from rich.markup import escape

    err.print(f"[bold yellow]warning:[/] {escape(msg)}", highlight=False, soft_wrap=True)


@contextlib.contextmanager
def bench_progress(total: int, quiet: bool = False):
    """A progress bar over the benchmark's grid; yields advance(next_label)."""
    if quiet or not err.is_terminal:
        yield lambda label: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=err, transient=False) as bar:
        task = bar.add_task("", total=total)
        yield lambda label: bar.update(task, advance=1, description=f"done {label}")


def _cell(key: str, v) -> str:
    if v is None:
        return "—"
    if key == "best_gamma":
        return str(v)
    if key == "pass_ratio":
        return f"{v:.1f}×"
    if key in ("verify_share", "verify_vs_baseline"):
        return f"{100 * v:.1f} %"
    if key.startswith("speedup") or key == "predicted_speedup":
        return f"{v:.2f}×"
    if key in ("acceptance_rate", "expected_acceptance_rate", "alpha", "cost_ratio", "same_as_autoregressive") \
            or key.startswith("quality."):
        return f"{v:.3f}"
    if isinstance(v, float):  # three significant digits, trailing zeros kept so columns line up
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.{max(0, 2 - math.floor(math.log10(abs(v))))}f}" if v else "0"
    if isinstance(v, int) and key == "vocab":
        return f"{v:,}"
    return str(v)


def bench_results(measured, *, as_json: bool, new_warnings) -> None:
    """A bench run: one JSON object (stdout) or the table (stderr), then the warnings the run itself raised."""
    if as_json:
        print(json.dumps(measured.to_dict()), flush=True)
    else:
        bench_table(measured)
    for w in new_warnings:
        warn(w)


def bench_table(results) -> None:
    """The results tables of `specdec bench` (a bench.BenchResults), laid out by results.tables."""
    from specdec_cli.bench.results import value

    m = results.machine
    counts = sorted({r.threads for r in results.records if getattr(r, "threads", None)}) or [m['torch_threads']]
    threads = f"{'/'.join(map(str, counts))} thread{'s' if counts != [1] else ''}"
    heading = f"bench {results.task} · {m['device']} · {threads} · torch {m['versions']['torch']}"
    if results.config.get("pool"):  # --ray
        heading += f" · ray: {results.config['pool']}"
    for j, (setting, records) in enumerate(results.groups()):
        for i, (subtitle, cols) in enumerate(results.tables):
            title = "\n".join(x for x in (heading if i == j == 0 else "", setting if i == 0 else "", subtitle) if x)
            t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
            for key, header in cols:
                t.add_column(header, justify="left" if key in ("mode", "schedule") else "right", no_wrap=True)
            previous = None
            for k, r in enumerate(records):
                group = (r.vocab, r.batch, r.gamma) if results.task == "synthetic" else r.schedule
                if k and group != previous:
                    t.add_section()
                previous = group
                t.add_row(*(_cell(key, value(r, key)) for key, _ in cols))
            err.print(t)
    if results.task == "synthetic":
        backends = ", ".join(dict.fromkeys(f"{r.mode} {r.backend}" for r in results.records))
        err.print(f"{m['device_name']}. ms/step: median of calls timed side by side, p10 and p90 beside it; "
                  f"×base = baseline ms / mode ms; ×hf = hf ms / mode ms; acc = accepted / drafted over "
                  f"{_calls(results)} calls; expect = the rate exact sampling must give on these draft tokens. "
                  f"Backends: {backends}.", highlight=False)
    else:
        peak = "torch's peak allocated" if m["device"] == "cuda" else "the process's peak resident set, models included"
        err.print(f"{m['device_name']}. speedup = tok/s over autoregressive tok/s; predicted = Leviathan's "
                  "(1 − α^(γ+1)) / ((1 − α)(γc + 1)) with α from acc/call and c = draft ms / target ms per "
                  "forward; best γ maximises the prediction (constant γ only). γ is auto's upper bound; mean γ = "
                  "draft tokens per round, plain steps as 0; pass = the target's ms per call over its one-token "
                  f"step. verify ms = one verification call; peak MiB = {peak}; = AR = share of inputs whose output "
                  "equals autoregressive's; verify s = every verification call summed (the paper's profiling time), "
                  "share = of the decoding loops' time, Δ vs base = 1 − verify s / baseline's.", highlight=False)


def _calls(results) -> str:
    calls = [r.calls for r in results.records]
    return f"{min(calls)}" if min(calls) == max(calls) else f"{min(calls)}–{max(calls)}"


def written(paths) -> None:
    for p in paths:
        err.print(f"wrote {p}", highlight=False)
