"""What `specdec verify-kernel` runs: a kernel against its reference on random cases, and the output
distribution against the target's.

exact:   passes when the Triton kernel and the torch path make the reference's decisions on every case
         and the emitted tokens follow the target distribution (chi-square, p > 1e-3).
sigmoid: passes when the Triton kernel makes its torch twin's decisions on every case; how far the
         approximation moves the output (total variation to the target) and how its acceptance rate
         differs from exact are measured and reported, never hidden.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from specdec_cli import options
from specdec_cli.bench.cases import case_bytes, make_case
from specdec_cli.bench.machine import check_memory
from specdec_cli.bench.metrics import chi_square_p
from specdec_cli.decoding.verify import LOGITS, VERIFIERS
from specdec_cli.kernels import compile as compile_plans
from specdec_cli.kernels import reference, triton_backend_name

MODES = tuple(name for name, v in VERIFIERS.items() if v.triton_kernel is not None)  # the modes with a Triton kernel

DIST_VOCAB = 8  # the distribution test draws over a small vocabulary, so every token is seen often
P_VALUE_MIN = 1e-3


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class KernelReport:
    mode: str
    backend: str
    device: str
    vocab: int
    gamma: int
    batch: int
    samples: int
    checks: list[Check] = field(default_factory=list)
    figures: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def validate(mode: str, vocab: int, gamma: int, batch: int, samples: int, alpha: float, beta: float, cases: int):
    options.one_of("--mode", mode, MODES)
    options.at_least("--vocab", vocab, 2)
    options.check_gamma(gamma)
    options.at_least("--batch", batch, 1)
    options.at_least("--samples", samples, 1)
    options.at_least("--cases", cases, 1)
    options.check_sigmoid(alpha, beta)
    check_memory(f"--vocab {vocab} × --batch {batch} × (--gamma {gamma} + 1)", case_bytes(batch, gamma, vocab))


def _case(batch, gamma, vocab, seed, device, dtype=torch.float32):
    c = make_case(batch, gamma, vocab, overlap=0.75, seed=seed, device=device, dtype=dtype)
    return c["draft_tokens"], c["draft_probs"], c["target_logits"], c["uniforms"], c["draft_logits"]


def _mismatches(expected, got, case=None) -> tuple[str, int]:
    """(the first row whose tokens differ, described, or ""; how many differing rows are rounding ties). With
    `case` (an exact verifier's CPU inputs), a row that differs only where fp32 rounding may decide (_rounding_tie)
    is counted as a tie, not a mismatch: a GPU's exp and its split sums round otherwise than a CPU's."""
    rows = (expected[0] != got[0].cpu()).any(dim=1).nonzero()[:, 0].tolist()
    ties = [b for b in rows if case is not None and _rounding_tie(case, expected[0][b], got[0][b].cpu(), b)]
    bad = [b for b in rows if b not in ties]
    if not bad:
        return "", len(ties)
    b = bad[0]
    return f"row {b}: expected {expected[0][b].tolist()}, got {got[0][b].tolist()}", len(ties)


def _rounding_tie(case, e_row: torch.Tensor, g_row: torch.Tensor, b: int) -> bool:
    """Whether exact's first difference in row b lies within fp32 rounding of a decision, judged in fp64:
    an acceptance whose u·q(x) is within tol·p(x) of p(x), or a draw whose threshold u·Σw falls within tol·Σw of the
    CDF boundary between the two tokens drawn (the tokens between them weigh less than 2·tol·Σw).
    tol = 2^-20·(max|z/T| + |lse| + 8): p = exp(z/T − lse) computed in fp32 (a GPU's exp is ~2 ulp) errs by
    about 2^-23 of its argument's size, relative; 8× that covers the lse's and the sums' own rounding."""
    tokens, draft, target, u = case[:4]
    gamma = tokens.shape[1]
    c = int((e_row != g_row).nonzero()[0])
    z = target[b].double()  # [γ+1, V], T = 1 (the check's cases)
    lse = torch.logsumexp(z, dim=-1)  # [γ+1]
    p = torch.exp(z - lse[:, None])
    q = torch.zeros_like(p) if draft is None else torch.cat([draft[b].double(), torch.zeros_like(p[:1])])  # [γ+1, V]
    if draft is None:
        q[torch.arange(gamma), tokens[b]] = 1.0
    tol = 2.0**-20 * (float(z.abs().max()) + float(lse.abs().max()) + 8)
    if c < gamma:  # x_c's acceptance: a near-tie, else clear, and then both must have drawn (a rejection)
        x = int(tokens[b, c])
        uq, px = float(u[b, c]) * float(q[c, x]), float(p[c, x])
        if abs(uq - px) <= tol * px:
            return True
        if q[c, x] > 0 and uq <= px:  # clearly accepted: x_c was the only answer at c
            return False
    w = torch.clamp(p[c] - q[c], min=0) if c < gamma else p[c]
    if c < gamma and float(w.sum()) == 0:
        w = p[c]
    W = torch.cumsum(w, 0)
    total = float(W[-1])
    lo, hi = sorted((int(e_row[c]), int(g_row[c])))
    if lo < 0:  # a PAD against a token: not a draw of two tokens
        return False
    threshold = float(u[b, gamma]) * total
    return float(W[hi - 1]) - tol * total <= threshold <= float(W[lo]) + tol * total


DRAW_CHUNK = 100_000  # steps per call of the distribution test: its memory stays bounded whatever --samples


def _distribution_draws(fn, p, q, samples, gamma, seed, device):
    """The first emitted token of `samples` independent steps whose every row has target p, draft q:
    (counts per token [V], accepted counts [samples])."""
    g = torch.Generator().manual_seed(seed)
    V = len(p)
    counts, accepted = torch.zeros(V, dtype=torch.float64), []
    for start in range(0, samples, DRAW_CHUNK):
        n = min(DRAW_CHUNK, samples - start)
        target = torch.log(p).expand(n, gamma + 1, V).contiguous().to(device)  # [n, γ+1, V]
        draft = q.expand(n, gamma, V).contiguous().to(device)  # [n, γ, V]
        tokens = torch.multinomial(q, n * gamma, replacement=True, generator=g).reshape(n, gamma).to(device)
        u = (1 - torch.rand(n, gamma + 1, generator=g)).to(device)  # [n, γ+1]
        out, k, _, _ = fn(tokens, draft, target, u).checked()
        counts += torch.bincount(out[:, 0].cpu(), minlength=V).double()
        accepted.append(k.cpu())
    return counts, torch.cat(accepted)


def _small_pair(seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(DIST_VOCAB, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(DIST_VOCAB, generator=g) * 1.5, -1)
    return p, q


def _tv(counts, p):
    return 0.5 * (counts / counts.sum() - p.double()).abs().sum().item()


def run_options(o: options.KernelCheckOptions, progress=None) -> KernelReport:
    """`specdec verify-kernel` without --compile-for: `run` with the command's options, checked first."""
    from specdec_cli.models import resolve_device

    validate(o.mode, o.vocab, o.gamma, o.batch, o.samples, o.alpha, o.beta, o.cases)
    return run(o.mode, vocab=o.vocab, gamma=o.gamma, batch=o.batch, samples=o.samples, alpha=o.alpha, beta=o.beta,
               device=resolve_device(o.device), seed=o.seed, cases=o.cases, progress=progress)


REFERENCE_LIMIT = 2_000_000  # B·(γ+1)·V above this: the plain-loop reference would take minutes (see run)


def run(mode, *, vocab=32000, gamma=5, batch=4, samples=100_000, alpha=-1e4, beta=1e4, device="cpu", seed=0, cases=8,
        dtype=torch.float32, progress=None):
    """Run every check of `mode` (one of MODES) on logits of `dtype` and return the report: its Triton kernel
    against the specification decision for decision (a lossless mode: the plain-loop reference, or its torch
    path for cases larger than REFERENCE_LIMIT, which the test suite holds against the reference; a lossy one:
    its torch twin), then the distribution of what it emits."""
    validate(mode, vocab, gamma, batch, samples, alpha, beta, cases)
    report = KernelReport(mode, triton_backend_name(), str(device), vocab, gamma, batch, samples)
    step = progress or (lambda _msg: None)
    verifier = VERIFIERS[mode]
    exact_rate = _decisions(report, verifier, cases, alpha, beta, device, seed, dtype, step)
    step(f"distribution test: {samples} draws")
    _distribution(report, verifier, samples, alpha, beta, device, seed)
    if exact_rate is not None:
        report.figures["acceptance_rate_exact"] = exact_rate
    return report


def _draft_input(verifier, probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return logits if verifier.reads == LOGITS else probs


def _decisions(report: KernelReport, verifier, cases: int, alpha, beta, device, seed, dtype, step) -> float | None:
    """Random cases, decision for decision: the Triton kernel (and a lossless mode's torch path) against the
    specification. Adds the checks and the acceptance figures to the report. -> a lossy mode's exact
    acceptance rate on the same cases, else None."""
    batch, gamma, vocab = report.batch, report.gamma, report.vocab
    large = batch * (gamma + 1) * vocab > REFERENCE_LIMIT
    mismatches, torch_mismatches, accepted, ties = [], [], {"kernel": 0.0, "exact": 0.0}, 0
    for i in range(cases):
        step(f"random case {i + 1}/{cases}")
        tokens, probs, target, u, draft_logits = _case(batch, gamma, vocab, seed + i, device, dtype)
        draft = _draft_input(verifier, probs, draft_logits)
        cpu = (tokens.cpu(), draft.cpu(), target.cpu(), u.cpu(), 1.0, alpha, beta)
        mine = verifier.torch_kernel(*cpu)
        expected = mine if large or not verifier.lossless else reference.verify_reference(*cpu)
        got = verifier.triton_kernel(tokens, draft, target, u, 1.0, alpha, beta).checked()
        if verifier.lossless:
            torch_mismatches.append(_mismatches(expected, mine)[0])
        else:  # how its acceptance differs from exact's on the same cases
            exact_cpu = (tokens.cpu(), probs.cpu(), target.cpu(), u.cpu())
            accepted["exact"] += VERIFIERS["exact"].torch_kernel(*exact_cpu).num_accepted.float().mean().item()
        accepted["kernel"] += got.num_accepted.float().mean().item()
        mismatch, tie = _mismatches(expected, got, cpu if verifier.lossless else None)
        mismatches.append(mismatch)
        ties += tie
    spec = ("torch path" if large else "reference") if verifier.lossless else f"{verifier.name} torch reference"
    bad = [m for m in mismatches if m]
    tied = f"; {ties} of {cases * batch} rows differ at a rounding tie (fp64 says either token may be drawn)" if ties else ""
    report.checks.append(Check(f"{verifier.name} kernel = {spec}", not bad, f"{cases - len(bad)}/{cases} cases identical" + (f"; {bad[0]}" if bad else "") + tied))
    report.figures["rounding_ties"] = ties
    if verifier.lossless and not large:
        bad_torch = [m for m in torch_mismatches if m]
        report.checks.append(Check(f"{verifier.name} torch path = reference", not bad_torch, f"{cases - len(bad_torch)}/{cases} cases identical" + (f"; {bad_torch[0]}" if bad_torch else "")))
    report.figures["mean_accepted_per_step"] = accepted["kernel"] / cases
    report.figures["acceptance_rate"] = accepted["kernel"] / cases / gamma
    return None if verifier.lossless else accepted["exact"] / cases / gamma


def _distribution(report: KernelReport, verifier, samples: int, alpha, beta, device, seed) -> None:
    """The first emitted token over `samples` draws on a small vocabulary: a lossless mode must follow the
    target (chi-square), a lossy one's distance to it is measured. On CUDA the compiled kernel draws them; on
    a CPU the interpreter (~25 ms a sequence) would take hours, so the torch path draws them: it was just
    shown to make the kernel's decisions."""
    on_gpu = torch.device(device).type == "cuda"
    gamma = report.gamma
    p, q = _small_pair(seed)
    fn = verifier.triton_kernel if on_gpu else verifier.torch_kernel
    as_input = (lambda d: torch.log(d)) if verifier.reads == LOGITS else (lambda d: d)  # logits of q: log q
    counts, n = _distribution_draws(lambda t, d, z, u: fn(t, as_input(d), z, u, 1.0, alpha, beta), p, q, samples,
                                    gamma, seed, device)
    tv = _tv(counts, p)
    if verifier.lossless:
        pvalue = chi_square_p(counts, p.double() * samples)
        drawn_by = "Triton kernel" if on_gpu else "torch path"
        report.checks.append(Check("output ~ target distribution", pvalue > P_VALUE_MIN, f"{samples} draws by the {drawn_by}, V={DIST_VOCAB}: TV {tv:.4f}, chi-square p = {pvalue:.3g} (pass: p > {P_VALUE_MIN})"))
        report.figures.update(tv_to_target=tv, chi_square_p=pvalue, distribution_drawn_by=drawn_by)
        return
    exact_counts, n_exact = _distribution_draws(VERIFIERS["exact"].torch_kernel, p, q, samples, gamma, seed, "cpu")
    report.figures.update(
        tv_to_target=tv,
        tv_exact_to_target=_tv(exact_counts, p),
        tv_draft_to_target=0.5 * (q - p).abs().sum().item(),
        acceptance_rate_small_vocab=n.float().mean().item() / gamma,
        acceptance_rate_exact_small_vocab=n_exact.float().mean().item() / gamma,
    )


# ----------------------------------------------------------------------------------------------------
# --compile-for: every kernel of a mode compiled for a GPU architecture, on this machine, without a GPU


@dataclass
class CompileReport:
    mode: str
    arch: str
    kernels: list[dict]  # one per (kernel, dtype, constexprs): ok, registers, spill_bytes, shared_bytes, seconds

    @property
    def passed(self) -> bool:
        return bool(self.kernels) and all(k["ok"] for k in self.kernels)

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def compile_for(mode: str, arch: str, progress=None) -> CompileReport:
    """Compile every plan of `mode` for `arch` (kernels/compile.py) in a child process that decorates the
    kernels for compilation (TRITON_INTERPRET=0), reading its one JSON line per kernel. Triton's cache is
    bypassed (TRITON_ALWAYS_COMPILE): ptxas reports registers and spills only when it runs."""
    import json
    import os
    import subprocess
    import sys

    options.one_of("--mode", mode, MODES)
    options.one_of("--compile-for", arch, tuple(compile_plans.ARCHS))
    step = progress or (lambda _msg: None)
    total = len(compile_plans.plans(arch, mode))
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DUMP_PTXAS_LOG": "1", "TRITON_ALWAYS_COMPILE": "1",
           "TRITON_DEFAULT_FP_FUSION": os.environ.get("TRITON_DEFAULT_FP_FUSION", "1")}
    child = subprocess.Popen([sys.executable, "-m", "specdec_cli.kernels.compile", arch, mode], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kernels = []
    for line in child.stdout:
        kernels.append(json.loads(line))
        step(f"compiled {len(kernels)}/{total} for {arch}")
    err = child.stderr.read()
    if child.wait() != 0:
        kernels.append({"kernel": "(the compiler process)", "ok": False, "error": err.strip().splitlines()[-1:] or "?"})
    return CompileReport(mode, arch, kernels)
