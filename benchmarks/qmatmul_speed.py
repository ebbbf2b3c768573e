"""CPU matmuls for quantized weights at the shapes of the embedded target (Qwen2.5-Coder-1.5B), per number of rows
M of a call: ms per call (median over interleaved rounds) and each contender's ratio to bf16 F.linear measured
in the same rounds. The machine is shared: contenders run A B C A B C ..., starting each round one later.

    bf16        F.linear with bf16 weights (what specdec runs today)
    fp32        F.linear with fp32 weights and x (what runs where the CPU has no bf16 arithmetic: models/device.py)
    f32rows     specdec's fp32 linear (kernels/float_rows.py: each row computed alone, the weights read once a call)
    bf16rows    the same kernel on bf16 weights (widened to fp32 in registers: the bits of their fp32 copy), bf16 x
    bf16pair    what decoding/exact_rows.RowLinear runs for bf16 weights: F.linear, a lone row computed as two
    int8pack    torch._weight_int8pack_mm: int8 weights, one bf16 scale per output row
    int4pack    torch._weight_int4pack_mm_for_cpu: int4 weights, groups of 32 (Q4_K's sub-block), bf16 x
    fbgemm-i8   torch's dynamic int8 linear (fbgemm; activations quantized per call, fp32 in and out)
    i8rows      specdec's int8 linear (kernels/int8_rows.py: int8 per output row, each activation row quantized alone)
    ao-i8wo     torchao Int8WeightOnlyConfig (when torchao is installed)
    inductor-i8 / inductor-i4   torch.compile(mode="max-autotune") of int8pack / int4pack (--inductor: slow
                to compile, one compile per shape and M; the CPU GEMM templates for weight-only int8/int4)
    q4_k, q6_k, q8_0, q5_0, ...   specdec's GGUF-block matmul (kernels/qmatmul.py) on blocks of that type
    q4_k-prompt, q5_k-prompt, q6_k-prompt   its prompt kernel (qmatmul.prompt_mm, AVX-512 VNNI or AVX2): 16 weight
                rows unpacked and interleaved every call, then 64 products an instruction with a zmm's lanes 16
                outputs. The packing is most of a small call; time(M) − time(1) is what a row costs that way
    q4_k-packed, q5_k-packed, q6_k-packed   its kernel for steps and passes from weights packed once (qmatmul.pack /
                packed_mm, AVX-512 VNNI or AVX2): what GgufLinear runs there for calls of up to 33 rows
    q4_k-avx2, q4_k-packed-avx2, ...   the same on the AVX2 path (as on a CPU without AVX-512; before the AVX2
                packed kernel, an AVX2 CPU ran its steps from the blocks: q4_k-avx2)

Each contender rotates over copies of its weight that together exceed the last-level cache (--cache-mb), so a
call reads its weight from memory as a model's layer does, not from a warm cache.

    .venv/bin/python benchmarks/qmatmul_speed.py                       # every shape, M = 1 2 5 9 16 33
    .venv/bin/python benchmarks/qmatmul_speed.py --shapes gate_up --rows 1,9 --contenders bf16,q4_k --json out.json
    .venv/bin/python benchmarks/qmatmul_speed.py --shapes gate_up,down --rows 1,2,5,9,16 \
        --contenders bf16,q4_k,q4_k-prompt,q6_k,q6_k-prompt   # what a row costs each way
    .venv/bin/python benchmarks/qmatmul_speed.py --rows 1,2,5,9,17,33 \
        --contenders bf16,q4_k,q4_k-packed,q6_k,q6_k-packed   # steps and passes, unpacked and packed
    .venv/bin/python benchmarks/qmatmul_speed.py --rows 1,9,33 \
        --contenders bf16,q4_k-avx2,q4_k-packed-avx2,q4_k-packed,q6_k-avx2,q6_k-packed-avx2   # an AVX2 CPU's steps
    .venv/bin/python benchmarks/qmatmul_speed.py --shapes w_qkv,w_proj,w_fc1,w_fc2,w_output --rows 1,5,11 \
        --contenders bf16,fbgemm-i8,i8rows,q8_0      # Whisper base's decoder: transcribe --target-int8
    .venv/bin/python benchmarks/qmatmul_speed.py --shapes w_proj,w_fc1,w_fc2,w_output --rows 1,4,11,44 \
        --contenders fp32,f32rows,i8rows             # Whisper base's decoder in fp32: transcribe's default
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

# (N out, K in) of the embedded target's linear layers; q/o and k/v and gate/up share a shape
SHAPES = {"q_o": (1536, 1536), "k_v": (256, 1536), "gate_up": (8960, 1536), "down": (1536, 8960),
          "qkv": (2048, 1536), "gate_up_joint": (17920, 1536),  # as GgufLinear joins them (models/gguf_linear.join)
          "output": (151936, 1536)}
DEFAULT_SHAPES = ",".join(SHAPES)
# Whisper base's decoder (transcribe --target-int8): q, k, v joined (the self draft's), a 512 × 512 projection,
# fc1, fc2, the output layer
SHAPES.update({"w_qkv": (1536, 512), "w_proj": (512, 512), "w_fc1": (2048, 512), "w_fc2": (512, 2048),
               "w_output": (51865, 512), "w_head32k": (32768, 512)})  # the self draft's output layer: 32768 ids


def _copies(bytes_one: int, cache_mb: int) -> int:
    return max(1, -(-cache_mb * 2**20 // max(bytes_one, 1)))


def make_bf16(N, K, cache_mb):
    ws = [torch.randn(N, K, dtype=torch.bfloat16) * 0.02 for _ in range(_copies(N * K * 2, cache_mb))]
    return lambda x, i: F.linear(x, ws[i % len(ws)])


def make_fp32(N, K, cache_mb):
    ws = [torch.randn(N, K) * 0.02 for _ in range(_copies(N * K * 4, cache_mb))]
    return lambda x, i: F.linear(x.float(), ws[i % len(ws)])


def make_f32rows(N, K, cache_mb):
    from specdec_cli.kernels import float_rows

    ws = [torch.randn(N, K) * 0.02 for _ in range(_copies(N * K * 4, cache_mb))]
    return lambda x, i: float_rows.mm(x.float(), ws[i % len(ws)])


def make_bf16rows(N, K, cache_mb):
    from specdec_cli.kernels import float_rows

    ws = [torch.randn(N, K, dtype=torch.bfloat16) * 0.02 for _ in range(_copies(N * K * 2, cache_mb))]
    return lambda x, i: float_rows.mm(x, ws[i % len(ws)])


def make_bf16pair(N, K, cache_mb):
    ws = [torch.randn(N, K, dtype=torch.bfloat16) * 0.02 for _ in range(_copies(N * K * 2, cache_mb))]
    return lambda x, i: F.linear(torch.cat([x, x]) if x.shape[0] == 1 else x, ws[i % len(ws)])


def make_int8pack(N, K, cache_mb):
    ws = [(torch.randint(-127, 128, (N, K), dtype=torch.int8), torch.rand(N, dtype=torch.bfloat16) * 1e-3)
          for _ in range(_copies(N * K, cache_mb))]
    return lambda x, i: torch._weight_int8pack_mm(x, *ws[i % len(ws)])


def make_int4pack(N, K, cache_mb, group=32):
    def one():
        q = torch.randint(0, 16, (N, K), dtype=torch.int32)
        packed = torch._convert_weight_to_int4pack_for_cpu(q, 2)
        sz = torch.rand(K // group, N, 2, dtype=torch.bfloat16) * 1e-3
        return packed, sz

    ws = [one() for _ in range(_copies(N * K // 2, cache_mb))]
    return lambda x, i: torch._weight_int4pack_mm_for_cpu(x, ws[i % len(ws)][0], group, ws[i % len(ws)][1])


def make_fbgemm(N, K, cache_mb):
    from specdec_cli import internals

    def one():
        lin = torch.nn.Linear(K, N, bias=False)
        return internals.dynamic_int8_linear(lin.eval())

    ws = [one() for _ in range(_copies(N * K, cache_mb))]
    return lambda x, i: ws[i % len(ws)](x.float())


def make_i8rows(N, K, cache_mb):
    from specdec_cli.kernels import int8_rows

    ws = [int8_rows.pack(torch.randn(N, K)) for _ in range(_copies(N * K, cache_mb))]
    return lambda x, i: int8_rows.mm(x, ws[i % len(ws)])


def make_ao_i8wo(N, K, cache_mb):
    import logging

    logging.disable(logging.WARNING)
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    def one():
        lin = torch.nn.Linear(K, N, bias=False).to(torch.bfloat16)
        quantize_(lin, Int8WeightOnlyConfig())
        return lin

    ws = [one() for _ in range(_copies(N * K, cache_mb))]
    return lambda x, i: ws[i % len(ws)](x)


def make_inductor(kind):
    """torch.compile(max-autotune) of the weight-only int8 / int4 product: the weights are arguments (one compile
    per shape and M, whichever copy is passed)."""

    def make(N, K, cache_mb):
        if kind == "i8":
            ws = [(torch.randint(-127, 128, (N, K), dtype=torch.int8), torch.rand(N, dtype=torch.bfloat16) * 1e-3)
                  for _ in range(_copies(N * K, cache_mb))]
            fn = torch.compile(lambda x, w, s: torch._weight_int8pack_mm(x, w, s), mode="max-autotune", dynamic=False)
            return lambda x, i: fn(x, *ws[i % len(ws)])
        ws = [(torch._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (N, K), dtype=torch.int32), 2),
               torch.rand(K // 32, N, 2, dtype=torch.bfloat16) * 1e-3) for _ in range(_copies(N * K // 2, cache_mb))]
        fn = torch.compile(lambda x, w, sz: torch._weight_int4pack_mm_for_cpu(x, w, 32, sz), mode="max-autotune",
                           dynamic=False)
        return lambda x, i: fn(x, *ws[i % len(ws)])

    return make


def make_gguf(qtype, path=None):
    def make(N, K, cache_mb):
        from specdec_cli.kernels import qmatmul

        blocks = [qmatmul.random_blocks(qtype, N, K, seed=s)
                  for s in range(_copies(qmatmul.block_bytes(qtype, N, K), cache_mb))]
        return lambda x, i: qmatmul.gguf_mm(x, blocks[i % len(blocks)], qtype, N, K, path=path)

    return make


def make_prompt(qtype):
    def make(N, K, cache_mb):
        from specdec_cli.kernels import qmatmul

        blocks = [qmatmul.random_blocks(qtype, N, K, seed=s)
                  for s in range(_copies(qmatmul.block_bytes(qtype, N, K), cache_mb))]
        if qmatmul.prompt_mm(torch.zeros(1, K), blocks[0], qtype, N, K) is None:
            raise RuntimeError("the prompt kernel does not run here (qmatmul.prompt_mm)")
        return lambda x, i: qmatmul.prompt_mm(x, blocks[i % len(blocks)], qtype, N, K)

    return make


def make_packed(qtype, path=None):
    def make(N, K, cache_mb):
        from specdec_cli.kernels import qmatmul

        if not qmatmul.packs(qtype, N):
            raise RuntimeError("the packed kernel does not run here (qmatmul.packs)")
        packed = [qmatmul.pack(qmatmul.random_blocks(qtype, N, K, seed=s), qtype, N, K)
                  for s in range(_copies(qmatmul.block_bytes(qtype, N, K), cache_mb))]
        return lambda x, i: qmatmul.packed_mm(x, packed[i % len(packed)], qtype, N, K, path=path)

    return make


CONTENDERS = {"bf16": make_bf16, "fp32": make_fp32, "f32rows": make_f32rows, "bf16rows": make_bf16rows,
              "bf16pair": make_bf16pair, "int8pack": make_int8pack, "int4pack": make_int4pack, "fbgemm-i8": make_fbgemm,
              "i8rows": make_i8rows, "ao-i8wo": make_ao_i8wo, "inductor-i8": make_inductor("i8"), "inductor-i4": make_inductor("i4")}
GGUF_TYPES = ("q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
CONTENDERS.update({t: make_gguf(t) for t in GGUF_TYPES})
CONTENDERS.update({f"{t}-prompt": make_prompt(t) for t in ("q4_k", "q5_k", "q6_k")})
CONTENDERS.update({f"{t}-packed": make_packed(t) for t in ("q4_k", "q5_k", "q6_k")})
CONTENDERS.update({f"{t}-avx2": make_gguf(t, "avx2") for t in ("q4_k", "q5_k", "q6_k")})  # as an AVX2 CPU runs them
CONTENDERS.update({f"{t}-packed-avx2": make_packed(t, "avx2") for t in ("q4_k", "q5_k", "q6_k")})


def measure(fns: dict, x: torch.Tensor, rounds: int, target_s: float) -> dict[str, list[float]]:
    """{name: [seconds per call, one per round]}, contenders interleaved, the start rotating each round."""
    names = list(fns)
    reps = {}
    for name in names:  # warm up, and choose how many calls make one measurement
        fns[name](x, 0)
        t0 = time.perf_counter()
        fns[name](x, 1)
        reps[name] = max(1, min(200, int(target_s / max(time.perf_counter() - t0, 1e-6))))
    out = {n: [] for n in names}
    counter = 2
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            for _ in range(reps[name]):
                fns[name](x, counter)
                counter += 1
            out[name].append((time.perf_counter() - t0) / reps[name])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--rows", default="1,2,5,9,16,33")
    ap.add_argument("--contenders", default="bf16,int8pack,int4pack,fbgemm-i8,ao-i8wo,q4_k,q6_k")
    ap.add_argument("--inductor", action="store_true", help="add inductor-i8,inductor-i4 (minutes of compiling)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--target-ms", type=float, default=4.0, help="time of one measurement (calls repeated)")
    ap.add_argument("--cache-mb", type=int, default=96, help="weight copies per contender add up to this")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, all cores)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.contenders.split(",") + (["inductor-i8", "inductor-i4"] if args.inductor else [])
    rows = [int(r) for r in args.rows.split(",")]
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}", flush=True)
    try:
        from specdec_cli.kernels import qmatmul

        print(f"# gguf matmul: {qmatmul.backend_line()}", flush=True)
    except Exception as e:  # the table runs without it
        print(f"# gguf matmul unavailable: {e}", flush=True)
    records = []
    for shape in args.shapes.split(","):
        N, K = SHAPES[shape]
        fns = {}
        for name in names:
            try:
                fns[name] = CONTENDERS[name](N, K, args.cache_mb)
            except Exception as e:  # a contender that does not run here is reported, not fatal
                print(f"# {name} skipped on {shape}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
        print(f"\n## {shape}: N={N} K={K}   ms per call (median) and [× bf16 in the same rounds]", flush=True)
        print("| M | " + " | ".join(fns) + " |")
        print("|---:|" + "---:|" * len(fns))
        for M in rows:
            x = torch.randn(M, K, dtype=torch.bfloat16)
            try:
                times = measure(fns, x, args.rounds, args.target_ms / 1e3)
            except Exception as e:  # a contender failing at one M is reported, the table goes on
                print(f"# M={M} failed: {type(e).__name__}: {e}", flush=True)
                continue
            med = {n: statistics.median(t) for n, t in times.items()}
            cells = []
            for n in fns:
                cell = f"{med[n] * 1e3:.3f}"
                if "bf16" in times and n != "bf16":
                    ratio = statistics.median(a / b for a, b in zip(times[n], times["bf16"]))
                    cell += f" [{ratio:.2f}]"
                cells.append(cell)
                records.append({"shape": shape, "N": N, "K": K, "M": M, "contender": n, "ms": med[n] * 1e3,
                                "ms_min": min(times[n]) * 1e3, "ms_rounds": [t * 1e3 for t in times[n]]})
            mins = " ".join(f"{n} {min(times[n]) * 1e3:.3f}" for n in fns)
            print(f"| {M} | " + " | ".join(cells) + f" |  <!-- min: {mins} -->", flush=True)
        # each contender's M-row cost over its own 1-row cost (from the medians)
        for stat in ("ms", "ms_min"):
            ones = {r["contender"]: r[stat] for r in records if r["shape"] == shape and r["M"] == 1}
            if ones:
                print("\n" + f"{shape}: time(M) / time(1) ({'medians' if stat == 'ms' else 'minimums'}): " + "; ".join(
                    f"{n} " + " ".join(f"{r[stat] / ones[n]:.2f}" for r in records
                                       if r["shape"] == shape and r["contender"] == n)
                    for n in fns if n in ones), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                       "rows": rows, "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
