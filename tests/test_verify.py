"""Verification: every implementation against the reference on the same randomness, the exact ones
against the target distribution, structure and edge cases. The Triton kernels run where conftest.DEVICE says:
compiled on a GPU, under the interpreter on a CPU; the tests assert decisions, not which backend ran."""

import subprocess
import sys

import pytest
import torch

from conftest import DEVICE, ON_GPU_ONLY, on_device
from specdec_cli.bench.metrics import chi_square_p
from specdec_cli.decoding.verify import verify, verify_greedy
from specdec_cli.errors import NonFiniteLogitsError
from specdec_cli.kernels import exact, sigmoid, triton_backend_name
from specdec_cli.kernels.exact import verify_exact_torch
from specdec_cli.kernels.reference import verify_reference
from specdec_cli.kernels.sigmoid import verify_sigmoid_torch

verify_exact_triton = on_device(exact.verify_exact_triton)
verify_sigmoid_triton = on_device(sigmoid.verify_sigmoid_triton)
EXACT = {"torch": verify_exact_torch, "triton": verify_exact_triton}


def make_case(B, gamma, V, *, seed, scale=4.0, overlap=0.7, dtype=torch.float32):
    """Peaked, LM-like logits (scale ≥ 3: a few tokens carry the mass) and a correlated draft."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(B, gamma + 1, V, generator=g) * scale  # [B, γ+1, V]
    draft_logits = overlap * target[:, :gamma] + (1 - overlap) * scale * torch.randn(B, gamma, V, generator=g)
    draft_probs = draft_logits.softmax(-1)  # [B, γ, V]
    tokens = torch.multinomial(draft_probs.reshape(-1, V), 1, generator=g).reshape(B, gamma)  # [B, γ]
    uniforms = 1 - torch.rand(B, gamma + 1, generator=g)  # (0, 1]
    return tokens, draft_probs, target.to(dtype), uniforms, draft_logits


def assert_same(expected, got, what):
    (e_tok, e_n), (g_tok, g_n) = expected[:2], got[:2]
    bad = (e_tok != g_tok).any(dim=1).nonzero()[:, 0].tolist()
    assert not bad, f"{what}: rows {bad[:5]} differ, e.g. reference {e_tok[bad[0]].tolist()} vs {g_tok[bad[0]].tolist()}"
    assert torch.equal(e_n, g_n)


# --- decisions: the same randomness gives the same tokens ------------------------------------------


@pytest.mark.parametrize("V", [7, 1000, 32000, 51865, pytest.param(151936, marks=pytest.mark.slow),
                               pytest.param(262144, marks=pytest.mark.slow)])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_exact_matches_reference(V, impl):
    cases = [(3, 5), (1, 1), (2, 8)] if V <= 32000 else [(1, 4), (2, 2)]
    for i, (B, gamma) in enumerate(cases):
        args = make_case(B, gamma, V, seed=V + i)[:4]
        assert_same(verify_reference(*args), EXACT[impl](*args), f"exact/{impl} V={V} B={B} γ={gamma}")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_exact_dtypes_and_temperature(dtype, temperature):
    for seed in range(3):
        args = make_case(4, 6, 5003, seed=seed, dtype=dtype)[:4]
        expected = verify_reference(*args, temperature=temperature)
        for impl, fn in EXACT.items():
            assert_same(expected, fn(*args, temperature=temperature), f"exact/{impl} {dtype} T={temperature}")


@pytest.mark.slow
def test_many_random_cases_torch_and_triton_agree():
    # 300 sequences of every acceptance length; the interpreter runs them as one launch
    args = make_case(300, 4, 300, seed=7, overlap=0.8)[:4]
    expected = verify_reference(*args)
    assert len(set(expected[1].tolist())) == 5, "cases should cover every accepted count 0..γ"
    assert_same(expected, verify_exact_torch(*args), "exact/torch")
    assert_same(expected, verify_exact_triton(*args), "exact/triton")


@pytest.mark.parametrize("gamma", [1, 17, 32])
def test_exact_any_gamma(gamma):
    args = make_case(2, gamma, 257, seed=gamma, overlap=0.95)[:4]
    expected = verify_reference(*args)
    for impl, fn in EXACT.items():
        assert_same(expected, fn(*args), f"exact/{impl} γ={gamma}")


def test_baseline_decides_like_reference():
    args = make_case(64, 5, 2000, seed=3)
    tokens, probs, target, u, _ = args
    ref = verify_reference(tokens, probs, target, u)
    base = verify("baseline", tokens, probs, target, u)
    assert torch.equal(base.num_accepted, ref[1])
    n = ref[1]
    accepted = torch.arange(5)[None, :] < n[:, None]
    assert torch.equal(base.out_tokens[:, :5][accepted], ref[0][:, :5][accepted])


@pytest.mark.slow
def test_sigmoid_triton_matches_its_torch_twin():
    for seed, (alpha, beta) in enumerate([(-1e4, 1e4), (-1e3, 1e3), (-2.0, 2.0), (-0.5, 0.5)]):
        tokens, _, target, u, draft_logits = make_case(40, 5, 3001, seed=seed, overlap=0.3)
        expected = verify_sigmoid_torch(tokens, draft_logits, target, u, 1.0, alpha, beta)
        got = verify_sigmoid_triton(tokens, draft_logits, target, u, 1.0, alpha, beta)
        assert_same(expected, got, f"sigmoid α={alpha}")
    assert (expected[1] < 5).any(), "a narrow α..β must reject some drafts"


# --- distribution: the first emitted token is distributed as the target's ---------------------------

PAIRS = {
    # name: (target p, draft q) over a vocabulary of 6
    "random": ([0.30, 0.25, 0.20, 0.15, 0.07, 0.03], [0.05, 0.10, 0.40, 0.05, 0.25, 0.15]),
    "identical": ([0.4, 0.3, 0.1, 0.1, 0.05, 0.05], [0.4, 0.3, 0.1, 0.1, 0.05, 0.05]),
    "disjoint": ([0.5, 0.5, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.25, 0.25, 0.25, 0.25]),
    "one-hot target": ([0.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2, 0.1, 0.1]),
    "draft misses target's favourites": ([0.45, 0.35, 0.1, 0.1, 0.0, 0.0], [0.0, 0.0, 0.5, 0.1, 0.2, 0.2]),
}


def draws(p, q, n, gamma, seed):
    """n independent verification steps; returns the first emitted token of each."""
    g = torch.Generator().manual_seed(seed)
    p, q = torch.tensor(p), torch.tensor(q)
    target = torch.log(p).expand(n, gamma + 1, -1).contiguous()  # log 0 = −inf: masked
    draft_probs = q.expand(n, gamma, -1).contiguous()
    tokens = torch.multinomial(q, n * gamma, replacement=True, generator=g).reshape(n, gamma)
    uniforms = 1 - torch.rand(n, gamma + 1, generator=g)
    return tokens, draft_probs, target, uniforms


def first_token_frequencies(fn, p, q, n, seed, gamma=3):
    out, _, *_ = fn(*draws(p, q, n, gamma, seed))
    return torch.bincount(out[:, 0], minlength=len(p)).double() / n


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS)
def test_exact_reproduces_target_distribution(pair):
    # 200 000 draws; threshold: TV < 0.005 (expected ≈ 0.002 here) and chi-square p > 1e-4 on the support
    p, q = PAIRS[pair]
    n = 200_000
    assert_fits_target(first_token_frequencies(verify_exact_torch, p, q, n, seed=11), p, n, pair)


def assert_fits_target(freq, p, n, what):
    """Frequencies of n emitted tokens against the target p: TV < 0.005 (expected ≈ 0.002 at n = 200 000), no
    token of probability 0, chi-square p > 1e-4 on the support."""
    p = torch.tensor(p, dtype=torch.float64)
    tv = 0.5 * (freq - p).abs().sum().item()
    assert tv < 0.005, f"{what}: TV {tv:.4f} between emitted tokens and the target"
    assert freq[p == 0].sum() == 0, f"{what}: a token the target gives probability 0 was emitted"
    support = p > 0
    if support.sum() > 1:
        pvalue = chi_square_p(freq[support] * n, p[support] * n)
        assert pvalue > 1e-4, f"{what}: chi-square p = {pvalue:.2e}"


@ON_GPU_ONLY
@pytest.mark.parametrize("pair", PAIRS)
def test_exact_triton_reproduces_target_distribution(pair):
    # 200 000 draws by the compiled kernel, the torch path's thresholds
    p, q = PAIRS[pair]
    n = 200_000
    assert_fits_target(first_token_frequencies(verify_exact_triton, p, q, n, seed=5), p, n, pair)


# the bonus row's p of each class of rows (V = 6): each its own favourite token; the draft rows before it favour
# token 5, which no bonus row does, so a bonus drawn from a draft row or from another sequence's row shows
BONUS_P = [[0.5 if x == k else 0.1 for x in range(6)] for k in range(4)]
DRAFT_P = [0.05, 0.05, 0.05, 0.05, 0.05, 0.75]


def bonus_case(n, gamma, seed):
    """n sequences of each class, interleaved (sequence b of class b % 4), every draft token accepted: q = p at
    the draft rows and their uniforms ≤ 0.99 (u·q(x) ≤ p(x) whatever rounds p). -> the contract's inputs."""
    g = torch.Generator().manual_seed(seed)
    B = 4 * n
    p = torch.tensor(DRAFT_P).expand(B, gamma, -1)  # [B, γ, V]
    bonus = torch.tensor(BONUS_P).repeat(n, 1)[:, None]  # [B, 1, V]: row b has class b % 4
    target = torch.log(torch.cat([p, bonus], dim=1)).contiguous()  # [B, γ+1, V]
    tokens = torch.multinomial(torch.tensor(DRAFT_P), B * gamma, replacement=True, generator=g).reshape(B, gamma)
    u = 1 - torch.rand(B, gamma + 1, generator=g)
    u[:, :gamma] *= 0.99
    return tokens, p.contiguous(), target, u


