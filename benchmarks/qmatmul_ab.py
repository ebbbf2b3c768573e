"""Two versions of the GGUF-block matmul side by side: this checkout's kernels/qmatmul.py against another checkout's
(`git worktree add ../old <commit>`), interleaved A B B A per round, at the embedded target's shapes, per rows M of a
call. Each rotates over copies of its weight that exceed the last-level cache, so a call reads from memory as a
model's layer does. Prints ms per call (medians) and old / new.

    git worktree add /tmp/old c9a6634
    .venv/bin/python benchmarks/qmatmul_ab.py --old /tmp/old/kernels/qmatmul.py
    .venv/bin/python benchmarks/qmatmul_ab.py --old /tmp/old/kernels/qmatmul.py --path avx2 --shapes gate_up,down
    .venv/bin/python benchmarks/qmatmul_ab.py --old /tmp/old/kernels/qmatmul.py --kernel prompt --rows 501 --dtype float32
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch

from specdec_cli.bench.machine import cpu_model
from specdec_cli.kernels import gguf_blocks as gb
from specdec_cli.kernels import qmatmul as new

SHAPES = {"q_o": (1536, 1536), "gate_up": (8960, 1536), "down": (1536, 8960),  # (N, K), as qmatmul_speed.py
          "enc_qkvo": (512, 512), "enc_fc1": (2048, 512), "enc_fc2": (512, 2048)}  # Whisper base's encoder



def load(path: str):
    spec = importlib.util.spec_from_file_location("qmatmul_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # builds its own extension: its source hash is its cache key
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the other checkout's kernels/qmatmul.py")
    ap.add_argument("--types", default="q4_k,q6_k")
    ap.add_argument("--shapes", default="q_o,gate_up,down", help=f"of {', '.join(SHAPES)}")
    ap.add_argument("--rows", default="1,2,5,9")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=0, help="default: torch's (all cores)")
    ap.add_argument("--path", default=None, help="portable|avx2|avx512 (default: the best this CPU has)")
    ap.add_argument("--cache-mb", type=int, default=100)
    ap.add_argument("--kernel", default="step", help="step (gguf_mm: a step's or a pass's rows) or prompt (prompt_mm)")
    ap.add_argument("--dtype", default="bfloat16", help="x's: bfloat16 (AVX-512 machines) or float32 (AVX2 ones)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    old = load(args.old)
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads; new: {new.backend_line()}; path {args.path or 'auto'}")
    print("| type | shape | " + " | ".join(f"M = {m}: old → new ms (×)" for m in args.rows.split(",")) + " |")
    print("|---|---|" + "---:|" * len(args.rows.split(",")))
    for name in args.types.split(","):
        for shape in args.shapes.split(","):
            N, K = SHAPES[shape]
            one = N * gb.row_bytes(name, K)
            copies = [gb.random_blocks(name, N, K, seed=i) for i in range(max(2, -(-args.cache_mb * 2**20 // one)))]
            cells = []
            for M in map(int, args.rows.split(",")):
                x = torch.randn(M, K, dtype=getattr(torch, args.dtype))
                times: dict[str, list[float]] = {"old": [], "new": []}
                for r in range(args.rounds):
                    order = (("old", old), ("new", new)) if r % 2 else (("new", new), ("old", old))
                    for label, module in order:
                        t0 = time.perf_counter()
                        for b in copies:
                            if args.kernel == "prompt":
                                module.prompt_mm(x, b, name, N, K)
                            else:
                                module.gguf_mm(x, b, name, N, K, path=args.path)
                        times[label].append((time.perf_counter() - t0) / len(copies))
                o, n = statistics.median(times["old"]), statistics.median(times["new"])
                cells.append(f"{o * 1e3:.3f} → {n * 1e3:.3f} ({o / n:.2f}×)")
            print(f"| {name} | {shape} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
