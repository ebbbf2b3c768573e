"""PNG plots of `specdec bench` results (matplotlib, Agg: no display needed, no pyplot state).

synthetic:  {task}-{device}-time-vs-gamma.png     ms per verification step vs γ, one line per mode (p10–p90
                                                  band), one panel per (batch, vocab): the paper's figure 3
            {task}-{device}-speedup-vs-gamma.png  baseline ms / mode ms vs γ, same panels
tasks:      {task}-{device}-verify-vs-gamma.png      ms per verification call vs γ per mode (the paper's
                                                     figure 3, inside a real decoding run)
            {task}-{device}-acceptance-vs-gamma.png  acceptance rate vs γ per mode (the paper's table 8)
            {task}-{device}-speedup-vs-gamma.png     speedup over autoregressive vs γ: measured (solid) and
                                                     Leviathan's prediction (dashed); auto over its upper
                                                     bound (dotted)
"""

from __future__ import annotations

from pathlib import Path

# one colour per mode, none repeated (a mode missing here took matplotlib's first, exact's blue)
COLORS = {"baseline": "#555555", "exact": "#1f77b4", "sigmoid": "#ff7f0e", "hf": "#2ca02c", "flashinfer": "#d62728",
          "autoregressive": "#000000"}


def _figure(rows: int, cols: int):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * cols, 3.3 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def _log_y(ax) -> None:
    """Log y axis with plain tick labels (0.2, 0.5, 1, 2, 5, ...) instead of powers of ten; more of them
    when the data span less than a decade. Call after plotting."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    subs = (1.0, 2.0, 5.0) if hi >= 10 * lo else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _gamma_axis(ax, gammas, ylabel: str, legend: bool = True) -> None:
    """γ on x, `ylabel` on y, a grid, and the legend of what was plotted."""
    ax.set_xticks(sorted(gammas))
    ax.set_xlabel("γ (draft tokens)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if legend:
        ax.legend(fontsize=8)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _series(records, mode, key):
    pts = sorted((r.gamma, getattr(r, key)) for r in records if r.mode == mode and getattr(r, key) is not None)
    return [g for g, _ in pts], [v for _, v in pts]


def plot_synthetic(results, out_dir: Path) -> list[Path]:
    records = results.records
    vocabs = sorted({r.vocab for r in records})
    batches = sorted({r.batch for r in records})
    gammas = {r.gamma for r in records}
    modes = list(dict.fromkeys(r.mode for r in records))
    device = results.machine.get("device", "cpu")
    title = f"{results.machine.get('device_name', device)} · {records[0].dtype}"
    paths = []

    fig, axes = _figure(len(batches), len(vocabs))
    for i, b in enumerate(batches):
        for j, v in enumerate(vocabs):
            ax = axes[i][j]
            cell = [r for r in records if r.batch == b and r.vocab == v]
            for m in modes:
                g, med = _series(cell, m, "median_ms")
                if not g:
                    continue
                _, lo = _series(cell, m, "p10_ms")
                _, hi = _series(cell, m, "p90_ms")
                ax.plot(g, med, "o-", color=COLORS.get(m), label=m)
                ax.fill_between(g, lo, hi, color=COLORS.get(m), alpha=0.12, linewidth=0)
            _log_y(ax)
            ax.set_title(f"V = {v:,}  B = {b}", fontsize=10)
            _gamma_axis(ax, gammas, "ms per step (median, p10–p90)")
    fig.suptitle(f"verification time per step — {title}", fontsize=10)
    paths.append(_save(fig, out_dir / f"synthetic-{device}-time-vs-gamma.png"))

    fig, axes = _figure(len(batches), len(vocabs))
    for i, b in enumerate(batches):
        for j, v in enumerate(vocabs):
            ax = axes[i][j]
            cell = [r for r in records if r.batch == b and r.vocab == v]
            for m in modes:
                if m == "baseline":
                    continue
                g, ratio = _series(cell, m, "speedup_vs_baseline")
                if g:
                    ax.plot(g, ratio, "o-", color=COLORS.get(m), label=m)
            ax.axhline(1.0, color=COLORS["baseline"], linestyle=":", linewidth=1, label="baseline")
            _log_y(ax)
            ax.set_title(f"V = {v:,}  B = {b}", fontsize=10)
            _gamma_axis(ax, gammas, "baseline ms / mode ms")
    fig.suptitle(f"speedup over baseline (same run, side by side) — {title}", fontsize=10)
    paths.append(_save(fig, out_dir / f"synthetic-{device}-speedup-vs-gamma.png"))
    return paths


# Task plots: one marker per mode, so modes that measure the same (greedy decoding) stay visible on top
# of each other.
MARKERS = {"baseline": ("o", 8), "exact": ("s", 6), "sigmoid": ("^", 5)}


def _task_caption(results) -> str:
    """What a task plot was measured on: machine, models' dtype, decoding, inputs."""
    opts = results.config.get("options", {})
    t = opts.get("temperature") or 0
    inputs = len(next((r.outputs for r in results.records if r.outputs), []))
    return (f"{results.machine.get('device_name', results.machine.get('device'))} · {results.config.get('dtype')} · "
            f"{'greedy' if not t else f'T = {t:g}'} · {inputs} input{'s' if inputs != 1 else ''}")