@pytest.mark.parametrize("impl, n", [("reference", 1000), ("torch", 2000), pytest.param(
    "triton", 100 if DEVICE == "cpu" else 20_000, marks=pytest.mark.slow if DEVICE == "cpu" else ())])
def test_bonus_token_is_drawn_from_its_own_row(impl, n):
    """Every draft accepted, so every sequence emits a bonus token from its own row γ; the 4 classes of rows
    have different bonus distributions (BONUS_P), measured class by class: n draws each (the interpreter pays
    ~20 ms a sequence: 100 there, slow), chi-square p > 1e-4 per class (5 degrees of freedom: χ² < 25.7). A
    bonus drawn from another class's row has noncentrality 1.92·n, from a draft row 4.73·n: at n = 100 each
    passes with chance < 1e-18 (scipy.stats.ncx2)."""
    fn = {"reference": verify_reference, **EXACT}[impl]
    gamma = 2
    out, k, *_ = fn(*bonus_case(n, gamma, seed=8))
    assert (k == gamma).all(), "every draft token is accepted"
    bonus = out[:, gamma].view(n, 4)  # [n, class]
    for cls in range(4):
        counts = torch.bincount(bonus[:, cls], minlength=6).double()
        p = torch.tensor(BONUS_P[cls], dtype=torch.float64)
        assert chi_square_p(counts, p * n) > 1e-4, f"class {cls}: bonus tokens {counts.tolist()} against {p.tolist()}"


