"""Corpus scale on Ray Data: `--ray` on summarize, transcribe and bench's task runs.

    stage.py     the Ray Data stage: Summarizer and Transcriber, callable classes for Dataset.map_batches with an
                 ActorPoolStrategy (one model load per actor, through the CLI's loading and cache)
    records.py   what the stage returns per input: text, segments, stats, or the one-line error of a bad input
    corpus.py    the driver: inputs and outputs planned (--skip-existing), the pool sized to the cluster, each
                 output written once, atomically, and a line of manifest.jsonl per input
    files.py     inputs as local paths or URIs of any filesystem pyarrow reads (what Ray Data reads)

Ray is optional (`pip install 'specdec-cli[ray]'`): nothing here imports it until a run starts (corpus.connect),
and without it `--ray` is refused in one line. Layering: bench → distributed → tasks.
"""

from specdec_cli.distributed.records import Record
from specdec_cli.distributed.stage import Stage, Summarizer, Transcriber

__all__ = ["Record", "Stage", "Summarizer", "Transcriber"]
