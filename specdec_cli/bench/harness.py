"""`specdec bench`: run a benchmark (synthetic.py, or a decoding task through runners.py) and gather
everything its outputs need (results.py).

    config.py      what a run is asked to measure, checked first
    synthetic.py   one verification step per provider, side by side, over V × B × γ; cases.py its inputs
    runners.py     the decoding tasks: inputs, options (the CLI's defaults), one runner for all
    corpus.py      the same over a corpus on a Ray cluster (--ray: distributed/), from the per-input records
    contenders.py  autoregressive then schedule × γ × mode over the inputs; records, speedups, Leviathan's
                   prediction
    machine.py     the machine, the CPU others took, peak memory
    results.py     BenchResults, JSON, CSV; plots.py the PNGs
    kernel_check.py  `specdec verify-kernel`
    timing.py, speedup.py, metrics.py   timing harness, Leviathan's model, ROUGE and WER
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from specdec_cli.bench import corpus, peers, runners
from specdec_cli.bench.config import SyntheticConfig, TaskConfig
from specdec_cli.bench.contenders import Progress, aggregate
from specdec_cli.bench.machine import machine_info
from specdec_cli.bench.results import BenchResults
from specdec_cli.bench.synthetic import grid, run_synthetic, spread_warnings


def run(config: SyntheticConfig | TaskConfig, progress: Progress | None = None,
        warnings: list[str] | None = None) -> BenchResults:
    """Run a benchmark and gather everything its outputs need."""
    saved_threads = torch.get_num_threads()
    if isinstance(config, SyntheticConfig) and config.threads is not None:
        torch.set_num_threads(config.threads)  # a task sets each thread count of its sweep (runners.run_task)
    try:
        machine = machine_info(config.device)
        if isinstance(config, SyntheticConfig):
            records = run_synthetic(config, progress)
            task = "synthetic"
        else:
            run_task = corpus.run_task if config.ray is not None else runners.run_task  # --ray: on a Ray cluster
            records = aggregate(run_task(config, progress or (lambda _msg: None)), greedy=config.greedy)
            task = config.task
            if task == "summarize":  # the GGUF matmul's path (models/weights.py: the default on a CPU)
                from specdec_cli.kernels import qmatmul

                machine["qmatmul"] = qmatmul.backend_line()
    finally:
        torch.set_num_threads(saved_threads)
    warnings = list(warnings or [])
    if task == "synthetic":
        warnings += spread_warnings(records)
    return BenchResults(task, config.command(), asdict(config), machine, records, warnings)



def total_steps(config: SyntheticConfig | TaskConfig) -> int:
    """Units of progress a run reports (grid points; for a task, each pass of its contenders at every point of its
    sweep, --repeat of them)."""
    if isinstance(config, SyntheticConfig):
        return len(grid(config))
    if config.ray is not None:  # one step per input: each decoded by every contender on one actor
        return len(runners.task_inputs(config)[0])
    settings = runners.task_settings(config)
    targets = len({s.target for s in settings})  # autoregressive: once per (threads, target)
    opts = runners.task_options(config)
    peer_steps = sum(len(peers.variants(p, opts.draft)) for p in config.peers if peers.skipped(p, opts.target) is None)
    threads = len({s.threads for s in settings})
    runs = targets + len(settings) * len(config.schedules) * len(config.gammas) * len(config.modes) + threads * peer_steps
    return runs * config.repeat