def test_baseline_reproduces_target_distribution():
    p, q = PAIRS["random"]
    n = 200_000
    g = torch.Generator().manual_seed(1)
    tokens, draft_probs, target, u = draws(p, q, n, 3, seed=2)
    firsts = []
    for rows in torch.arange(n).split(2000):  # baseline seeds one multinomial per call: many calls
        u_rows = u[rows].clone()
        u_rows[:, -1] = 1 - torch.rand(len(rows), generator=g)
        firsts.append(verify("baseline", tokens[rows], draft_probs[rows], target[rows], u_rows).out_tokens[:, 0])
    freq = torch.bincount(torch.cat(firsts), minlength=6).double() / n
    tv = 0.5 * (freq - torch.tensor(p, dtype=torch.float64)).abs().sum().item()
    assert tv < 0.005, f"TV {tv:.4f}"


def test_sigmoid_moves_the_distribution_and_says_so():
    # not an assertion of correctness: the approximation is lossy. It must move the output measurably.
    p, q = PAIRS["random"]
    tokens, draft_probs, target, u = draws(p, q, 20_000, 3, seed=4)
    out, n, *_ = verify_sigmoid_torch(tokens, torch.log(draft_probs), target, u)
    freq = torch.bincount(out[:, 0], minlength=6).double() / len(out)
    tv = 0.5 * (freq - torch.tensor(p, dtype=torch.float64)).abs().sum().item()
    assert tv > 0.05, f"sigmoid with α=−1e4, β=1e4 should move the output; TV was {tv:.4f}"
    assert n.float().mean() > 2.9, "with α=−1e4, β=1e4 almost every draft token is accepted"


