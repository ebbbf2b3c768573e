"""A corpus on Ray, the driver's side of `--ray`: the inputs listed and planned, the pool sized to the cluster, the
stage (stage.py) run over them by Ray Data, and every record written as it arrives.

    plan      the inputs (files, folders, URIs: files.py), their outputs under --output-dir, those --skip-existing
              skips (a rerun resumes: an output that exists is a finished one, written whole)
    connect   Ray: the cluster at --ray=ADDRESS or RAY_ADDRESS, the one running here, or a local one for this run
    pool_for  actors × threads × GPUs: what the options say, else what suits the cluster found
    records   the stage over the inputs (ActorPoolStrategy; a killed actor is restarted and its batches retried:
              Ray Data's max_restarts / max_task_retries), each input's Record once as it arrives
    run       plan → records → each output written atomically by the driver (formats.write) then its manifest line
              (manifest.jsonl, appended and flushed: one line per input decoded or failed, the last line of an input
              is its latest), and a CorpusSummary: counts, per-actor totals, the exit code

Only the driver writes, so --output-dir is a folder of the machine running specdec; the actors only read inputs.
Nothing is written twice: a record that came back twice (a batch retried after its first try got through) is
dropped by input.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from specdec_cli.distributed import files
from specdec_cli.distributed.records import Record
from specdec_cli.distributed.stage import STAGES, Contender
from specdec_cli.errors import SpecdecError, first_line, warn
from specdec_cli.options import DecodeOptions, RayOptions
from specdec_cli.tasks import formats

MANIFEST = "manifest.jsonl"


def require_ray():
    """The ray module (with Ray Data), or SpecdecError in one line saying how to install it."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise SpecdecError("--ray needs Ray, which is not installed here: pip install 'specdec-cli[ray]'") from None
    return ray


@contextlib.contextmanager
def connect(address: str | None = None) -> Iterator:
    """Ray, initialised: the cluster at `address` (None: RAY_ADDRESS, else the one running on this machine, else a
    new local one); one this call started is shut down after. A caller that initialised Ray keeps its own."""
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    debug = os.environ.get("SPECDEC_DEBUG") == "1"
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=debug,
                 logging_level=logging.INFO if debug else logging.ERROR)
    except Exception as e:  # ConnectionError, ValueError, RuntimeError: Ray's words for a cluster it cannot reach
        where = f" {address}" if address else ""
        raise SpecdecError(f"--ray{where}: cannot start or join a Ray cluster ({first_line(e)})") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _quiet(ray) -> None:
    """Ray Data's own progress bars and execution log off: the CLI draws one bar for the corpus."""
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    if os.environ.get("SPECDEC_DEBUG") != "1":
        logging.getLogger("ray.data").setLevel(logging.ERROR)


@dataclass(frozen=True)
class Pool:
    """The actor pool of a run, and the cluster it found."""

    actors: int
    threads: int  # torch threads per actor (and the CPUs it reserves)
    gpus: float  # per actor
    nodes: int
    cluster_cpus: float
    cluster_gpus: float

    def describe(self) -> str:
        what = f"{self.gpus:g} GPU{'s' if self.gpus != 1 else ''}" if self.gpus else "CPU"
        return (f"{self.actors} actor{'s' if self.actors != 1 else ''} × {self.threads} thread"
                f"{'s' if self.threads != 1 else ''} ({what}) on {self.nodes} node{'s' if self.nodes != 1 else ''}")