def _task_axes(results, title: str):
    fig, axes = _figure(1, 1)
    fig.set_size_inches(6.4, 4.4)
    fig.suptitle(f"{results.task}: {title}\n{_task_caption(results)}", fontsize=9)
    return fig, axes[0][0]


def _mode_line(ax, g, ys, mode, label, dashed=False):
    marker, size = MARKERS.get(mode, ("o", 6))
    ax.plot(g, ys, marker=marker, markersize=size, linestyle="--" if dashed else "-", color=COLORS.get(mode),
            alpha=0.7 if dashed else 1.0, label=label)


def plot_task(results, out_dir: Path) -> list[Path]:
    """The first setting of a sweep (threads, draft); γ fixed per round (constant) except in the speedup plot,
    where other schedules are drawn dotted over their upper bound γ."""
    first = results.groups()[0][1]
    spec = [r for r in first if r.mode != "autoregressive"]
    records = [r for r in spec if r.schedule in (None, "constant")] or spec
    others = [r for r in spec if r not in records]
    modes = list(dict.fromkeys(r.mode for r in records))
    gammas = {r.gamma for r in spec}
    device = results.machine.get("device", "cpu")
    task = results.task
    paths = []

    fig, ax = _task_axes(results, "verification time per step (the paper's figure 3)")
    values = []
    for m in modes:
        g, ms = _series(records, m, "verify_ms_per_call")
        if g:
            _mode_line(ax, g, ms, m, m)
            values += ms
    if values and max(values) > 3 * min(values):
        _log_y(ax)
    else:
        ax.set_ylim(bottom=0)
    _gamma_axis(ax, gammas, "ms per verification call (mean)")
    paths.append(_save(fig, out_dir / f"{task}-{device}-verify-vs-gamma.png"))

    fig, ax = _task_axes(results, "acceptance rate (the paper's table 8)")
    for m in modes:
        g, rate = _series(records, m, "acceptance_rate")
        if g:
            _mode_line(ax, g, rate, m, m)
    ax.set_ylim(0, 1.02)
    _gamma_axis(ax, gammas, "acceptance rate (accepted / drafted)")
    paths.append(_save(fig, out_dir / f"{task}-{device}-acceptance-vs-gamma.png"))

    from matplotlib.lines import Line2D

    fig, ax = _task_axes(results, "speedup over autoregressive, measured and predicted")
    for m in modes:
        g, measured = _series(records, m, "speedup")
        if g:
            _mode_line(ax, g, measured, m, m)
        g, predicted = _series(records, m, "predicted_speedup")
        if g:
            _mode_line(ax, g, predicted, m, None, dashed=True)
        for schedule in dict.fromkeys(r.schedule for r in others):
            g, measured = _series([r for r in others if r.schedule == schedule], m, "speedup")
            if g:
                marker, size = MARKERS.get(m, ("o", 6))
                ax.plot(g, measured, marker=marker, markersize=size, linestyle=":", color=COLORS.get(m),
                        label=f"{m} {schedule} (γ: its upper bound)")
    ax.axhline(1.0, color=COLORS["autoregressive"], linestyle=":", linewidth=1)
    _gamma_axis(ax, gammas, "tokens/s over autoregressive tokens/s", legend=False)
    styles = [Line2D([], [], color="#333333", linestyle="-", label="measured"),
              Line2D([], [], color="#333333", linestyle="--", alpha=0.7, label="predicted (Leviathan et al.)"),
              Line2D([], [], color=COLORS["autoregressive"], linestyle=":", linewidth=1, label="autoregressive")]
    ax.legend(handles=ax.get_legend_handles_labels()[0] + styles, fontsize=8)
    paths.append(_save(fig, out_dir / f"{task}-{device}-speedup-vs-gamma.png"))
    return paths


def plot_results(results, out_dir: Path) -> list[Path]:
    """Write the plots of `results` (a bench.BenchResults) into out_dir; returns their paths."""
    if not results.records:
        return []
    if results.task == "synthetic":
        return plot_synthetic(results, Path(out_dir))
    return plot_task(results, Path(out_dir))
