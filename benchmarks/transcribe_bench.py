"""Whisper transcription speed on this machine, every contender in ONE run, interleaved input by input so
that machine noise hits them alike (a shared 2-core CPU is noisy: compare only figures taken side by side).

Input sets:
    short   the five LibriVox clips of pocketsphinx-testdata (3–7 s, one window each)
    long    those clips joined three times (74 s, three windows cut in pauses by audio.windows)
    news    (--espeak) the start of each example article read by espeak-ng: a richer vocabulary

Contenders (greedy, so every contender must print the autoregressive transcript: checked and reported):
    autoregressive               the target alone
    self N=… τ=… γ=…             the self draft (drafts/lean_whisper.LeanDraft): every decoder layer of the target, int8
                                 weights (the CLI's draft has int4 layers since the twentieth session), its output layer cut to ids [0, N) + EOT; a round's drafting ends after
                                 a token it gave less than τ (--draft-stop; τ = 0: always γ tokens); the target
                                 (ExactScorer) scores the round's tokens + 1 in one pass
    self … bf16                  the same draft with the target's bf16 weights (--no-draft-quantized): what int8 saves
    self:K …                     the first K layers (+ reduced output layer): what cutting layers costs

Also: each draft's per-token agreement with the target's greedy token under teacher forcing (what greedy
verification accepts, free of γ and of end-of-text effects), for the first K layers and each N (int8), and for
every layer in bf16.

Times per contender and set: encoder = log-mel features + encoder + cross-attention K/V + the language /
no-speech probe (once per window, the same for every contender: taken from the autoregressive runs; the
others reuse its encoder output); decoder = the decoding loops, prefill included, as wall time and as this
process's CPU time (steadier on a shared machine: time spent waiting for a core is not counted). The
speedup of a contender is Σ autoregressive / Σ contender over the set, per pass; the median over passes.

    .venv/bin/python benchmarks/transcribe_bench.py --espeak --out benchmarks/transcribe-cpu.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from specdec_cli.bench.machine import cpu_model
from specdec_cli.bench.metrics import wer
from specdec_cli.decoding import SamplingParams, generate
from specdec_cli.drafts import lean_whisper
from specdec_cli.models import LoadedModel
from specdec_cli.models.whisper import decoder_layers, load_whisper, prompt_ids, special_ids
from specdec_cli.models.whisper_decoding import WindowDecoder, cross_kv
from specdec_cli.options import TranscribeOptions
from specdec_cli.tasks import transcribe as T
from specdec_cli.tasks.audio import librivox_clips, load_audio, windows
from specdec_cli.tasks.whisper_rules import Suppressor

GREEDY = SamplingParams(temperature=0.0)
DEFAULTS = TranscribeOptions()
DEFAULT_GRID = "8192:0.8:8,16384:0:8,16384:0.5:8,16384:0.8:6,16384:0.8:8,16384:0.8:10,16384:0.8:12,16384:0.9:8,32768:0.8:8"


def espeak_articles(out: Path, chars: int = 600) -> list[str]:
    """examples/articles/*.txt (their first `chars` characters) spoken by espeak-ng into `out`."""
    if not shutil.which("espeak-ng"):
        sys.exit("--espeak needs espeak-ng (apt-get install espeak-ng)")
    paths = []
    root = Path(__file__).resolve().parent.parent / "examples" / "articles"
    for article in sorted(p for p in root.glob("*.txt") if not p.name.endswith(".ref.txt")):
        text = " ".join(article.read_text(encoding="utf-8")[:chars].split())
        wav = out / f"{article.stem}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(wav), text], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        paths.append(str(wav))
    return paths


def agreement(target: LoadedModel, audios, head_sizes) -> list[dict]:
    """Teacher-forced agreement of each self draft (first K layers, output layer over N, int8; and every layer
    in bf16) with the target's greedy token: the draft reads the autoregressive transcript in one pass.
    audios: ≤ 30 s each."""
    whisper = target.model
    ids = special_ids(target)
    prompt = prompt_ids(ids, "en", "transcribe")
    P = len(prompt) - 1
    n_layers = len(decoder_layers(target))
    hook = Suppressor(target, len(prompt), target.output_size)
    cases = []  # (cross K/V, the tokens read [1, L], their positions, the target's greedy tokens [L − P])
    with torch.inference_mode():
        for audio in audios:
            enc = T.encode(target, T.features(target, [audio]))
            kv = cross_kv(decoder_layers(target), enc)
            res = generate(WindowDecoder(whisper, enc, kv, hook), None, torch.tensor([prompt]), mode="autoregressive",
                           params=GREEDY, max_new_tokens=200, eos_token_ids=[ids.eot])
            seq = torch.tensor([prompt + res.tokens[0][:-1]])
            cases.append((kv, seq, torch.arange(seq.shape[1])[None], torch.tensor(res.tokens[0])))
        out = []
        for layers, n, int8 in ([(k, n, True) for k in range(1, n_layers + 1) for n in head_sizes]
                                + [(n_layers, n, False) for n in head_sizes]):
            lean, agree = lean_whisper.self_draft(target, f"self:{layers}", n, "int8" if int8 else None), 0
            for kv, seq, positions, want in cases:
                d = lean.lean.window(kv, hook)
                d.prefill(seq[:, :P], None, positions[:, :P])
                logits = hook(d._call(seq[:, P:], None, positions[:, P:], 0), positions[:, P:] + 1)[0]  # [L − P, V]
                agree += int((logits.argmax(-1) == want).sum())
            total = sum(len(c[3]) for c in cases)
            out.append({"layers": layers, "head_size": n or target.output_size, "int8": int8,
                        "agreement": round(agree / total, 4), "tokens": total})
    return out


class Timers:
    """CPU time (this process) of the decoding loops and of the encoder, by wrapping transcribe's calls; the
    encoder output is memoised for every contender but autoregressive (it is the same for all)."""

    def __init__(self):
        self.decoder_cpu = 0.0
        self.memo: dict = {}
        self.memo_on = False
        real_generate, real_encode = T.generate, T.encode

        def timed_generate(*a, **k):
            t = time.process_time()
            try:
                return real_generate(*a, **k)
            finally:
                self.decoder_cpu += time.process_time() - t

        def memo_encode(model, feats):
            if not self.memo_on:
                return real_encode(model, feats)
            key = (id(model), hashlib.sha1(feats.float().numpy().tobytes()).hexdigest())
            if key not in self.memo:
                self.memo[key] = real_encode(model, feats)
            return self.memo[key]

        T.generate, T.encode = timed_generate, memo_encode


def run_one(timers: Timers, target, draft, audio, gamma, mode, stop) -> dict:
    timers.decoder_cpu = 0.0
    timers.memo_on = mode != "autoregressive"
    out = T.transcribe(target, draft, ["x"], audios=[audio], mode=mode, gamma=gamma, draft_stop=stop,
                       batch_size=1)[0]  # a window at a time, as this script always measured
    s = out.stats
    return {"text": out.text, "decoder_s": s.decoder_s, "decoder_cpu_s": timers.decoder_cpu,
            "encoder_s": s.features_s + s.encoder_s + s.cross_kv_s + s.probe_s, "new_tokens": s.new_tokens,
            "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
            "target_calls": s.target_calls, "draft_calls": s.draft_calls, "draft_s": s.draft_s, "target_s": s.target_s,
            "verify_s": s.verify_s, "prefill_s": s.prefill_s}


def parse_grid(text: str) -> list[tuple[int, float, int]]:
    out = []
    for cell in text.split(","):
        if cell:
            n, tau, g = cell.split(":")
            out.append((int(n), float(tau), int(g)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved passes over every contender")
    ap.add_argument("--grid", default=DEFAULT_GRID, help="self-draft contenders N:τ:γ, comma-separated")
    ap.add_argument("--bf16", default="16384:0.8:8", help="N:τ:γ of self drafts also run with bf16 weights (no int8)")
    ap.add_argument("--cut-layers", default="5", help="self:K drafts (first K layers) timed on the short clips")
    ap.add_argument("--long-repeats", type=int, default=3, help="LibriVox clips joined this many times")
    ap.add_argument("--espeak", action="store_true", help="add the 'news' set: the start (600 characters) of each "
                    "example article read by espeak-ng")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    clips = librivox_clips()
    if not clips:
        sys.exit("needs Debian's pocketsphinx-testdata (the LibriVox clips)")
    target = load_whisper(args.target, dtype=args.dtype, device="cpu", progress=False)
    n_layers = len(decoder_layers(target))
    refs = [r for _, r in clips]
    long_audio, long_ref = T.joined_librivox(args.long_repeats)
    sets = {"short": [load_audio(w) for w, _ in clips], "long": [long_audio]}
    if args.espeak:
        sets["news"] = [load_audio(p) for p in espeak_articles(Path(tempfile.mkdtemp(prefix="specdec-espeak-")))]
    grid = parse_grid(args.grid)

    print("agreement (teacher forcing) ...", file=sys.stderr, flush=True)
    agree = agreement(target, sets["short"] + [w.audio for a in sets.get("news", []) for w in windows(a)],
                      sorted({n for n, _, _ in grid}))

    drafts = {}  # (N, layers, int8) -> the draft, built once

    def self_draft(n, layers=None, int8=True):
        key = (n, layers, int8)
        if key not in drafts:
            spec = "self" if layers is None else "self:" + ",".join(map(str, layers))
            drafts[key] = lean_whisper.self_draft(target, spec, n, "int8" if int8 else None)
        return drafts[key]

    # name -> (draft, γ, mode, sets, τ)
    contenders = {"autoregressive": (None, 0, "autoregressive", list(sets), 0.0)}
    for n, tau, g in grid:
        contenders[f"self N={n} τ={tau:g} γ={g}"] = (self_draft(n), g, "exact", list(sets), tau)
    for n, tau, g in parse_grid(args.bf16):
        contenders[f"self N={n} τ={tau:g} γ={g} bf16"] = (self_draft(n, int8=False), g, "exact", list(sets), tau)
    for k in [int(x) for x in args.cut_layers.split(",") if x]:
        if 1 <= k < n_layers:
            n, tau, g = DEFAULTS.draft_vocab, DEFAULTS.draft_stop, DEFAULTS.gamma
            contenders[f"self:{k} N={n} τ={tau:g} γ={g}"] = (self_draft(n, range(k)), g, "exact", ["short"], tau)

    timers = Timers()
    names = list(contenders)
    runs = {c: {s: [[None] * len(sets[s]) for _ in range(args.repeat)] for s in contenders[c][3]} for c in names}
    for rep in range(args.repeat):
        for s, audios in sets.items():
            for i, audio in enumerate(audios):
                shift = (rep * 7 + i) % len(names)  # rotate: no contender always first or last
                print(f"pass {rep + 1}/{args.repeat}: {s} {i + 1}/{len(audios)}", file=sys.stderr, flush=True)
                for c in ["autoregressive"] + [x for x in names[shift:] + names[:shift] if x != "autoregressive"]:
                    draft, g, mode, where, tau = contenders[c]
                    if s in where:
                        runs[c][s][rep][i] = run_one(timers, target, draft, audio, g, mode, tau)

    ar = runs["autoregressive"]
    results = []
    for c in names:
        row = {"contender": c, "gamma": contenders[c][1]}
        for s in contenders[c][3]:
            passes = runs[c][s]

            def tot(key, p):
                return sum(r[key] for r in p)

            med = {k: statistics.median(tot(k, p) for p in passes)
                   for k in ("decoder_s", "decoder_cpu_s", "encoder_s", "draft_s", "target_s", "verify_s", "prefill_s")}
            first = passes[0]
            new, drafted, acc = tot("new_tokens", first), tot("draft_tokens", first), tot("accepted_tokens", first)
            same = all([r["text"] for r in p] == [r["text"] for r in ar[s][0]] for p in passes)
            texts = [r["text"] for r in first]
            row[s] = {
                **{k: round(v, 4) for k, v in med.items()},
                "encoder_s": round(statistics.median(tot("encoder_s", p) for p in ar[s]), 4),
                "decoder_s_per_pass": [round(tot("decoder_s", p), 3) for p in passes],
                "new_tokens": new,
                "decoder_ms_per_token": round(1e3 * med["decoder_s"] / new, 2),
                # where the time goes: a draft step that ran the layers, a target call (γ+1 tokens or one)
                "draft_ms_per_step": (round(1e3 * med["draft_s"] / tot("draft_calls", first), 2)
                                      if tot("draft_calls", first) else None),
                "target_ms_per_call": round(1e3 * med["target_s"] / tot("target_calls", first), 2),
                "decoder_cpu_ms_per_token": round(1e3 * med["decoder_cpu_s"] / new, 2),
                "acceptance_rate": round(acc / drafted, 4) if drafted else None,
                "draft_tokens": drafted,
                "target_calls": tot("target_calls", first), "draft_calls": tot("draft_calls", first),
                "decoder_speedup": round(statistics.median(tot("decoder_s", a) / tot("decoder_s", p)
                                                           for a, p in zip(ar[s], passes)), 3),
                "decoder_cpu_speedup": round(statistics.median(tot("decoder_cpu_s", a) / tot("decoder_cpu_s", p)
                                                               for a, p in zip(ar[s], passes)), 3),
                "same_text_as_autoregressive": same,
                "wer": (round(wer(texts, refs), 4) if s == "short" else round(wer(texts, [long_ref]), 4)
                        if s == "long" else None),
            }
        results.append(row)

    fused = [r for r in results if r["contender"].startswith("self N=") and "bf16" not in r["contender"]]
    best = max(fused, key=lambda r: sum(r[s]["decoder_cpu_speedup"] for s in sets)) if fused else None
    report = {
        "what": "specdec transcribe: Whisper decoder time, autoregressive vs exact (self draft), greedy",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=Path(__file__).resolve().parent).stdout.strip() or None,
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": args.threads,
                    "torch": torch.__version__, "python": platform.python_version(),
                    "load_average_at_end": os.getloadavg()},
        "target": target.name, "dtype": args.dtype, "decoder_layers": n_layers,
        "inputs": {"short": [str(w) for w, _ in clips],
                   "long": f"the {len(clips)} LibriVox clips joined {args.long_repeats} times "
                           f"({len(long_audio) / 16000:.1f} s)",
                   "news": "examples/articles/*.txt (first 600 characters) read by espeak-ng" if args.espeak else None,
                   "seconds": {s: round(sum(len(a) for a in v) / 16000, 1) for s, v in sets.items()}},
        "defaults": {"draft": "self (LeanDraft: every decoder layer of the target, int8)", "int8": DEFAULTS.draft_quantized,
                     "head_size": DEFAULTS.draft_vocab, "draft_stop": DEFAULTS.draft_stop, "gamma": DEFAULTS.gamma},
        "agreement": agree,
        "results": results,
        "best_by_cpu_time": None if best is None else {"contender": best["contender"],
                                                       **{s: best[s]["decoder_cpu_speedup"] for s in sets}},
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(summary(report))


def summary(report: dict) -> str:
    m = report["machine"]
    lines = [f"{m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch thread(s), {report['dtype']}; "
             f"decoder time, × = autoregressive / contender (wall | CPU), acc = acceptance rate"]
    sets = [s for s in ("short", "long", "news") if s in report["results"][0]]
    lines.append(f"{'contender':30}" + "".join(f" | {s + ' dec s':>11} {'×wall':>5} {'×cpu':>5} {'acc':>4}" for s in sets)
                 + " | same | ms/draft step, ms/target call (long)")
    for r in report["results"]:
        cells = ""
        for s in sets:
            if s not in r:
                cells += f" | {'':>11} {'':>5} {'':>5} {'':>4}"
                continue
            x = r[s]
            acc = "-" if x["acceptance_rate"] is None else f"{x['acceptance_rate']:.2f}"
            cells += f" | {x['decoder_s']:11.2f} {x['decoder_speedup']:5.2f} {x['decoder_cpu_speedup']:5.2f} {acc:>4}"
        same = all(r[s]["same_text_as_autoregressive"] for s in sets if s in r)
        x = r.get("long") or r["short"]
        lines.append(f"{r['contender']:30}{cells} | {same!s:4} | {x['draft_ms_per_step'] or 0:.1f}, {x['target_ms_per_call']:.1f}")
    ar = report["results"][0]
    lines.append("encoder s (once per window, every contender): " + ", ".join(f"{s} {ar[s]['encoder_s']:.2f}" for s in sets))
    lines.append(f"agreement with the target's greedy token (teacher forcing, {report['agreement'][0]['tokens']} tokens "
                 "of the short clips and the news):")
    by_k: dict[int, list[str]] = {}
    for a in report["agreement"]:
        by_k.setdefault(a["layers"], []).append(f"N={a['head_size']}{'' if a['int8'] else ' bf16'}: {a['agreement']:.3f}")
    for k, cells in by_k.items():
        lines.append(f"  first {k} layers: " + ", ".join(cells))
    if report["best_by_cpu_time"]:
        lines.append(f"best (CPU time): {report['best_by_cpu_time']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