def pool_for(ray, o: RayOptions, inputs: int) -> Pool:
    """The pool `o` asks for, its zeros and Nones filled from the cluster: GPUs per actor 1 where it has GPUs; one
    actor per GPU, else one per --ray-threads CPUs; never more actors than inputs. A pool larger than the cluster
    is said in one line (its actors wait for nodes an autoscaler adds); GPUs on a cluster without any are refused."""
    res = ray.cluster_resources()
    cpus, cluster_gpus = float(res.get("CPU", 0)), float(res.get("GPU", 0))
    nodes = sum(1 for n in ray.nodes() if n.get("Alive")) or 1
    gpus = (1.0 if cluster_gpus else 0.0) if o.ray_gpus is None else float(o.ray_gpus)
    if gpus and not cluster_gpus:
        raise SpecdecError(f"--ray-gpus {gpus:g}: the Ray cluster has no GPU (start a GPU node, or leave --ray-gpus out)")
    threads = o.ray_threads or 1
    actors = o.ray_actors or (int(cluster_gpus // gpus) if gpus else int(cpus // threads))
    pool = Pool(max(1, min(actors, inputs)), threads, gpus, nodes, cpus, cluster_gpus)
    if pool.actors * threads > cpus or pool.actors * gpus > cluster_gpus:
        warn(f"the pool ({pool.describe()}) asks for more than the cluster has now ({cpus:g} CPUs, "
             f"{cluster_gpus:g} GPUs): actors wait for nodes to join")
    return pool


def records(ray, task: str, options: DecodeOptions, inputs: list[str], pool: Pool, *,
            contenders: list[Contender] | None = None, warmup_tokens: int = 0) -> Iterator[Record]:
    """The stage of `task` over `inputs` on `pool`: each input's Record (one per input and contender with
    `contenders`) as it arrives, in no particular order, each once."""
    from ray.data import ActorPoolStrategy

    _quiet(ray)
    # a Ray batch is a decoding batch (--batch-size inputs decoded together), no larger than gives every actor work
    batch = max(1, min(options.batch_size, math.ceil(len(inputs) / pool.actors)))
    env = {k: os.environ[k] for k in ("SPECDEC_CACHE", "SPECDEC_KERNEL_CACHE", "SPECDEC_DEBUG") if k in os.environ}
    ds = ray.data.from_items([{"input": p} for p in inputs], override_num_blocks=max(1, math.ceil(len(inputs) / batch)))
    ds = ds.map_batches(
        STAGES[task], batch_size=batch, batch_format="numpy",
        fn_constructor_kwargs=dict(options=options, threads=pool.threads, env=env, contenders=contenders,
                                   warmup_tokens=warmup_tokens),
        compute=ActorPoolStrategy(size=pool.actors, max_tasks_in_flight_per_actor=2),
        num_cpus=pool.threads, num_gpus=pool.gpus or None,
    )  # an actor pool's defaults: max_restarts=-1, max_task_retries=-1 (a dead actor is replaced, its batches rerun)
    seen = set()
    try:
        for row in ds.iter_rows():
            rec = Record.from_row(row)
            key = (rec.input, rec.mode, rec.gamma, rec.schedule)
            if key in seen:
                continue
            seen.add(key)
            if rec.failure == "setup":
                if rec.error.startswith("unexpected failure: "):
                    raise RuntimeError(f"an actor ({rec.worker}) could not load its models: "
                                       f"{rec.error.removeprefix('unexpected failure: ')}")
                raise SpecdecError(rec.error)
            yield rec
    except ray.exceptions.RayError as e:  # retries spent, a node lost: Ray's message runs over many lines
        raise RuntimeError(f"the Ray run stopped: {first_line(e)} (the outputs written so far are kept: rerun "
                           "with --skip-existing)") from None


# ----------------------------------------------------------------------------------------------------
# A corpus run: its plan, its manifest, what it did


@dataclass
class Plan:
    """What a run does: every input, those left to do, each one's output file, how many a rerun skips."""

    task: str
    inputs: list[str]
    todo: list[str]
    outputs: dict[str, Path]
    skipped: int
    manifest: Path


def plan(task: str, inputs: list[str], output_dir: str | Path | None, fmt: str, skip_existing: bool,
         as_json: bool) -> Plan:
    """The inputs (files.expand) and their outputs under `output_dir` (formats.plan_outputs: one file per input,
    the input's stem + "." + fmt; with skip_existing those whose file is there are done), all checked before Ray
    starts."""
    if output_dir is None:
        raise SpecdecError("--ray writes one file per input and a manifest: give --output-dir")
    found = files.expand(task, inputs)
    outputs = formats.plan_outputs(found, output_dir, fmt, skip_existing, as_json)
    return Plan(task, found, outputs.todo, outputs.paths, outputs.skipped, Path(output_dir) / MANIFEST)


class Manifest:
    """manifest.jsonl, appended: one JSON object a line, flushed as written (a line cut short by a killed driver is
    ended before the next run appends)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        torn = self.path.exists() and self.path.stat().st_size > 0 and not self.path.read_bytes().endswith(b"\n")
        self.file = self.path.open("a", encoding="utf-8")
        if torn:
            self.file.write("\n")

    def write(self, line: dict) -> None:
        self.file.write(json.dumps(line, ensure_ascii=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


@dataclass
class CorpusSummary:
    """What a corpus run did: the records of the inputs decoded and failed, the pool, the time."""

    plan: Plan
    pool: Pool
    done: list[Record] = field(default_factory=list)
    failed: list[Record] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    wall_s: float = 0.0

    def add(self, rec: Record) -> None:
        (self.done if rec.ok else self.failed).append(rec)
        self.wall_s = time.perf_counter() - self.started

    @property
    def exit_code(self) -> int:
        """0: every input decoded; 2: some were bad (the CLI's code for bad input); 1: one failed otherwise."""
        if any(r.failure == "unexpected" for r in self.failed):
            return 1
        return 2 if self.failed else 0

    def per_actor(self) -> list[dict]:
        """Per actor, then "all": inputs decoded and failed, new tokens, draft tokens and those accepted, the decoding
        loops' seconds (each input's share of its batch's)."""

        def totals(name: str, recs: list[Record]) -> dict:
            row = dict(worker=name, inputs=0, failed=0, new_tokens=0, draft_tokens=0, accepted_tokens=0, wall_s=0.0)
            for r in recs:
                row["inputs" if r.ok else "failed"] += 1
                if r.ok:
                    for k in ("new_tokens", "draft_tokens", "accepted_tokens", "wall_s"):
                        row[k] += (r.stats or {}).get(k) or 0
            return row

        everything = self.done + self.failed
        workers = sorted({r.worker for r in everything})
        return [totals(w, [r for r in everything if r.worker == w]) for w in workers] + [totals("all", everything)]

    def last_line(self) -> str:
        n = len(self.plan.todo)
        skipped = f" ({self.plan.skipped} skipped: done before)" if self.plan.skipped else ""
        if self.failed:
            return f"{len(self.failed)} of {n} inputs failed{skipped}: their errors are in {self.plan.manifest}"
        return f"{len(self.done)} of {n} inputs done{skipped}"


def run(task: str, options: DecodeOptions, ray_options: RayOptions, corpus: Plan, *,
        file_text: Callable[[Record], str], on_start: Callable[[Pool], None] | None = None,
        on_record: Callable[[Record, CorpusSummary], None] | None = None) -> CorpusSummary:
    """Decode `corpus` on Ray: each input's output written (file_text(record): the file's text) as its record
    arrives, then its manifest line; on_start(pool) once the pool is sized, on_record(record, summary) after each."""
    with connect(ray_options.ray_address) as ray:
        pool = pool_for(ray, ray_options, len(corpus.todo))
        summary = CorpusSummary(corpus, pool)
        if on_start:
            on_start(pool)
        manifest = Manifest(corpus.manifest)
        try:
            for rec in records(ray, task, options, corpus.todo, pool):
                output = None
                if rec.ok:
                    output = corpus.outputs[rec.input]
                    formats.write(output, file_text(rec))
                manifest.write(rec.manifest(None if output is None else str(output)))
                summary.add(rec)
                if on_record:
                    on_record(rec, summary)
        finally:
            manifest.close()
    return summary
