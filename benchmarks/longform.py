"""Long-form transcription end to end (load excluded), specdec beside faster-whisper in one run, interleaved.

The recording: the five LibriVox clips of pocketsphinx-testdata joined REPEATS times (12: 297 s, ~5 minutes;
tasks.transcribe.joined_librivox) and its reference. Contenders (greedy, English, no timestamps):

    specdec default             `specdec transcribe` with the CLI's defaults (exact, the self draft, four 30 s windows
                                decoded together)
    specdec --no-encoder-int8   the same with the encoder's linears in the model's dtype (the default before
                                2026-11-29)
    specdec autoregressive b4   the target alone, batch 4
    specdec --target-int8 b4    the int8 target (decoder and output layer: models/int8.py) with its self draft, batch 4
    specdec --target-int8 autoregressive b4   the int8 target alone, batch 4
    fw int8 batched 4           faster-whisper's BatchedInferencePipeline, int8, batch 4 (its VAD chunking on, as
                                its defaults have it), beam 1
    fw int8                     faster-whisper's WhisperModel, int8, sequential, beam 1, no VAD

Each round runs every contender once (the start rotating); the best of the rounds counts; WER against the
reference (bench.metrics.wer), and the words each contender transcribed. Each tool runs in a worker process of its
own (serve), the rounds interleaved from here.

    .venv/bin/python benchmarks/longform.py --rounds 2 --out benchmarks/longform-5min.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

import torch

from specdec_cli.bench.machine import cpu_model, load_average
from specdec_cli.bench.metrics import wer
from specdec_cli.options import TranscribeOptions
from specdec_cli.tasks import transcribe as task


def specdec_contenders(audio) -> dict:
    """specdec's contenders, models loaded once (load excluded from the times)."""
    opts = TranscribeOptions()
    target, draft = task.load_pair(opts, progress=False)
    target8, draft8 = task.load_pair(opts.replace(target_int8=True), progress=False)
    plain = task.load_pair(opts.replace(encoder_int8=False), progress=False)

    def specdec(int8=False, float_encoder=False, **overrides):
        t, d = (target8, draft8) if int8 else plain if float_encoder else (target, draft)

        def run() -> str:
            return task.transcribe(t, d if overrides.get("mode") != "autoregressive" else None, ["long"],
                                   opts, audios=[audio], **overrides)[0].text
        return run

    return {"specdec default": specdec(), "specdec --no-encoder-int8": specdec(float_encoder=True),
            "specdec autoregressive b4": specdec(mode="autoregressive", batch_size=4),
            "specdec --target-int8 b4": specdec(int8=True, batch_size=4),
            "specdec --target-int8 autoregressive b4": specdec(int8=True, mode="autoregressive", batch_size=4)}


def fw_contenders(audio) -> dict:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from specdec_cli.models.whisper_convert import ensure_ct2

    fw = WhisperModel(str(ensure_ct2("base")), device="cpu", compute_type="int8", cpu_threads=torch.get_num_threads())
    batched = BatchedInferencePipeline(fw)

    def fw_run(batch: int):
        def run() -> str:
            if batch > 1:
                segments, _ = batched.transcribe(audio, language="en", beam_size=1, batch_size=batch,
                                                 without_timestamps=True)
            else:
                segments, _ = fw.transcribe(audio, language="en", beam_size=1, temperature=0.0, without_timestamps=True,
                                            condition_on_previous_text=False, vad_filter=False)
            return " ".join(s.text.strip() for s in segments if s.text.strip())
        return run

    return {"fw int8 batched 4": fw_run(4), "fw int8": fw_run(1)}


def serve(kind: str, repeats: int, conn) -> None:
    """A worker process for one tool's contenders: sends their names once built and warm, then (seconds, text) for
    each name it is sent, until None. One process per tool: faster-whisper's thread pools, once they have run,
    slowed torch's decoding in the same process by ~25 % (int8 target, batch 4: 4.8 → 6.0 s), so the tools do not
    share one."""
    audio, _ = task.joined_librivox(repeats)
    contenders = (specdec_contenders if kind == "specdec" else fw_contenders)(audio)
    for run in contenders.values():  # warm: kernels built, caches filled
        run()
    conn.send(list(contenders))
    while (name := conn.recv()) is not None:
        t0 = time.perf_counter()
        text = contenders[name]()
        conn.send((time.perf_counter() - t0, text))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=12, help="the LibriVox clips joined this many times")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    joined = task.joined_librivox(args.repeats)
    if joined is None:
        print("needs Debian's pocketsphinx-testdata (make data)")
        return 2
    audio, reference = joined
    threads = torch.get_num_threads()
    print(f"# {cpu_model()}, {threads} threads; {len(audio) / 16000:.0f} s of audio", flush=True)

    ctx = multiprocessing.get_context("spawn")
    workers, owner = {}, {}
    for kind in ("specdec", "fw"):  # one at a time: loading and warming are not timed, but they share the cores
        here, there = ctx.Pipe()
        proc = ctx.Process(target=serve, args=(kind, args.repeats, there), daemon=True)
        proc.start()
        workers[kind] = (proc, here)
        owner.update(dict.fromkeys(here.recv(), kind))
    names = list(owner)
    times: dict[str, list[float]] = {n: [] for n in names}
    texts: dict[str, str] = {}
    loads = []
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            conn = workers[owner[name]][1]
            conn.send(name)
            seconds, texts[name] = conn.recv()
            times[name].append(seconds)
        loads.append(load_average())
        print(f"round {r + 1}: " + "; ".join(f"{n} {times[n][-1]:.2f} s" for n in names), flush=True)
    for proc, conn in workers.values():
        conn.send(None)
        proc.join()
    ref_words = len(reference.split())
    print(f"\n{cpu_model()}, {threads} threads, load {min(loads):.1f}–{max(loads):.1f}, best of {args.rounds}; "
          f"{len(audio) / 16000:.0f} s, {ref_words} reference words\n")
    print("| contender | end to end s (best) | words | WER |\n|---|---:|---:|---:|")
    for n in names:
        print(f"| {n} | {min(times[n]):.2f} | {len(texts[n].split())} | {wer(texts[n], reference):.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "cpu": cpu_model(), "threads": threads, "audio_s": len(audio) / 16000, "reference_words": ref_words,
            "load_average": [min(loads), max(loads)], "seconds": times, "texts": texts,
            "wer": {n: wer(texts[n], reference) for n in names}, "command": " ".join(sys.argv)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
