"""Compile the verification kernels for a GPU architecture, on a machine without one.

Triton compiles ahead of time for a target it is told (`triton.compile(ASTSource(...), target=GPUTarget(...))`,
ptxas from the Triton wheel), so compile errors, unsupported ops, register pressure and spills show in CI.
Every plan the launcher (exact.launch) can choose is compiled: each logits dtype, a model draft and a
deterministic one (exact: ONE_HOT), and each (GAMMA_P2, SPLITS_P2, BLOCK) that exact._plan gives for V ∈ {32 000, 51 865, 151 936, 262 144}, B ∈ {1, 8, 64} and
γ ∈ {1, 5, 10, 20, 32} on that GPU's SM count.

The kernels must be decorated with TRITON_INTERPRET unset, which specdec_cli does not do on a machine without
CUDA, so this runs in its own process (bench/kernel_check.compile_for starts it):

    TRITON_INTERPRET=0 python -m specdec_cli.kernels.compile sm_90 exact      # one JSON line per kernel
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor

ARCHS = {"sm_80": (80, 108), "sm_90": (90, 132)}  # capability, SMs (A100, H100)
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
GRID = {"V": (32000, 51865, 151936, 262144), "B": (1, 8, 64), "gamma": (1, 5, 10, 20, 32)}


def plans(arch: str, mode: str) -> list[dict]:
    """Every (kernel, dtype, constexprs) the launcher can choose on `arch` for the GRID, without repeats."""
    import triton

    from specdec_cli.kernels.exact import MAX_REGISTERS, _plan, _warps

    sms = ARCHS[arch][1]
    shapes = set()
    for V in GRID["V"]:
        for B in GRID["B"]:
            for gamma in GRID["gamma"]:
                block, splits, _ = _plan(V, B, None, False, sms=sms)
                shapes.add((triton.next_power_of_2(gamma + 1), triton.next_power_of_2(splits), block))
    out = []
    for dtype in DTYPES:
        if mode == "exact":
            out += [{"kernel": "_row_stats_kernel", "dtype": dtype, "constexprs": {"BLOCK": b}, "num_warps": 4}
                    for b in sorted({b for _, _, b in shapes})]
        out += [{"kernel": "_accept_draw_kernel", "dtype": dtype,
                 "constexprs": {"GAMMA_P2": g, "SPLITS_P2": s, "BLOCK": b, "SIGMOID": mode == "sigmoid",
                                "ONE_HOT": one_hot}, "num_warps": _warps(g, s), "maxnreg": MAX_REGISTERS}
                for one_hot in ((False, True) if mode == "exact" else (False,)) for g, s, b in sorted(shapes)]
    return out


def signature(kernel: str, dtype: str, sigmoid: bool, one_hot: bool = False) -> dict[str, str]:
    """Triton's types of every argument, as exact.launch passes them (sizes and strides fit 32 bits on the
    GRID; the constexprs are named, not typed)."""
    z = f"*{DTYPES[dtype]}"
    q = z if sigmoid else "*i64" if one_hot else "*fp32"  # the draft's logits, its probabilities, or (unread) tokens
    strides = {f"stride_{k}": "i32" for k in ("tb", "tc", "qb", "qc", "zb", "zc", "ub", "uc")}
    scalars = {"inv_t": "fp32", "alpha": "fp32", "beta": "fp32"}
    sizes = {"gamma": "i32", "V": "i32", "chunk": "i32", "SPLITS": "i32"}
    if kernel == "_row_stats_kernel":
        return {"logits_ptr": z, "max_ptr": "*fp32", "sum_ptr": "*fp32", "bad_ptr": "*i32", **sizes,
                "stride_zb": "i32", "stride_zc": "i32", "inv_t": "fp32", "BLOCK": "constexpr"}
    meta = {"GAMMA_P2": "constexpr", "SPLITS_P2": "constexpr", "BLOCK": "constexpr", "SIGMOID": "constexpr",
            "ONE_HOT": "constexpr"}
    pointers = {"tokens_ptr": "*i64", "draft_ptr": q, "logits_ptr": z, "u_ptr": "*fp32", "max_ptr": "*fp32",
                "sum_ptr": "*fp32", "row_bad_ptr": "*i32", "wsum_ptr": "*fp64", "psum_ptr": "*fp64",
                "draw_bad_ptr": "*i32", "count_ptr": "*i32", "counts_ptr": "*i64", "out_ptr": "*i64"}
    return {**pointers, **sizes, **strides, **scalars, **meta}


def compile_one(job: tuple[str, dict]) -> dict:
    """Compile one plan for `arch`; what the compiler reports (registers, spills, shared memory) or its error."""
    arch, plan = job
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from specdec_cli.kernels import exact

    fn = getattr(exact, plan["kernel"])
    sigmoid, one_hot = plan["constexprs"].get("SIGMOID", False), plan["constexprs"].get("ONE_HOT", False)
    start = time.perf_counter()
    report = {**plan, "arch": arch}
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):  # ptxas -v, printed by Triton with TRITON_DUMP_PTXAS_LOG=1
            src = ASTSource(fn=fn, signature=signature(plan["kernel"], plan["dtype"], sigmoid, one_hot),
                            constexprs=plan["constexprs"])
            compiled = triton.compile(src, target=GPUTarget("cuda", ARCHS[arch][0], 32),
                                      options={"num_warps": plan["num_warps"], "maxnreg": plan.get("maxnreg")})
        text = log.getvalue()
        regs = re.findall(r"Used (\d+) registers", text)
        spill_st = re.findall(r"(\d+) bytes spill stores", text)
        spill_ld = re.findall(r"(\d+) bytes spill loads", text)
        report.update(ok=True, registers=int(regs[-1]) if regs else None,
                      spill_bytes=int(spill_st[-1]) + int(spill_ld[-1]) if spill_st and spill_ld else None,
                      shared_bytes=getattr(compiled.metadata, "shared", None), cubin_bytes=len(compiled.asm["cubin"]))
    except Exception as e:
        report.update(ok=False, error=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
    report["seconds"] = round(time.perf_counter() - start, 2)
    return report


def main(argv: list[str]) -> int:
    arch, mode = argv
    if os.environ.get("TRITON_INTERPRET") not in (None, "0"):
        raise SystemExit("run with TRITON_INTERPRET=0: interpreted kernels cannot be compiled")
    jobs = [(arch, plan) for plan in plans(arch, mode)]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        for report in pool.map(compile_one, jobs):
            print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