# --- structure and edge cases -------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["reference", "torch", "triton", "baseline"])
def test_structure(impl):
    gamma = 4
    tokens, probs, target, u, _ = make_case(50, gamma, 500, seed=9, overlap=0.8)
    fn = {
        "reference": verify_reference,
        "baseline": lambda *a: verify("baseline", *a),
        **EXACT,
    }[impl]
    out, n, *_ = fn(tokens, probs, target, u)
    assert out.shape == (50, gamma + 1) and n.shape == (50,)
    for b in range(50):
        k = int(n[b])
        assert 0 <= k <= gamma
        assert out[b, :k].tolist() == tokens[b, :k].tolist(), "accepted tokens are the draft's"
        assert out[b, k] >= 0, "one token is always emitted after the accepted ones"
        assert (out[b, k + 1 :] == -1).all(), "−1 after the emitted tokens"
        if k < gamma:
            assert probs[b, k, out[b, k]] < torch.softmax(target[b, k].float(), -1)[out[b, k]] + 1e-6, (
                "a resampled token comes from the residual max(0, p − q)"
            )


@pytest.mark.parametrize("impl", ["reference", "torch", "triton"])
def test_zero_draft_probability_is_never_accepted(impl):
    fn = {"reference": verify_reference, **EXACT}[impl]
    tokens, probs, target, _, _ = make_case(8, 3, 50, seed=1)
    probs = probs.clone()
    probs[:, 0].scatter_(-1, tokens[:, :1], 0.0)  # the first draft token had probability 0
    u = torch.full((8, 4), 1e-9)  # the smallest uniforms accept anything that can be accepted
    _, n, *_ = fn(tokens, probs, target, u)
    assert (n == 0).all()


@pytest.mark.parametrize("impl", ["reference", "torch", "triton"])
def test_all_zero_residual_falls_back_to_p(impl):
    # q = 1.5 p (not a distribution, but it makes max(0, p − q) zero everywhere while rejecting u > 2/3)
    fn = {"reference": verify_reference, **EXACT}[impl]
    V = 64
    target = torch.randn(4, 3, V) * 2
    probs = 1.5 * torch.softmax(target[:, :2], -1)
    tokens = torch.zeros(4, 2, dtype=torch.int64)
    u = torch.tensor([[0.9, 0.5, 0.3], [0.9, 0.5, 0.6], [0.9, 0.5, 0.9], [0.9, 0.5, 1.0]])
    out, n, *_ = fn(tokens, probs, target, u)
    assert (n == 0).all()
    assert ((out[:, 0] >= 0) & (out[:, 0] < V)).all()
    assert_same(verify_reference(tokens, probs, target, u), (out, n), impl)


