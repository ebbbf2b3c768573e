"""Every GPU check in one run, written into one folder: `make gpu` on the GPU machine, within its 9 minutes.

    1. plans     the launcher's SPLITS, today's launcher beside a previous one and FlashInfer: device time
                 in a CUDA graph, time per eager call, host time per call (V = 151 936, γ = 5, B = 1, 8, 64)
    2. rows      whether cuBLAS gives a row the same bits whatever the rows beside it (exact_rows' question)
    3. kernels   the compiled kernels decision for decision against the reference (the torch path on cases too
                 large for plain loops), fp32/bf16/fp16, V up to 262 144, B 1 to 64, and the output distribution
                 over ≥ 100 000 draws by the kernel itself; sigmoid's distance to the target
    4. graph     the exact step captured in a CUDA graph and replayed: same tokens as eager, time of both
    5. copy      the device's copy bandwidth, the yardstick of the exact step's bytes
    6. tests     the kernel tests (tests/test_verify.py, tests/test_plans.py) compiled on the device, when pytest
                 is importable
    7. grid      `specdec bench --task synthetic` over V × γ × B for baseline, hf, exact, sigmoid and FlashInfer
                 (when importable, its softmax included), bytes and achieved bandwidth per step
    8. loop      decoding end to end on randomly initialised models of real shapes: a Llama-style ~1B target
                 with its self:K draft, a Whisper-small-shaped decoder with its lean self draft; greedy output
                 against autoregressive, time per token per mode, the share of a step spent verifying

Needs only torch, triton and transformers (no network, no librosa, soundfile, jiwer, rouge-score, scipy).
On a machine without CUDA, --tiny (the default there) runs the same code on small shapes: CI runs that, so
this script cannot rot. Writes gpu.json (every figure, the device named), synthetic.csv, the plots when
matplotlib is there, and log.txt.

    python -m specdec_cli.bench.gpu --out out/gpu [--tiny] [--budget 540]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch


class Run:
    """The report being written, a log, and the time budget: a section that would start past it is skipped."""

    def __init__(self, out: Path, budget_s: float, tiny: bool):
        self.out, self.budget_s, self.tiny, self.start = out, budget_s, tiny, time.perf_counter()
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        out.mkdir(parents=True, exist_ok=True)
        self.log_file = open(out / "log.txt", "w")  # noqa: SIM115 - open for the whole run, closed by close()
        self.report = {"device": self.device, "tiny": tiny, "sections": {}}

    def log(self, message: str) -> None:
        line = f"[{time.perf_counter() - self.start:7.1f} s] {message}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def section(self, name: str, fn) -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed > self.budget_s:
            self.report["sections"][name] = {"skipped": f"time budget of {self.budget_s:.0f} s spent"}
            self.log(f"{name}: skipped (budget)")
            return
        self.log(f"{name}: start")
        t0 = time.perf_counter()
        try:
            result = fn()
            self.report["sections"][name] = {"seconds": round(time.perf_counter() - t0, 1), **(result or {})}
            self.log(f"{name}: done in {time.perf_counter() - t0:.1f} s")
        except Exception as e:
            self.report["sections"][name] = {"failed": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            self.log(f"{name}: FAILED {type(e).__name__}: {e}")
        self.save()

    def save(self) -> None:
        (self.out / "gpu.json").write_text(json.dumps(self.report, indent=2, default=str) + "\n")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------------
# 1. kernels


def kernels(run: Run) -> dict:
    from specdec_cli.bench import kernel_check

    grid = [(1000, 1), (5003, 4)] if run.tiny else [(32000, 1), (51865, 8), (151936, 8), (262144, 64)]
    samples = 3000 if run.tiny else 200_000
    dtypes = [torch.float32, torch.bfloat16] if run.tiny else [torch.float32, torch.bfloat16, torch.float16]
    results = []
    for dtype in dtypes:
        for vocab, batch in grid:
            r = kernel_check.run("exact", vocab=vocab, gamma=5, batch=batch, samples=samples, device=run.device,
                                 cases=2 if run.tiny else 4, dtype=dtype)
            results.append({"mode": "exact", "dtype": str(dtype), "vocab": vocab, "batch": batch, "passed": r.passed,
                            "checks": [c.__dict__ for c in r.checks], "figures": r.figures, "backend": r.backend})
            run.log(f"exact {dtype} V={vocab} B={batch}: {'passed' if r.passed else 'FAILED'} {r.figures.get('tv_to_target')}")
    r = kernel_check.run("sigmoid", vocab=grid[-1][0], gamma=5, batch=grid[-1][1], samples=samples, device=run.device,
                         cases=2)
    results.append({"mode": "sigmoid", "vocab": grid[-1][0], "batch": grid[-1][1], "passed": r.passed,
                    "checks": [c.__dict__ for c in r.checks], "figures": r.figures, "backend": r.backend})
    return {"passed": all(x["passed"] for x in results), "runs": results}


# ----------------------------------------------------------------------------------------------------
# 2. graph, 3. copy


def _exact_case(run: Run, batch: int, vocab: int, gamma: int = 5):
    from specdec_cli.bench.cases import make_case

    c = make_case(batch, gamma, vocab, overlap=0.8, dtype=torch.bfloat16, device=run.device, seed=3)
    return c["draft_tokens"], c["draft_probs"], c["target_logits"], c["uniforms"]


def graph(run: Run) -> dict:
    """The exact step in a CUDA graph: captured once, replayed on new uniforms, the same tokens as eager."""
    from specdec_cli.bench.timing import measure_side_by_side
    from specdec_cli.kernels import exact  # noqa: F401 - registers torch.ops.specdec.verify_triton

    if run.device != "cuda":
        return {"skipped": "no CUDA device"}
    out = {}
    for batch in (1, 64):
        tokens, probs, logits, u = _exact_case(run, batch, 151936)
        step = functools.partial(torch.ops.specdec.verify_triton, tokens, probs, logits, u, 1.0, False, 0.0, 1.0)
        replay, captured = _graphed(step)
        u.copy_(1 - torch.rand_like(u))  # new randomness into the captured input
        replay()
        eager = step()
        same = all(torch.equal(a, b) for a, b in zip(captured, eager))
        t = measure_side_by_side({"eager": step, "graph": replay}, device="cuda", repeat=200)
        out[f"B={batch}"] = {"same_tokens_as_eager": same, "eager_us": t["eager"].median_ms * 1e3,
                             "graph_us": t["graph"].median_ms * 1e3}
        run.log(f"graph B={batch}: same={same} eager {t['eager'].median_ms * 1e3:.1f} µs, graph {t['graph'].median_ms * 1e3:.1f} µs")
    return out


def copy_bandwidth(run: Run) -> dict:
    """GB/s of a device-to-device copy (bytes read + written): the ceiling for a step that streams its input."""
    n = (1 << 20) if run.tiny else (1 << 28)  # 1 GiB of fp32 on the GPU
    a = torch.empty(n, dtype=torch.float32, device=run.device).uniform_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    _sync(run.device)
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        b.copy_(a)
    _sync(run.device)
    seconds = (time.perf_counter() - t0) / reps
    gbps = 2 * a.numel() * 4 / seconds / 1e9
    run.log(f"copy: {gbps:.0f} GB/s")
    run.report["copy_gb_per_s"] = gbps
    return {"gb_per_s": gbps, "bytes": 2 * a.numel() * 4}


def _previous_launch():
    """exact.launch as it was at an earlier commit, from the file SPECDEC_PREV_EXACT names (`git show
    <commit>:kernels/exact.py`, its op renamed), to time beside today's; or None."""
    path = os.environ.get("SPECDEC_PREV_EXACT")
    if not path or not os.path.isfile(path):
        return None
    spec = importlib.util.spec_from_file_location("specdec_cli.kernels._previous_exact", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.launch


def _previous_read(launched) -> list[int]:
    """The accepted counts of a previous launcher's (out, counts [2, B]) (ec60a41 on; an older launcher's
    three outputs fail here), read as Verification.accepted reads them."""
    _, counts = launched
    return counts.tolist()[0]


def _host_us(fn, calls: int = 200) -> float:
    """Host time of one call: `calls` calls back to back with no synchronisation between them, over `calls` (the
    device queues the work; this is what a step costs the CPU when the GPU is busy anyway)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / calls * 1e6


def _graphed(fn):
    """fn captured in a CUDA graph, after warm-up calls on a side stream (they compile, which a capture must not):
    (replay, the captured call's outputs, as of the last replay)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = fn()
    g.replay()
    torch.cuda.synchronize()
    return g.replay, got


def _eager_steps(case, previous) -> dict:
    """The exact step's eager calls on case (tokens, probs, logits, u), by name: the launcher, the custom op, the loop's
    path (verify() and its read of the counts), baseline's step read alike, and the previous launcher with the same
    read, when there."""
    from specdec_cli.decoding.verify import verify
    from specdec_cli.kernels import exact

    eager = {"two launches": functools.partial(exact.launch, *case, 1.0, sigmoid=False),
             "custom op": functools.partial(torch.ops.specdec.verify_triton, *case, 1.0, False, 0.0, 1.0),
             "verify() + check": lambda: verify("exact", *case).checked(),
             "verify() + accepted()": lambda: verify("exact", *case).accepted(),  # the decoding loop's step
             "baseline: verify() + accepted()": lambda: verify("baseline", *case).accepted()}
    if previous is not None:  # its launch read as the loop reads it
        eager["previous launcher + its read"] = lambda: _previous_read(previous(*case, 1.0, sigmoid=False))
    return eager


def plans(run: Run) -> dict:
    """The launcher measured at V = 151 936, γ = 5, B = 1, 8, 64: SPLITS around its choice in a CUDA graph (device
    time), tokens against the torch path's; then today's launcher beside a previous one (when
    SPECDEC_PREV_EXACT names it) and FlashInfer (softmax + its kernel, when there): device time in a graph, time
    per eager call from idle, and host time per call back to back."""
    import triton

    from specdec_cli.bench import flashinfer_peer
    from specdec_cli.bench.timing import measure_side_by_side
    from specdec_cli.kernels import exact

    if run.device != "cuda":
        return {"skipped": "no CUDA device"}
    vocab, gamma, out = 151936, 5, {}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = triton.cdiv(vocab, 1024)
    previous = _previous_launch()
    for batch in (1, 8, 64):
        tokens, probs, logits, u = _exact_case(run, batch, vocab, gamma)
        want = exact.verify_exact_torch(tokens.cpu(), probs.cpu(), logits.cpu(), u.cpu()).out_tokens
        launcher = exact._plan(vocab, batch, None, False, sms=sms)
        steps = {}  # name -> an eager call returning out_tokens first
        for splits in sorted({8, 16, 32, 64, launcher[1]}):
            chunk = triton.cdiv(tiles, splits) * 1024
            plan = (1024, triton.cdiv(vocab, chunk), chunk)
            name = f"splits={plan[1]}" + (" (launcher)" if plan == launcher else "")
            steps[name] = functools.partial(exact.launch, tokens, probs, logits, u, 1.0, sigmoid=False, plan=plan)
        if previous is not None:
            steps["previous launcher"] = functools.partial(previous, tokens, probs, logits, u, 1.0, sigmoid=False)
        if flashinfer_peer.source() is not None:
            steps["flashinfer (softmax + kernel)"] = lambda p=probs, x=tokens, z=logits: (
                flashinfer_peer.chain_speculative_sampling(p, x, torch.softmax(z.float(), dim=-1)),)
        variants, timings = {}, {}
        for name, fn in steps.items():
            replay, got = _graphed(fn)
            variants[name] = replay
            timings[name] = {"same_tokens_as_torch_path": None if name.startswith("flashinfer") else
                             bool(torch.equal(got[0].cpu(), want))}
        for name, t in measure_side_by_side(variants, device="cuda", repeat=100).items():
            timings[name]["graph_us"] = t.median_ms * 1e3
        eager = _eager_steps((tokens, probs, logits, u), previous)
        eager.update({k: v for k, v in steps.items() if not k.startswith("splits")})
        per_call = {k: t.median_ms * 1e3 for k, t in measure_side_by_side(eager, device="cuda", repeat=100).items()}
        reads = ("check", "accepted()", "its read")  # those synchronise
        host = {k: _host_us(fn) for k, fn in eager.items() if not k.endswith(reads)}
        out[f"B={batch}"] = {"graph": timings, "eager_us": per_call, "host_us": host}
        run.log(f"plans B={batch} graph: " + ", ".join(
            f"{k} {v['graph_us']:.1f} µs{' DIFFERS' if v['same_tokens_as_torch_path'] is False else ''}"
            for k, v in timings.items()))
        run.log(f"plans B={batch} eager: " + ", ".join(f"{k} {v:.1f} µs" for k, v in per_call.items()))
        run.log(f"plans B={batch} host: " + ", ".join(f"{k} {v:.1f} µs" for k, v in host.items()))
        if batch == 1:  # where a step's host time goes: the loop's path, by function
            out["host_profile_B=1"] = _host_profile(eager["verify() + accepted()"])
            run.log("plans B=1 host profile (µs a call, own time): " + ", ".join(
                f"{k} {v:.1f}" for k, v in out["host_profile_B=1"].items()))
    return out


def _host_profile(fn, calls: int = 300, top: int = 14) -> dict[str, float]:
    """cProfile's own time per call of the `top` functions fn spends most in (the profiler's overhead included)."""
    import cProfile
    import pstats

    fn()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    stats = pstats.Stats(profile).stats  # {(file, line, name): (calls, primitive calls, own time, cumulative, callers)}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return {f"{Path(f).name}:{line}:{name}": own / calls * 1e6 for (f, line, name), (_, _, own, _, _) in rows}


def rows(run: Run) -> dict:
    """Whether a row of a bf16 product has the same bits whatever the rows beside it (cuBLAS, TinyLlama's shapes):
    row 0 of an M-row product against M = 1 and M = 2, for M up to 33."""
    if run.device != "cuda":
        return {"skipped": "no CUDA device"}
    torch.manual_seed(0)
    out = {}
    for k, n in ((2048, 2048), (2048, 256), (2048, 5632), (5632, 2048), (2048, 32000)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(33, k, device="cuda", dtype=torch.bfloat16)
        one = torch.nn.functional.linear(x[:1], w)
        two = torch.nn.functional.linear(x[:2], w)[:1]
        same1 = [m for m in range(1, 34) if torch.equal(torch.nn.functional.linear(x[:m], w)[:1], one)]
        same2 = [m for m in range(1, 34) if torch.equal(torch.nn.functional.linear(x[:m], w)[:1], two)]
        out[f"{k}x{n}"] = {"M_equal_to_M1": same1, "M_equal_to_M2": same2}
        run.log(f"rows {k}x{n}: equal to M=1 at M={same1}; to M=2 at M={same2}")
    return out


# ----------------------------------------------------------------------------------------------------
# 4. grid


def grid(run: Run) -> dict:
    from specdec_cli.bench import flashinfer_peer, harness, results
    from specdec_cli.bench.config import SyntheticConfig

    modes = ["baseline", "exact", "sigmoid", "hf"]
    run.report["flashinfer"] = source = flashinfer_peer.source()
    if run.device == "cuda" and source is not None:
        modes.append("flashinfer")
    if run.tiny:
        config = SyntheticConfig([1000, 5003], [1, 5], [1, 4], modes, device=run.device, repeat=3)
    else:
        config = SyntheticConfig([32000, 151936, 262144], [1, 3, 5, 10, 20], [1, 8, 64], modes, device=run.device,
                                 dtype="bfloat16", repeat=20)
    config.validate()
    measured = harness.run(config, progress=lambda label: run.log(f"grid {label}"))
    plots = run.out if importlib.util.find_spec("matplotlib") is not None else None
    paths = results.write_outputs(measured, csv_path=run.out / "synthetic.csv", plot_dir=plots)
    copy = run.report.get("copy_gb_per_s")
    rows = [{k: getattr(r, k) for k in ("vocab", "batch", "gamma", "mode", "backend", "median_ms", "speedup_vs_baseline",
                                        "speedup_vs_hf", "acceptance_rate", "bytes", "gb_per_s")} for r in measured.records]
    for row in rows:
        row["share_of_copy_bandwidth"] = row["gb_per_s"] / copy if copy and row["gb_per_s"] else None
    return {"command": measured.command, "modes": modes, "records": rows, "warnings": measured.warnings,
            "written": [str(p) for p in paths]}


# ----------------------------------------------------------------------------------------------------
# 5. loop


def _time_modes(run: Run, target, draft, prompt, new_tokens: int, modes=("autoregressive", "baseline", "exact", "sigmoid"),
                gamma: int = 4) -> dict:
    """Greedy decoding in each mode: ms per token after the prefill, whether the tokens are autoregressive's,
    acceptance, and the share of a step spent verifying. target: a model, or mode -> the target's Decoder."""
    from specdec_cli.decoding import generate

    out, reference = {}, None
    for mode in modes:
        t = target(mode) if callable(target) and not isinstance(target, torch.nn.Module) else target
        d = None if mode == "autoregressive" else draft
        kwargs = dict(mode=mode, gamma=gamma, max_new_tokens=new_tokens)
        generate(t, d, prompt, **{**kwargs, "max_new_tokens": 4})  # warm-up: kernels compile, caches allocate
        _sync(run.device)
        got = generate(t, d, prompt, **kwargs)
        s = got.stats
        reference = reference or got.tokens
        decode_s = s.wall_s - s.prefill_s
        out[mode] = {"ms_per_token": 1e3 * decode_s / max(1, s.new_tokens), "new_tokens": s.new_tokens,
                     "same_as_autoregressive": got.tokens == reference, "acceptance_rate": s.acceptance_rate,
                     "verify_share_of_step": s.verify_s / decode_s if decode_s > 0 and s.verify_calls else None,
                     "backend": s.backend}
        run.log(f"loop {mode}: {out[mode]['ms_per_token']:.2f} ms/token, same={out[mode]['same_as_autoregressive']}")
    return out


def loop(run: Run) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM, WhisperConfig, WhisperForConditionalGeneration

    from specdec_cli.drafts.layers import self_draft
    from specdec_cli.drafts.lean_whisper import LeanDecoder
    from specdec_cli.models import LoadedModel
    from specdec_cli.models.whisper_decoding import ExactScorer, WindowDecoder, cross_kv

    dtype = torch.bfloat16 if run.device == "cuda" else torch.float32
    torch.manual_seed(0)
    if run.tiny:
        llama = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
        whisper = WhisperConfig(vocab_size=300, d_model=64, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
                                decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128, max_target_positions=64,
                                pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        prompt_len, new_tokens, k = 16, 16, 2
    else:  # TinyLlama-1.1B's shape; Whisper small's
        llama = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                            num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048)
        whisper = WhisperConfig(vocab_size=51865, d_model=768, encoder_layers=12, decoder_layers=12,
                                encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
                                decoder_ffn_dim=3072, max_target_positions=448)
        prompt_len, new_tokens, k = 256, 64, 4
    target = LlamaForCausalLM(llama).to(run.device, dtype).eval()
    loaded = LoadedModel(target, None, "random llama", "local")
    draft = self_draft(loaded, k).model
    prompt = torch.randint(0, llama.vocab_size, (1, prompt_len), device=run.device)
    result = {"llama": {"params": sum(p.numel() for p in target.parameters()), "draft": f"self:{k}", "dtype": str(dtype),
                        "modes": _time_modes(run, target, draft, prompt, new_tokens)}}
    if run.device == "cuda":  # the same without exact_rows: sdpa's many-query rows are not its one-query rows
        from specdec_cli.decoding import exact_rows as rows_module

        needs_rows = rows_module.needs_rows
        rows_module.needs_rows = lambda weight: False
        try:
            result["llama without exact_rows"] = {"modes": _time_modes(run, target, draft, prompt, new_tokens,
                                                                       modes=("autoregressive", "exact"))}
        finally:
            rows_module.needs_rows = needs_rows
    del target, draft

    model = WhisperForConditionalGeneration(whisper).to(run.device, dtype).eval()
    encoded = torch.randn(1, whisper.max_source_positions, whisper.d_model, device=run.device, dtype=dtype)
    with torch.inference_mode():
        kv = cross_kv(model.model.decoder.layers, encoded)
    lean = LeanDecoder(model, range(whisper.decoder_layers), None, weights=None).window(kv)
    prompt = torch.tensor([[1, 2, 3]], device=run.device)

    def scorer(mode):  # the target as transcribe runs it: ExactScorer when speculating
        return (WindowDecoder if mode == "autoregressive" else ExactScorer)(model, encoded, kv)

    modes = _time_modes(run, scorer, lean, prompt, new_tokens // 2, modes=("autoregressive", "exact"), gamma=8)
    result["whisper"] = {"params": sum(p.numel() for p in model.parameters()), "draft": "self (lean)", "modes": modes}
    return result


# ----------------------------------------------------------------------------------------------------
# 6. tests


def tests(run: Run) -> dict:
    if importlib.util.find_spec("pytest") is None:
        return {"skipped": "pytest is not importable here"}
    root = Path.cwd()  # the source tree `make gpu` runs in (this module runs from an install of it)
    suite = [root / "tests" / name for name in ("test_verify.py", "test_plans.py")]  # the kernels, every GPU plan
    missing = [str(path) for path in suite if not path.is_file()]
    if missing:
        return {"skipped": f"{', '.join(missing)} not found"}
    env = {**os.environ, "SPECDEC_TEST_DEVICE": run.device}
    # -P: the root (with its kernels/ folder, which transformers would take for Hugging Face's) stays off sys.path
    args = [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(root), *map(str, suite)]
    if run.tiny:
        args += ["-m", "not slow", "-k", "triton and 1000"]
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=root,
                       timeout=max(30, run.budget_s - (time.perf_counter() - run.start)))
    (run.out / "tests.txt").write_text(r.stdout + r.stderr)
    summary = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    run.log(f"tests: {summary}")
    return {"passed": r.returncode == 0, "summary": summary}


# ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out/gpu"))
    ap.add_argument("--tiny", action="store_true", default=not torch.cuda.is_available(),
                    help="small shapes (the default without CUDA)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds after which no new section starts")
    ap.add_argument("--only", default=None, help="comma-separated sections to run (default: all)")
    args = ap.parse_args(argv)
    run = Run(args.out, args.budget, args.tiny)
    from specdec_cli.bench.machine import machine_info

    run.report["machine"] = machine_info(run.device)
    run.log(f"device {run.report['machine']['device_name']}, torch {torch.__version__}, tiny={args.tiny}")
    with contextlib.suppress(Exception):
        import triton

        run.report["machine"]["versions"]["triton"] = triton.__version__
    for name, fn in (("plans", plans), ("rows", rows), ("kernels", kernels), ("graph", graph), ("copy", copy_bandwidth),
                     ("tests", tests), ("grid", grid), ("loop", loop)):
        if args.only is None or name in args.only.split(","):
            run.section(name, lambda fn=fn: fn(run))
    failed = [n for n, s in run.report["sections"].items() if "failed" in s or s.get("passed") is False]
    run.report["failed_sections"] = failed
    run.save()
    run.log(f"wrote {run.out}; failed sections: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
