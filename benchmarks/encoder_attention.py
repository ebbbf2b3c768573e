"""Many queries' attention on a CPU: torch's sdpa (flash attention for CPU) against kernels/frames_attention, in the
model's dtype, interleaved rounds, medians; each result's relative L2 error against fp64. Shapes: a Whisper encoder
layer's call ([1, H, 1 500, 64]: every frame against every frame) for each --heads, and with --prompt a 501-token
prompt's layer of Qwen2.5 1.5B (12 query heads over 2 K/V heads, 128 wide, causal).

    .venv/bin/python benchmarks/encoder_attention.py --heads 8,12 --json benchmarks/encoder-attention-zen5-s16.json

An AVX2-only CPU on an AVX-512 one: --path avx2, with torch held to AVX2 as well (both read at start):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/encoder_attention.py \\
        --path avx2 --dtype float32 --prompt --json benchmarks/frames-attention-avx2-zen5-s18.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from specdec_cli.bench.machine import cpu_model
from specdec_cli.kernels import frames_attention as fa


def shapes(args) -> list[tuple[str, tuple[int, int, int, int, int], bool]]:
    """(label, (H, Hkv, T, S, D), causal) for each call measured."""
    out = [(f"encoder, {H} heads", (H, H, args.frames, args.frames, 64), False) for H in map(int, args.heads.split(","))]
    if args.prompt:
        out.append(("prompt, 12/2 heads", (12, 2, 501, 501, 128), True))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="8,12", help="heads of the layer (Whisper base 8, small 12, medium 16)")
    ap.add_argument("--frames", type=int, default=1500)
    ap.add_argument("--prompt", action="store_true", help="a 501-token prompt's layer of Qwen2.5 1.5B too")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--path", default="", choices=["", *fa.PATHS], help="the kernel's path (default: this CPU's best)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if fa.KERNEL.module() is None:
        print(f"frames_attention did not build: {fa.KERNEL.error}", file=sys.stderr)
        return 2
    best = {n: p for p, n in fa.PATHS.items()}[fa.KERNEL.module().best_path()]
    path = args.path or best
    if fa.PATHS[path] > fa.PATHS[best]:
        print(f"the {path} path does not run on this CPU (its best: {best})", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    out = {"machine": cpu_model(), "threads": torch.get_num_threads(), "dtype": args.dtype, "frames": args.frames,
           "path": path, "torch_capability": torch.backends.cpu.get_cpu_capability(),
           "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""), "rows": []}
    print(f"# {out['machine']}, {out['threads']} threads, {args.dtype}, kernel path {path}, torch's capability "
          f"{out['torch_capability']}")
    print("| call | sdpa ms | frames_attention ms | × | sdpa rel. error | frames_attention rel. error |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, (H, Hkv, T, S, D), causal in shapes(args):
        g = torch.Generator().manual_seed(H + S)
        q = torch.randn(1, H, T, D, generator=g).to(dtype)
        k, v = (torch.randn(1, Hkv, S, D, generator=g).to(dtype) for _ in range(2))
        kk, vv = (t.repeat_interleave(H // Hkv, 1) for t in (k, v))  # sdpa's heads: q's
        scale = D ** -0.5
        fns = {"sdpa": lambda q=q, k=kk, v=vv, c=causal, s=scale:
               F.scaled_dot_product_attention(q, k, v, is_causal=c, scale=s).transpose(1, 2),
               "frames": lambda q=q, k=k, v=v, c=causal, s=scale: fa.attend(q, k, v, s, c, path=path)}
        ref, _ = fa.reference(q, k, v, scale, causal)
        err = {n: float((f().double() - ref).norm() / ref.norm()) for n, f in fns.items()}
        times: dict[str, list[float]] = {n: [] for n in fns}
        for r in range(args.rounds):
            for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                t = time.perf_counter()
                fns[n]()
                times[n].append(time.perf_counter() - t)
        ms = {n: statistics.median(t) * 1e3 for n, t in times.items()}
        print(f"| {label} | {ms['sdpa']:.1f} | {ms['frames']:.1f} | {ms['sdpa'] / ms['frames']:.2f} | "
              f"{err['sdpa']:.1e} | {err['frames']:.1e} |")
        out["rows"].append({"call": label, "heads": H, "kv_heads": Hkv, "queries": T, "keys": S, "head_dim": D,
                            "causal": causal, "ms": ms, "rel_error": err})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