@pytest.mark.parametrize("impl", ["reference", "torch", "triton", "baseline"])
@pytest.mark.parametrize("poison", ["nan", "inf", "all-masked"])
def test_non_finite_logits_are_reported(impl, poison):
    tokens, probs, target, u, _ = make_case(2, 3, 100, seed=2)
    if poison == "all-masked":
        target[1, 0] = float("-inf")
    else:
        target[1, 0, 17] = float(poison)
    fn = {
        "reference": verify_reference,
        "baseline": lambda *a: verify("baseline", *a),
        **EXACT,
    }[impl]
    with pytest.raises(NonFiniteLogitsError):
        fn(tokens, probs, target, u)


def test_masked_tokens_are_allowed_and_never_emitted():
    tokens, probs, target, u, _ = make_case(16, 3, 100, seed=4)
    target[:, :, 50:] = float("-inf")  # top-k style mask
    probs = probs.clone()
    probs[:, :, 50:] = 0
    probs /= probs.sum(-1, keepdim=True)
    tokens = tokens % 50
    for fn in (verify_reference, *EXACT.values()):
        out, *_ = fn(tokens, probs, target, u)
        assert (out < 50).all()


def test_sigmoid_reports_nan_in_what_it_reads():
    tokens, _, target, u, draft_logits = make_case(2, 3, 100, seed=2)
    target[:, 0] = float("nan")
    for fn in (verify_sigmoid_torch, verify_sigmoid_triton):
        with pytest.raises(NonFiniteLogitsError):
            fn(tokens, draft_logits, target, u)


def test_greedy_accepts_the_agreeing_prefix():
    target = torch.full((2, 4, 5), -1.0)
    best = torch.tensor([[1, 2, 3, 4], [0, 0, 0, 0]])
    target.scatter_(-1, best[..., None], 5.0)
    tokens = torch.tensor([[1, 2, 0], [0, 0, 0]])
    v = verify_greedy(tokens, target)
    assert v.num_accepted.tolist() == [2, 3]
    assert v.out_tokens.tolist() == [[1, 2, 3, -1], [0, 0, 0, 0]]
    target[0, 3, 0] = float("nan")
    with pytest.raises(NonFiniteLogitsError):
        verify_greedy(tokens, target)


def test_verify_reports_its_backend():
    tokens, probs, target, u, logits = make_case(1, 2, 50, seed=0)
    assert verify("exact", tokens, probs, target, u, backend="torch").backend == "torch"
    args = [t.to(DEVICE) for t in (tokens, probs, target, u)]
    kernel = triton_backend_name()  # "triton" where it compiles for a GPU, "triton-interpreter" on a CPU
    assert verify("exact", *args, backend="triton").backend == kernel
    sig_args = [t.to(DEVICE) for t in (tokens, logits, target, u)]
    assert verify("sigmoid", *sig_args, backend="triton").backend == kernel


