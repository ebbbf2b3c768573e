"""`specdec bench --task synthetic`: one verification step, timed per provider on LM-like logits (cases.py),
over a grid of vocabulary V × batch B × draft length γ (the paper's figure 3, tables 6 and 8).

Providers are the verification modes (`baseline`, `exact`, `sigmoid`, through decoding.verify) and `hf`:
transformers' own `_speculative_sampling`, called literally (B = 1 only), the paper's real baseline. All
providers of a grid point are timed side by side (timing.measure_side_by_side), so their ratios share the
machine's noise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec_cli import internals
from specdec_cli.bench.cases import describe, make_case
from specdec_cli.bench.machine import cpu_clock, others_cpu
from specdec_cli.bench.timing import measure_side_by_side
from specdec_cli.decoding.verify import LOGITS, VERIFIERS, verify
from specdec_cli.kernels import triton_backend_name

WARMUP = 5
ACCEPTANCE_POOL = 64  # distinct uniform draws cycled through the timed calls of one grid point
HF_PROMPT_LEN = 16  # tokens before the draft in hf's candidate_input_ids (it only reads the last γ)

Progress = Callable[[str], None]  # called once per finished unit of work, with its label


def bytes_per_step(mode: str, batch: int, gamma: int, vocab: int, itemsize: int) -> int:
    """Bytes one verification step moves to and from memory, per provider (the bandwidth denominator).

    Notation: R = B·(γ+1)·V target logits, D = B·γ·V draft values, s = the logits' itemsize, fp32 = 4.

    exact:    the least any exact verifier must read:
                R·s                      every target row once (its log-sum-exp: softmax fused, online)
              + B·V·s + B·V·4            the one resampled row per sequence: its target logits again and
                                         its draft probabilities (fp32)
              (gathered scalars, uniforms and the B·(γ+1) int64 tokens written are left out: < 0.1 %)
    sigmoid:  elementwise p̂, q̂, no normalisation: only the resampled row, target and draft logits,
              B·V·2s.
    baseline: kernels/baseline.py, each full-size tensor op counted once as reads of its inputs plus a
              write of its output (a lower bound: torch's softmax reads its input more than once):
                .float() of both logits (only if s != 4)  (D + R)·(s+4)
                / T, then softmax, for both               (D + R)·8 + (D + R)·8
                isnan(p).any()                            R·4 + R·1 + R·1
                p[n]; cat([q, 0]) then [n]                B·V·8; D·4 + R·4; B·V·8
                p' = clamp(p_n − q_n), Σ, /, where        B·V·(12 + 8 + 4 + 8 + 12)
                multinomial                               B·V·4
    flashinfer: `chain_speculative_sampling` on probabilities: the target's softmax (R·(s+4)), then its kernel
              reading R·4 + D·4 (an upper bound: it may stop reading a row early).
    hf:       transformers' `_speculative_sampling` (B = 1), same counting, softmax in the logits' dtype:
                softmax of draft and target logits        D·2s + R·2s
                p[:, n], q[:, n] (advanced indexing)      B·V·4s
                clamp(p − q), Σ, div_, multinomial        B·V·(3s + 2s + s + 2s + s)
    """
    B, G, V, s = batch, gamma, vocab, itemsize
    R, D, row = B * (G + 1) * V, B * G * V, B * V
    if mode == "exact":
        return R * s + row * s + row * 4
    if mode == "sigmoid":
        return row * 2 * s
    if mode == "baseline":
        cast = 0 if s == 4 else (D + R) * (s + 4)
        softmaxes = (D + R) * 8 * 2  # divide by T, then softmax, for draft and target
        nan_check = R * 6
        rows = row * 8 + D * 4 + R * 4 + row * 8
        residual = row * (12 + 8 + 4 + 8 + 12) + row * 4
        return cast + softmaxes + nan_check + rows + residual
    if mode == "hf":
        return D * 2 * s + R * 2 * s + row * 4 * s + row * 9 * s
    if mode == "flashinfer":  # the target's softmax (read s, write 4), then its kernel reads both models' probs
        return R * (s + 4) + R * 4 + D * 4
    raise ValueError(f"no byte model for {mode!r}")



@dataclass
class SyntheticRecord:
    """One provider at one grid point. Times are per verification step, in ms."""

    vocab: int
    batch: int
    gamma: int
    mode: str
    backend: str  # "torch" | "triton" | "triton-interpreter" | "transformers"
    dtype: str
    device: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    n: int  # timed calls
    speedup_vs_baseline: float | None  # baseline median / this median (> 1: faster than baseline)
    speedup_vs_hf: float | None  # hf median / this median (B = 1 only)
    acceptance_rate: float  # accepted / drafted over every call of this provider (warm-up included)
    mean_accepted_per_call: float  # accepted draft tokens per sequence per step
    expected_acceptance_rate: float  # what exact sampling must give on this case (see _expected_acceptance)
    calls: int  # verification calls the acceptance figures come from
    bytes: int  # bytes_per_step
    gb_per_s: float | None  # bytes / median (CUDA only: on a CPU the caches make it meaningless)
    peak_extra_mib: float | None  # CUDA only: peak memory allocated during one step, above its inputs
    case_overlap: float  # mean Σ min(p, q) of the case's draft rows (Leviathan's α of the case)
    case_target_entropy: float  # mean entropy of the target rows, nats
    others_cpu: float | None = None  # share of the machine's CPU other processes used while this point was timed


# Columns of the results table: (record field, header). `--json` carries every one of them.
SYNTHETIC_COLUMNS = (
    ("vocab", "V"), ("batch", "B"), ("gamma", "γ"), ("mode", "mode"),
    ("median_ms", "ms/step"), ("p10_ms", "p10"), ("p90_ms", "p90"),
    ("speedup_vs_baseline", "×base"), ("speedup_vs_hf", "×hf"),
    ("acceptance_rate", "acc"), ("expected_acceptance_rate", "expect"), ("gb_per_s", "GB/s"),
)


def _expected_acceptance(case: dict) -> float:
    """E[accepted / drafted] of exact sampling on this case's fixed draft tokens: position j passes
    with r_j = min(1, p_j(x_j)/q_j(x_j)) given the earlier ones passed, so E[A] = Σ_k Π_{j<=k} r_j."""
    tokens = case["draft_tokens"]  # [B, γ]
    G = tokens.shape[1]
    lse = torch.logsumexp(case["target_logits"][:, :G].float(), dim=-1)  # [B, γ]
    z_x = case["target_logits"][:, :G].gather(-1, tokens[..., None])[..., 0].float()  # [B, γ]
    p_x = torch.exp(z_x - lse)
    q_x = case["draft_probs"].gather(-1, tokens[..., None])[..., 0].float()  # [B, γ]
    r = torch.where(q_x > 0, (p_x / q_x.clamp_min(1e-38)).clamp(max=1.0), 0.0)  # [B, γ]
    return float(torch.cumprod(r.double(), dim=1).sum(dim=1).mean() / G)


def _providers(modes, case, pool, config, sink: dict[str, list]) -> dict[str, Callable]:
    """Zero-argument callables, one verification step each. Every call takes the next uniform draw of
    the pool (so acceptance is measured over many draws) and ends with its accepted counts on the host, in
    sink[mode]: the one synchronisation a decoding step makes, in every provider alike (exact's error flags come
    in the same copy)."""
    tokens, probs, logits, target = (case["draft_tokens"], case["draft_probs"], case["draft_logits"],
                                     case["target_logits"])
    B, G = tokens.shape
    fns = {}

    def step_verify(mode):
        calls = sink[mode]
        verifier = VERIFIERS[mode]
        kwargs = dict(alpha=config.alpha, beta=config.beta, backend=config.kernel_backend())

        def draft():  # baseline, as transformers does, softmaxes the draft's logits in its step
            if verifier.reads == LOGITS:
                return logits
            return torch.softmax(logits.float(), dim=-1) if mode == "baseline" else probs

        def step():
            out = verify(mode, tokens, draft(), target, pool[len(calls) % len(pool)], **kwargs)
            calls.append(out.accepted())
            return out.out_tokens

        return step

    def step_hf():
        calls = sink["hf"]
        gen = torch.Generator(device="cpu").manual_seed(config.seed)
        prompt = torch.randint(0, target.shape[-1], (1, HF_PROMPT_LEN), generator=gen).to(tokens.device)
        candidate_input_ids = torch.cat([prompt, tokens], dim=1)  # [1, n+γ]
        candidate_logits = logits  # [1, γ, V]
        new_logits = target  # [1, γ+1, V]

        def step():
            valid_tokens, n_matches = internals.speculative_sampling(candidate_input_ids, candidate_logits, G, new_logits)
            calls.append(n_matches.tolist() if torch.is_tensor(n_matches) else n_matches)
            return valid_tokens

        return step

    def step_flashinfer():
        from specdec_cli.bench.flashinfer_peer import chain_speculative_sampling

        calls = sink["flashinfer"]

        def step():  # FlashInfer takes probabilities: the target's softmax is part of its step
            out = chain_speculative_sampling(probs, tokens, torch.softmax(target.float(), dim=-1))  # [B, γ+1], −1 padded
            calls.append(((out != -1).sum(dim=1) - 1).tolist())
            return out

        return step

    for mode in modes:
        if mode == "hf":
            if B == 1:
                fns["hf"] = step_hf()
        elif mode == "flashinfer":
            fns["flashinfer"] = step_flashinfer()
        else:
            fns[mode] = step_verify(mode)
    return fns


def _peak_extra_mib(fn) -> float:
    """CUDA: memory allocated at the peak of one call above what was allocated before it, in MiB."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def grid(config) -> list[tuple[int, int, int]]:
    """(vocab, batch, gamma) in the order they are run."""
    return [(v, b, g) for v in config.vocabs for b in config.batches for g in config.gammas]


def run_point(vocab: int, batch: int, gamma: int, config) -> list[SyntheticRecord]:
    """Time every provider of one grid point side by side; one record per provider."""
    device, dtype = config.device, config.torch_dtype
    case = make_case(batch, gamma, vocab, overlap=config.overlap, dtype=dtype, device=device, seed=config.seed)
    gen = torch.Generator(device="cpu").manual_seed(config.seed + 1)
    pool = [(1.0 - torch.rand(batch, gamma + 1, generator=gen)).to(device) for _ in range(ACCEPTANCE_POOL)]
    sink = {m: [] for m in config.modes}
    fns = _providers(config.modes, case, pool, config, sink)
    torch.manual_seed(config.seed)  # hf draws its own uniforms from the global generator
    before = cpu_clock()
    timings = measure_side_by_side(fns, warmup=WARMUP, repeat=config.repeat, device=device)
    others = others_cpu(before, cpu_clock())
    peak = {m: _peak_extra_mib(fn) for m, fn in fns.items()} if device == "cuda" else {}

    about = describe(case)
    expected = _expected_acceptance(case)
    itemsize = torch.empty((), dtype=dtype).element_size()
    kernel = triton_backend_name() if config.kernel_backend() == "triton" else "torch"
    base = timings.get("baseline")
    hf = timings.get("hf")
    records = []
    for mode, t in timings.items():
        accepted = torch.stack([torch.as_tensor(a).reshape(-1) for a in sink[mode]]).cpu()  # [calls, B]
        calls = accepted.shape[0]
        nbytes = bytes_per_step(mode, batch, gamma, vocab, itemsize)
        records.append(SyntheticRecord(
            vocab=vocab, batch=batch, gamma=gamma, mode=mode,
            backend={"hf": "transformers", "baseline": "torch", "flashinfer": "flashinfer"}.get(mode, kernel),
            dtype=config.dtype, device=device,
            median_ms=t.median_ms, p10_ms=t.p10_ms, p90_ms=t.p90_ms, mean_ms=t.mean_ms, std_ms=t.std_ms,
            min_ms=t.min_ms, n=t.n,
            speedup_vs_baseline=base.median_ms / t.median_ms if base else None,
            speedup_vs_hf=hf.median_ms / t.median_ms if hf else None,
            acceptance_rate=float(accepted.sum()) / (calls * accepted.shape[1] * gamma),
            mean_accepted_per_call=float(accepted.double().mean()),
            expected_acceptance_rate=expected,
            calls=calls,
            bytes=nbytes,
            gb_per_s=nbytes / (t.median_ms * 1e-3) / 1e9 if device == "cuda" else None,
            peak_extra_mib=peak.get(mode),
            case_overlap=about["overlap"],
            case_target_entropy=about["target_entropy_mean"],
            others_cpu=others,
        ))
    return records


def run_synthetic(config, progress: Progress | None = None) -> list[SyntheticRecord]:
    step = progress or (lambda _msg: None)
    records = []
    for vocab, batch, gamma in grid(config):
        records += run_point(vocab, batch, gamma, config)
        step(f"V={vocab} B={batch} γ={gamma}")
    return records


SPREAD_LIMIT = 3.0  # p90 / p10 above this: the calls were not timed under steady conditions


OTHERS_CPU_LIMIT = 0.1  # other processes took more than this share of the CPU while a point was timed


def spread_warnings(records: list[SyntheticRecord]) -> list[str]:
    """Warnings that timings were taken on a busy machine, so a reader does not trust them blindly: a
    wide spread of one provider's calls, or other processes using the CPU while a grid point was timed
    (a steadily busy machine slows every call alike, which the spread alone does not show)."""
    out = []
    wide = [r for r in records if r.p10_ms > 0 and r.p90_ms / r.p10_ms > SPREAD_LIMIT]
    if wide:
        out.append(f"{len(wide)} of {len(records)} timings spread widely (p90 > {SPREAD_LIMIT:g} × p10): "
                   "the machine was busy; rerun when it is quiet")
    busy = {(r.vocab, r.batch, r.gamma): r.others_cpu for r in records
            if r.others_cpu is not None and r.others_cpu > OTHERS_CPU_LIMIT}
    if busy:
        points = ", ".join(f"V={v} B={b} γ={g} ({share:.0%})" for (v, b, g), share in sorted(busy.items()))
        out.append(f"other processes used the CPU while {len(busy)} grid point(s) were timed: {points}; "
                   "their timings are suspect")
    return out
