"""`specdec bench --task summarize|transcribe --ray`: every contender over a corpus on a Ray cluster, the per-input
records summed into the bench's TaskRecords: corpus-level WER or ROUGE, acceptance, speedup over autoregressive,
Leviathan's prediction, and the verification's time summed over every input with its share of the decoding time
and its change against baseline (the paper's "profiling time", Table 1).

Each input goes to one actor, which decodes it with every contender in turn (autoregressive first; each mode warmed
up once per actor, untimed: distributed.stage), so a contender and autoregressive are timed on the same actors, under
the same load, input by input. A contender's tokens/s is its new tokens over its decoding seconds, both summed over
the corpus; an input that failed under any contender is left out of all of them (said in one line).
"""

from __future__ import annotations

from pathlib import Path

from specdec_cli.bench import runners
from specdec_cli.bench.contenders import WARMUP_TOKENS, Contender, Progress, TaskRecord, contenders_of, task_record
from specdec_cli.decoding import GenerationStats, merge_stats
from specdec_cli.distributed import Record, corpus
from specdec_cli.errors import warn


def run_task(config, progress: Progress) -> list[TaskRecord]:
    """Every contender of `config` (a TaskConfig with .ray) over its inputs on a Ray pool -> one TaskRecord each
    (contenders.aggregate derives the speedups). Sets config.pool to the pool it ran on, in words."""
    paths, refs = runners.task_inputs(config)
    setting = runners.task_settings(config)[0]
    spec = contenders_of(config)
    keys = [(c.mode, c.gamma, c.schedule) for c in spec]
    got: dict[tuple, dict[str, Record]] = {k: {} for k in keys}
    failed: dict[str, Record] = {}
    seen: dict[str, int] = {}
    with corpus.connect(config.ray.ray_address) as ray:
        pool = corpus.pool_for(ray, config.ray, len(paths))
        config.pool = pool.describe()
        for rec in corpus.records(ray, config.task, setting.options.replace(mode=config.modes[0]), paths, pool,
                                  contenders=keys, warmup_tokens=WARMUP_TOKENS):
            if rec.ok:
                got[(rec.mode, rec.gamma, rec.schedule)][rec.input] = rec
            else:
                failed.setdefault(rec.input, rec)
            seen[rec.input] = seen.get(rec.input, 0) + 1
            if seen[rec.input] == len(keys) or (not rec.ok and seen[rec.input] == 1):
                progress(Path(rec.input).name)
    keep = [i for i, p in enumerate(paths) if p not in failed and all(p in got[k] for k in keys)]
    if len(keep) < len(paths):
        first = next(iter(failed.values()), None)
        warn(f"{len(paths) - len(keep)} of {len(paths)} inputs failed and are left out of every contender"
             + (f" (first: {first.error_line()})" if first else ""))
    refs = [refs[i] for i in keep] if refs else None
    out = []
    for c, k in zip(spec, keys):
        recs = [got[k][paths[i]] for i in keep]
        record = _record(config, c, recs, refs)
        record.threads, record.draft = pool.threads, None if c.mode == "autoregressive" else setting.draft
        out.append(record)
    return out


def _record(config, c: Contender, recs: list[Record], refs: list[str] | None) -> TaskRecord:
    """One contender's TaskRecord from its per-input records: stats summed (each input's share of its batch's), texts in
    input order, transcribe's stages (end to end, encoder) summed."""
    per_input = [r.stats_object() for r in recs]
    batch = runners.task_options(config).batch_size
    stats = merge_stats(per_input, GenerationStats(c.mode, c.gamma, c.schedule or "constant", batch)).finish()
    return task_record(config.task, c, [r.text for r in recs], stats, None, refs, runners.stages(per_input))