def test_kernels_is_not_a_top_level_package(tmp_path):
    # transformers probes for Hugging Face's `kernels` package by that name; ours must not answer
    code = (
        "import importlib.util, specdec_cli.kernels;"
        "from transformers.utils import is_kernels_available;"
        "print(importlib.util.find_spec('kernels') is None, is_kernels_available())"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr


# --- a step a CUDA graph can hold: strides, error flags, the custom op ------------------------------


def test_inputs_are_read_through_their_strides():
    """A vocabulary slice (decoding.draft.fit_vocab) and a draft read out of a wider tensor are not copied."""
    tokens, probs, target, u, _ = make_case(3, 4, 1000, seed=3)
    wide = torch.full((3, 5, 1013), -30.0)
    wide[..., :1000] = target
    wider_probs = torch.zeros(3, 6, 1000)
    wider_probs[:, 1:5] = probs
    got = verify_exact_triton(tokens, wider_probs[:, 1:5], wide[..., :1000], u)
    assert_same(verify_reference(tokens, probs, target, u), got, "strided inputs")


@pytest.mark.parametrize("poison, bit", [("nan", 1), ("all-masked", 2)])
def test_errors_wait_in_a_flag_until_the_caller_reads_them(poison, bit):
    tokens, probs, target, u, _ = make_case(2, 3, 64, seed=1)
    target[1, 2] = float("nan") if poison == "nan" else float("-inf")
    u = torch.full_like(u, 1e-9)  # every draft token that can pass does: the decision reads row 2
    args = [t.to(DEVICE) for t in (tokens, probs, target, u)]
    error = exact.verify_exact_triton(*args).counts[1].cpu()  # no raise
    assert error[0] == 0 and error[1] & bit  # (a row of NaN also reads as all masked: both bits)
    with pytest.raises(NonFiniteLogitsError):
        exact.verify_exact_triton(*args).checked()
    verified = verify("exact", *args, backend="triton")
    with pytest.raises(NonFiniteLogitsError):
        verified.accepted()  # the counts and the flags, read in one copy


def test_the_kernel_is_a_torch_custom_op_with_a_fake():
    tokens, probs, target, u, _ = make_case(2, 3, 300, seed=2)
    args = [t.to(DEVICE) for t in (tokens, probs, target, u)]
    torch.library.opcheck(torch.ops.specdec.verify_triton.default, (*args, 1.0, False, 0.0, 1.0),
                          test_utils=("test_schema", "test_faketensor"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in args]
        out, counts = torch.ops.specdec.verify_triton(*fake, 1.0, False, 0.0, 1.0)
    assert (out.shape, counts.shape, counts.dtype) == ((2, 4), (2, 2), torch.int64)


def test_torch_compile_holds_the_step_in_one_graph():
    """fullgraph: the custom op traces without a graph break (the fake gives its shapes, no host sync)."""
    tokens, probs, target, u, _ = make_case(2, 3, 300, seed=4)
    args = [t.to(DEVICE) for t in (tokens, probs, target, u)]

    def step(tokens, probs, target, u):
        return torch.ops.specdec.verify_triton(tokens, probs, target * 1.0, u, 1.0, False, 0.0, 1.0)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(*args), step(*args)):
        assert torch.equal(got, want)

    def public(tokens, probs, target, u):  # what the loop calls: the op while traced, a plain launch otherwise
        v = exact.verify_exact_triton(tokens, probs, target * 1.0, u)
        return v.out_tokens, v.num_accepted, v.counts

    compiled = torch.compile(public, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(*args), public(*args)):
        assert torch.equal(got, want)


def test_what_a_compile_depends_on_is_bounded():
    """γ changes every round with adaptive schedules, B as sequences finish: neither may recompile the kernels
    round after round. γ is not specialised (do_not_specialize) and SPLITS is a runtime argument; the
    compile-time constants take few values over every γ ≤ 32 and B ≤ 64 (powers of two)."""
    import ast
    import inspect

    import triton

    from specdec_cli import options
    from specdec_cli.kernels.compile import ARCHS

    tree = ast.parse(inspect.getsource(exact))
    kernels = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.endswith("_kernel")}
    assert set(kernels) == {"_row_stats_kernel", "_accept_draw_kernel"}
    for name, f in kernels.items():
        (deco,) = f.decorator_list
        assert ast.unparse(deco) == "triton.jit(do_not_specialize=['gamma'])", name
        constexprs = {a.arg for a in f.args.args if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)}
        assert constexprs == ({"BLOCK"} if name == "_row_stats_kernel" else {"GAMMA_P2", "SPLITS_P2", "BLOCK", "SIGMOID", "ONE_HOT"})
    for _, sms in ARCHS.values():
        keys = {(triton.next_power_of_2(g + 1), triton.next_power_of_2(exact._plan(V, b, None, False, sms)[1]))
                for g in range(1, options.MAX_GAMMA + 1) for b in range(1, 65) for V in (32000, 151936)}
        assert len(keys) <= 6 * 7


