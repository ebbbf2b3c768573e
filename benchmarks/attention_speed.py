"""kernels/rows_attention per call: this tree's build against the build of an earlier revision, side by side, at the
shapes specdec runs (Whisper base's cross- and self-attention, Qwen2.5 1.5B's and 0.5B's GQA layers), 1–11 rows,
K/V read from memory (the call rotates over copies: a step's layers do not share them) — and whether both builds
give the same bits.

    .venv/bin/python benchmarks/attention_speed.py --before 9610877 --json benchmarks/attention-rows-groups.json

Medians over rounds that alternate the builds; µs per call; all torch threads (the CLI's default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from specdec_cli.bench.machine import cpu_model
from specdec_cli.kernels import cpp, rows_attention

# name -> (B, H, KVH, D, S, causal)
SHAPES = {
    "whisper-cross": (1, 8, 8, 64, 1500, False),
    "whisper-cross-b4": (4, 8, 8, 64, 1500, False),
    "whisper-self": (1, 8, 8, 64, 120, True),
    "qwen-1.5b": (1, 12, 2, 128, 700, True),
    "qwen-0.5b": (1, 14, 2, 64, 700, True),
}


def build_at(revision: str):
    """rows_attention.cpp as it was at `revision`, with the headers it includes then, built like this tree's kernel."""
    def show(name: str) -> str:
        return subprocess.run(["git", "show", f"{revision}:kernels/{name}"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parent.parent).stdout

    folder = Path(tempfile.mkdtemp())
    path = folder / f"rows_attention_{revision}.cpp"
    path.write_text(show("rows_attention.cpp"))
    todo = [path]
    while todo:
        for name in cpp.includes(todo.pop().read_text()):
            if not (folder / name).exists():
                (folder / name).write_text(show(name))
                todo.append(folder / name)
    kernel = cpp.Extension(f"rows_attention_{revision}", path, ["-O3", "-march=native", "-ffp-contract=off",
                                                               "-std=c++17"], "")
    module = kernel.module()
    if module is None:
        raise SystemExit(f"the kernel at {revision} did not build: {kernel.error}")
    return module.attend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the git revision to compare with")
    ap.add_argument("--rows", default="1,2,5,11")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--megabytes", type=int, default=128, help="K/V copies rotated over (read from memory)")
    ap.add_argument("--json")
    args = ap.parse_args()
    now = rows_attention.KERNEL.module()
    if now is None:
        raise SystemExit(f"this tree's kernel did not build: {rows_attention.KERNEL.error}")
    builds = {"before": build_at(args.before), "now": now.attend}
    g = torch.Generator().manual_seed(0)
    results = []
    print(f"{cpu_model()}, {torch.get_num_threads()} threads; µs per call, K/V from memory")
    for name, (B, H, KVH, D, S, causal) in SHAPES.items():
        bytes_kv = 2 * B * KVH * S * D * 2  # bf16 K and V
        copies = max(2, args.megabytes * 2**20 // bytes_kv)
        kv = [(torch.randn(B, KVH, S, D, generator=g).bfloat16(), torch.randn(B, KVH, S, D, generator=g).bfloat16())
              for _ in range(copies)]
        for T in (int(t) for t in args.rows.split(",")):
            q = torch.randn(B, H, T, D, generator=g).bfloat16()
            same = all(torch.equal(builds["before"](q, k, v, None, D**-0.5, causal), now.attend(q, k, v, None, D**-0.5,
                                                                                                  causal))
                       for k, v in kv[:3])
            times = {b: [] for b in builds}
            for r in range(args.rounds):
                for b in (list(builds) if r % 2 == 0 else list(builds)[::-1]):
                    t0 = time.perf_counter()
                    for k, v in kv:
                        builds[b](q, k, v, None, D**-0.5, causal)
                    times[b].append((time.perf_counter() - t0) / len(kv) * 1e6)
            us = {b: statistics.median(t) for b, t in times.items()}
            results.append({"shape": name, "B": B, "H": H, "KVH": KVH, "D": D, "S": S, "causal": causal, "rows": T,
                            "before_us": us["before"], "now_us": us["now"], "same_bits": same})
            print(f"{name:16s} rows {T:2d}: before {us['before']:7.1f}  now {us['now']:7.1f}  "
                  f"({us['before'] / us['now']:.2f}×)  same bits: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": cpu_model(), "threads": torch.get_num_threads(),
                                               "before": args.before, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
