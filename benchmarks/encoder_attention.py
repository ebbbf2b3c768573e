"""A Whisper encoder's self-attention on a CPU: torch's sdpa (flash attention for CPU) against
kernels/frames_attention, one layer's call ([1, H, 1 500, 64]: every frame against every frame), in the model's
dtype, interleaved rounds, medians; each result's relative L2 error against fp64.

    .venv/bin/python benchmarks/encoder_attention.py --heads 8,12 --json benchmarks/encoder-attention-zen5-s16.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from specdec_cli.bench.machine import cpu_model
from specdec_cli.kernels import frames_attention as fa

HEAD = 64  # every Whisper size's
SCALE = HEAD ** -0.5


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="8,12", help="heads of the layer (Whisper base 8, small 12, medium 16)")
    ap.add_argument("--frames", type=int, default=1500)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if fa.KERNEL.module() is None:
        print(f"frames_attention did not build: {fa.KERNEL.error}", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    out = {"machine": cpu_model(), "threads": torch.get_num_threads(), "dtype": args.dtype, "frames": args.frames,
           "path": "avx512" if fa.KERNEL.module().best_path() == fa.PATHS["avx512"] else "portable", "rows": []}
    print(f"# {out['machine']}, {out['threads']} threads, {args.dtype}, {args.frames} frames, kernel path {out['path']}")
    print("| heads | sdpa ms | frames_attention ms | × | sdpa rel. error | frames_attention rel. error |")
    print("|---:|---:|---:|---:|---:|---:|")
    for H in (int(h) for h in args.heads.split(",")):
        g = torch.Generator().manual_seed(H)
        q, k, v = (torch.randn(1, H, args.frames, HEAD, generator=g).to(dtype) for _ in range(3))
        fns = {"sdpa": lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, scale=SCALE).transpose(1, 2),
               "frames": lambda q=q, k=k, v=v: fa.attend(q, k, v, SCALE, path=out["path"])}
        ref, _ = fa.reference(q, k, v, SCALE)
        err = {n: float((f().double() - ref).norm() / ref.norm()) for n, f in fns.items()}
        times: dict[str, list[float]] = {n: [] for n in fns}
        for r in range(args.rounds):
            for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                t = time.perf_counter()
                fns[n]()
                times[n].append(time.perf_counter() - t)
        ms = {n: statistics.median(t) * 1e3 for n, t in times.items()}
        print(f"| {H} | {ms['sdpa']:.1f} | {ms['frames']:.1f} | {ms['sdpa'] / ms['frames']:.2f} | {err['sdpa']:.1e} | "
              f"{err['frames']:.1e} |")
        out["rows"].append({"heads": H, "ms": ms, "rel_error": err})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