# --- inputs at the edge of the contract, handled alike by every backend ----------------------------------


def _every_kernel():
    """(name, fn) of every implementation of every mode: the torch ones, and the Triton ones where DEVICE says."""
    from specdec_cli.decoding.verify import VERIFIERS

    for name, v in VERIFIERS.items():
        yield f"{name}/torch", v, v.torch_kernel
        if v.triton_kernel is not None:
            yield f"{name}/triton", v, on_device(v.triton_kernel)


@pytest.mark.parametrize("bad", [-1, 100, 10**6])
def test_draft_ids_outside_the_vocabulary_are_refused_alike(bad):
    """An id outside [0, V) (a −1 placeholder, one past V) is refused in one line by every backend: the torch ones
    check, the Triton kernel raises its flag and never reads the neighbouring row (it would have accepted it)."""
    from specdec_cli.errors import InvalidDraftTokensError

    tokens, probs, target, u, logits = make_case(2, 3, 100, seed=8)
    target[:] = -20.0
    target[..., 99] = 10.0  # peaked: a read of the next row's logit at 99 would accept
    tokens = torch.tensor([[99, 99, bad], [1, 2, 3]])
    for name, v, fn in _every_kernel():
        for draft in ((logits,) if v.reads == "logits" else (probs, None)):
            with pytest.raises(InvalidDraftTokensError, match="outside"):
                fn(tokens, draft, target, u).checked() if name.endswith("torch") else fn(tokens, draft, target, u)


def test_an_all_masked_row_that_is_never_read_is_not_judged():
    """Rule: only the rows a decision reads are judged (the accepted positions and the drawn row): a row of −inf
    after the first rejection changes nothing and is not reported, by any backend; the same row where it is read
    is refused by all."""
    tokens, probs, target, _, logits = make_case(2, 2, 50, seed=9)
    target[:, 0] = -30.0
    target[:, 0, 7] = 5.0  # every draft token but 7 is rejected at position 0...
    tokens[:, 0] = 1
    target[:, 2] = float("-inf")  # ...so the bonus row is never read
    expected = verify_reference(tokens, probs, target, torch.ones(2, 3))
    for _, v, fn in _every_kernel():
        draft = logits if v.reads == "logits" else probs
        got = fn(tokens, draft, target, torch.ones(2, 3))
        assert got.num_accepted.tolist() == [0, 0] and got.out_tokens[:, 0].tolist() == [7, 7]
        if v.lossless:
            assert_same(expected, got, "an unread masked row")
    target[:, 0] = float("-inf")  # now the drawn row itself is all −inf
    for _, v, fn in _every_kernel():
        with pytest.raises(NonFiniteLogitsError):
            fn(tokens, logits if v.reads == "logits" else probs, target, torch.ones(2, 3))


def test_gamma_zero_is_a_plain_draw_everywhere():
    """γ = 0: no draft token, every backend returns the bonus token drawn from row 0 (the same token where the
    draw is by inverse CDF with the same uniform; baseline draws from the same distribution by multinomial)."""
    g = torch.Generator().manual_seed(11)
    target = torch.randn(3, 1, 40, generator=g) * 3
    u = 1 - torch.rand(3, 1, generator=g)
    tokens, empty = torch.empty(3, 0, dtype=torch.int64), torch.empty(3, 0, 40)
    expected = verify_reference(tokens, empty, target, u)
    for name, v, fn in _every_kernel():
        got = fn(tokens, empty, target, u)
        assert got.num_accepted.tolist() == [0, 0, 0] and got.out_tokens.shape == (3, 1), name
        if v.lossless and not name.startswith("baseline"):
            assert_same(expected, got, name)
    one_hot = torch.full((3, 1, 40), float("-inf"))
    one_hot[:, 0, 5] = 0.0
    for name, _, fn in _every_kernel():
        assert fn(tokens, empty, one_hot, u).out_tokens.tolist() == [[5]] * 3, name
