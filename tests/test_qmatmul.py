"""The GGUF-block matmul (kernels/qmatmul.cpp): the block layouts against gguf's own dequantizers, values against
the fp32 dequantized product within what its arithmetic allows, and the property speculation needs: a row's bits do
not depend on the other rows, on M, on the thread count or on the SIMD path (the torch twin included)."""

from __future__ import annotations

import platform
import shutil

import numpy as np
import pytest
import torch

from conftest import torch_threads, unbuildable
from specdec_cli.errors import SpecdecWarning
from specdec_cli.kernels import cpp, qmatmul
from specdec_cli.kernels import gguf_blocks as gb

TYPES = list(gb.TYPES)
ROWS = (1, 2, 5, 8, 9, 16, 33)  # K-quants: in registers up to 16 rows (tiles of ≤ 12, Q6_K 8), more an L1 buffer


def shape(name):
    """Awkward shapes: N not a multiple of the 64-row tile (and over one tile), K a few blocks (not a multiple of
    256 where the type allows; for the K-quants an odd number of groups: the minimums' last 16 lanes half empty)."""
    return (67, 768) if name.endswith("_k") else (67, 96)


def paths_here() -> list[str]:
    ext = qmatmul.extension()
    best = ext.best_path() if ext is not None else 0
    return ["torch"] + [p for p, n in qmatmul.PATHS.items() if n <= best]


@pytest.mark.parametrize("name", TYPES)
def test_layouts_match_gguf(name):
    import gguf

    N, K = shape(name)
    blocks = gb.random_blocks(name, N, K, seed=3)
    theirs = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType(gb.type_id(name))).reshape(N, K)
    assert np.array_equal(gb.dequantize(name, blocks, N, K).numpy(), theirs)


def tolerance(x, blocks, name, N, K):
    """Per output: what the rounded activations may move (half a step amax / Q of each group, Q = 127 for the
    K-quants' int8, 32767 for the int16 of the others, and the step's own rounding) plus fp32 rounding over the
    groups, the lanes' tree and the scale products, on Σ|w·x|."""
    w = gb.dequantize(name, blocks, N, K).double().abs()
    G, Q = (256, 127) if name.endswith("_k") else (32, 32767)
    amax = x.double().abs().reshape(x.shape[0], K // G, G).amax(-1)
    step = (amax / Q / 2 + amax * 2.0**-22).repeat_interleave(G, 1)  # [M, K]
    steps = (K // G + K // 32 // 16 + 16) * 2.0**-23
    return step @ w.T + steps * (x.double().abs() @ w.T) + 1e-30


@pytest.mark.parametrize("name", TYPES)
def test_values_against_the_dequantized_product(name):
    N, K = shape(name)
    blocks = gb.random_blocks(name, N, K, seed=1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(33, K, generator=g)
    x[:, 5] *= 40  # an outlier column, as LLM activations have
    want = qmatmul.reference_mm(x, blocks, name, N, K)
    tol = tolerance(x, blocks, name, N, K)
    for M in ROWS:
        got = qmatmul.gguf_mm(x[:M], blocks, name, N, K).double()
        assert ((got - want[:M]).abs() <= tol[:M]).all(), (M, ((got - want[:M]).abs() / tol[:M]).max())


@pytest.mark.parametrize("name", TYPES)
def test_a_row_does_not_depend_on_the_others(name):
    N, K = shape(name)
    blocks = gb.random_blocks(name, N, K, seed=2)
    x = torch.randn(40, K)
    batch = qmatmul.gguf_mm(x, blocks, name, N, K)  # 40 rows: two row tiles
    for M in (3, 8, 9, 12, 16, 17, 33):
        assert torch.equal(qmatmul.gguf_mm(x[:M], blocks, name, N, K), batch[:M])
        assert torch.equal(qmatmul.gguf_mm(x[7:7 + M], blocks, name, N, K), batch[7:7 + M])
    alone = torch.cat([qmatmul.gguf_mm(x[i:i + 1], blocks, name, N, K) for i in range(40)])
    assert torch.equal(alone, batch)


@pytest.mark.parametrize("name", ["q4_k", "q6_k", "q5_0", "q8_0"])
def test_threads_do_not_change_bits(name):
    N, K = 300, 512
    blocks = gb.random_blocks(name, N, K, seed=4)
    x = torch.randn(9, K, dtype=torch.bfloat16)
    with torch_threads(1):
        one = qmatmul.gguf_mm(x, blocks, name, N, K)
    with torch_threads(2):
        two = qmatmul.gguf_mm(x, blocks, name, N, K)
    assert torch.equal(one, two)


@pytest.mark.parametrize("name", TYPES)
def test_every_path_gives_the_same_bits(name):
    """The portable C++, AVX2 and AVX-512 paths this CPU can run, and the torch twin (the fallback)."""
    N, K = shape(name)
    blocks = gb.random_blocks(name, N, K, seed=5)
    bias = torch.randn(N)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(9, K).to(dtype)
        outs = {p: qmatmul.gguf_mm(x, blocks, name, N, K, bias=bias, path=p) for p in paths_here()}
        first = outs["torch"]
        assert first.dtype == dtype
        for p, y in outs.items():
            assert torch.equal(y, first), p


def test_leading_dims_bias_and_zero_rows():
    N, K = 40, 256
    blocks = gb.random_blocks("q4_k", N, K)
    x = torch.randn(2, 3, K, dtype=torch.bfloat16)
    bias = torch.randn(N)
    y = qmatmul.gguf_mm(x, blocks, "q4_k", N, K, bias=bias)
    assert y.shape == (2, 3, N) and y.dtype == torch.bfloat16
    flat = qmatmul.gguf_mm(x.reshape(6, K).float(), blocks, "q4_k", N, K) + bias
    assert torch.equal(y.reshape(6, N), flat.to(torch.bfloat16))
    assert qmatmul.gguf_mm(torch.zeros(0, K), blocks, "q4_k", N, K).shape == (0, N)
    assert torch.equal(qmatmul.gguf_mm(torch.zeros(1, K), blocks, "q4_k", N, K), torch.zeros(1, N))


def test_k_must_fill_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 256"):
        gb.row_bytes("q4_k", 96)
    ext = qmatmul.extension()
    if ext is not None:
        with pytest.raises(RuntimeError, match="multiple of 256"):
            ext.mm(torch.zeros(1, 96), torch.zeros(1, 54, dtype=torch.uint8), gb.type_id("q4_k"), 1, 96, None, 0)


def test_a_failed_build_falls_back_to_the_twin(monkeypatch):
    N, K = 20, 256
    blocks = gb.random_blocks("q6_k", N, K)
    x = torch.randn(3, K)
    want = qmatmul.gguf_mm(x, blocks, "q6_k", N, K)
    unbuildable(monkeypatch, qmatmul)
    with pytest.warns(SpecdecWarning) as said:
        assert torch.equal(qmatmul.gguf_mm(x, blocks, "q6_k", N, K), want)
        qmatmul.gguf_mm(x, blocks, "q6_k", N, K)  # said once
    assert len(said) == 1
    line = str(said[0].message)
    assert "did not build" in line and "c++: not found" in line and "\n" not in line
    assert qmatmul.backend_line().startswith("torch twin")


def test_the_build_is_keyed_and_cached(monkeypatch, tmp_path):
    if shutil.which("c++") and platform.machine() in ("x86_64", "AMD64"):  # then it builds (the twin is no excuse)
        assert qmatmul.extension() is not None, qmatmul.KERNEL.error
        assert qmatmul.KERNEL.cached() and qmatmul.KERNEL.folder().name.endswith(qmatmul.KERNEL.key())
    key = qmatmul.KERNEL.key()
    assert len(key) == 16 and key == qmatmul.KERNEL.key()
    other = cpp.Extension("qmatmul", qmatmul.SOURCE, ["-O2"], "")
    assert other.key() != key  # the flags are in the key
    assert qmatmul.backend_line()  # one line naming the path
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECDEC_KERNEL_CACHE", raising=False)
    assert cpp.cache_root() == tmp_path and cpp.kernels_dir() == tmp_path / "kernels"
    assert not qmatmul.KERNEL.cached()  # nothing built under this cache: a GGUF model's load would build it
    monkeypatch.setenv("SPECDEC_KERNEL_CACHE", str(tmp_path / "builds"))
    assert qmatmul.KERNEL.folder().parent == tmp_path / "builds"  # whatever the model cache


def test_a_kernels_build_command_does_not_depend_on_the_kernels_built_before_it(monkeypatch, tmp_path):
    """torch's cpp_extension.load appends its libraries to the flag lists it is given; each build gets lists of its
    own, so a kernel's command (ninja rebuilds when it changes) is the same whichever kernels a process built first."""
    from torch.utils import cpp_extension

    seen = []

    def load(**kw):  # as torch's load does to its arguments
        seen.append((list(kw["extra_cflags"]), list(kw["extra_ldflags"])))
        kw["extra_ldflags"].append("-ltorch_cpu")
        kw["extra_cflags"].append("-DX")

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setenv("SPECDEC_KERNEL_CACHE", str(tmp_path))
    a, b = (cpp.Extension(n, qmatmul.SOURCE, ["-O2"], "") for n in ("a", "b"))
    a.build(), b.build(), a.build()
    assert seen[0] == seen[1] == seen[2] == (["-O2", *cpp.OPENMP], cpp.OPENMP) and cpp.OPENMP == ["-fopenmp"]


def test_a_second_install_of_the_same_sources_builds_nothing_again(monkeypatch, tmp_path):
    """A build compiles its folder's copy of the source and headers, so another install of the same text (make gpu's
    build/gpu, a second clone) gives the same command and finds that build. Naming the install's own file, the
    command changed with the install and ninja rebuilt the kernel for each in turn (the suite's make gpu test rebuilt
    five kernels, then the Ray actors rebuilt them back)."""
    from torch.utils import cpp_extension

    seen = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: seen.append(kw["sources"]))
    monkeypatch.setenv("SPECDEC_KERNEL_CACHE", str(tmp_path / "kernels"))
    installs = []
    for where in ("checkout", "build-gpu"):
        (tmp_path / where).mkdir()
        for f in [qmatmul.SOURCE, *qmatmul.KERNEL.headers()]:
            shutil.copy(f, tmp_path / where / f.name)
        installs.append(cpp.Extension("qmatmul", tmp_path / where / qmatmul.SOURCE.name, ["-O3"], ""))
    a, b = installs
    assert a.folder() == b.folder()
    a.build()
    copy = a.folder() / qmatmul.SOURCE.name
    stamp = copy.stat().st_mtime_ns
    b.build()
    assert seen == [[str(copy)], [str(copy)]]
    assert copy.read_bytes() == qmatmul.SOURCE.read_bytes() and copy.stat().st_mtime_ns == stamp  # not rewritten
    assert all((a.folder() / h.name).read_bytes() == h.read_bytes() for h in qmatmul.KERNEL.headers())


def test_load_all_builds_the_uncached_kernels_side_by_side(monkeypatch, tmp_path):
    """load_all builds what the cache lacks, `workers` builds at once, then loads the rest: two builds that must
    meet at a barrier both finish only when they run side by side (one after another, the first waits out the
    timeout and fails). A cached kernel is only loaded (torch's load() finds its build: no barrier here)."""
    import threading

    monkeypatch.setenv("SPECDEC_KERNEL_CACHE", str(tmp_path))
    kernels = [cpp.Extension(f"k{i}", qmatmul.SOURCE, [f"-DK{i}"], "") for i in range(5)]
    kernels[0].folder().mkdir(parents=True)
    (kernels[0].folder() / "k0.so").touch()  # cached
    meet, built = threading.Barrier(2, timeout=20), []
    for k in kernels[1:]:
        monkeypatch.setattr(k, "build", lambda k=k: (meet.wait(), built.append(k.name)))
    monkeypatch.setattr(kernels[0], "build", lambda: built.append("k0 loaded") or "k0")
    cpp.load_all(kernels, workers=2)
    assert sorted(built[:4]) == ["k1", "k2", "k3", "k4"] and built[4:] == ["k0 loaded"]
    assert all(k.module() is not None for k in kernels)


def test_the_key_holds_the_headers_a_source_includes(tmp_path):
    """A header the source includes (`#include "bf16_bits.h"`), and one that header includes, is in the key: editing
    it rebuilds every kernel that includes it, and the package ships it beside the sources."""
    from specdec_cli.kernels import rows_attention

    assert qmatmul.SOURCE.with_name("bf16_bits.h") in qmatmul.KERNEL.headers()
    included = ("aligned64.h", "simd16.h", "bf16_bits.h")  # the last one by simd16.h
    assert rows_attention.KERNEL.headers() == [rows_attention.SOURCE.with_name(n) for n in included]
    (tmp_path / "rule.h").write_text('#include "base.h"\n// one rule\n')
    (tmp_path / "base.h").write_text("// under the rule\n")
    source = tmp_path / "k.cpp"
    source.write_text('#include "rule.h"\n#include "base.h"\nint f() { return 1; }\n')
    kernel = cpp.Extension("k", source, [], "")
    assert kernel.headers() == [tmp_path / "rule.h", tmp_path / "base.h"]  # each once
    before = kernel.key()
    (tmp_path / "base.h").write_text("// under the rule, changed\n")
    assert kernel.key() != before


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_into_fp32_and_bf16(name):
    """The prefill's weights: the file's values (gguf_blocks.dequantize, checked against gguf's own above) and, into
    bf16, those values as torch rounds them (to nearest, ties to even), on every path, into a buffer given."""
    N, K = shape(name)
    blocks = gb.random_blocks(name, N, K, seed=6)
    want = gb.dequantize(name, blocks, N, K)
    for path in paths_here():
        assert torch.equal(qmatmul.dequantize(blocks, name, N, K, path=path), want), path
        buf = torch.full((N, K), float("nan"), dtype=torch.bfloat16)
        assert qmatmul.dequantize(blocks, name, N, K, out=buf, path=path) is buf
        assert torch.equal(buf, want.to(torch.bfloat16)), path


SIMD = ("avx2", "avx512")  # the prompt and packed kernels' paths


def simd_here(path: str) -> None:
    """Skip unless the prompt and packed kernels' `path` runs on this CPU (AVX2 runs wherever AVX-512 VNNI does)."""
    ext = qmatmul.extension()
    if ext is None or ext.best_path() < qmatmul.PATHS[path]:
        pytest.skip(f"the {path} path of the prompt and packed kernels does not run here")


def _prompt_within_rounding(name, blocks, x, bias, product):
    """product(x[:M]) (mm_prompt, or the packed kernel, whose fp32 operations are as many or fewer) against the
    product of the quantized x (the twin's quantize_rows, the same values) and the file's
    weights in fp64, within the kernel's fp32 operations' rounding: per output, one rounding each for a slot's scale,
    the slots' sum over a group, the groups' sum, the minimums' (Q6_K: a group's offset), the bias, 2⁻²³ each (twice
    the unit) on the magnitude of every term: (|x_q| + 128)·dx (Q6_K's x + 128) times |w| + 2·|dmin·m| (a quant's
    own part is within |w| + |dmin·m|). Rows 37 down to 32: tiles of 6 rows, then 1, 5, 4, 3, 2."""
    N, K = blocks.shape[0], x.shape[1]
    xq, dx, _ = qmatmul.quantize_rows(x, 256)
    dxk = dx.double().repeat_interleave(256, 1)
    w = gb.dequantize(name, blocks, N, K).double()
    want = (xq.double() * dxk) @ w.T + bias.double()
    mins = torch.zeros_like(w)
    if name != "q6_k":  # d = 0 leaves −dmin·m
        no_d = blocks.clone().reshape(N, K // 256, -1)
        no_d[..., 0:2] = 0
        mins = gb.dequantize(name, no_d.reshape(N, -1), N, K).double().abs()
    slots, per = (16, K // 256) if name == "q6_k" else (8, K // 32)
    ops = slots + K // 256 + per + 2
    tol = ops * 2.0**-23 * (((xq.double().abs() + 128) * dxk) @ (w.abs() + 2 * mins).T + bias.double().abs())
    for M in (37, 35, 34, 33, 32):
        got = product(x[:M])
        assert got.dtype == torch.float32 and got.shape == (M, N)
        assert ((got.double() - want[:M]).abs() <= tol[:M]).all(), (M, ((got.double() - want[:M]).abs() / tol[:M]).max())


@pytest.mark.parametrize("path", SIMD)
@pytest.mark.parametrize("name", qmatmul.PROMPT_TYPES)
def test_the_prompt_kernel_is_the_quantized_product(name, path):
    """mm_prompt (a prompt's rows) quantizes x as mm does and differs from it only in its fp32 operations."""
    simd_here(path)
    N, K = 48, 768  # two blocks of 16 outputs and one alone; 3 groups
    blocks = gb.random_blocks(name, N, K, seed=8)
    bias = torch.randn(N)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, K, generator=g)
    x[:, 9] *= 40
    _prompt_within_rounding(name, blocks, x, bias, lambda xs: qmatmul.prompt_mm(xs, blocks, name, N, K, bias, path=path))
    # bf16 in and out: the same product of x's bf16 values, rounded once more to bf16
    xb = x.to(torch.bfloat16)
    got = qmatmul.prompt_mm(xb[None], blocks, name, N, K, bias, path=path)
    assert got.dtype == torch.bfloat16 and got.shape == (1, 37, N)
    assert torch.equal(got[0], qmatmul.prompt_mm(xb.float(), blocks, name, N, K, bias, path=path).to(torch.bfloat16))


# each type's quant bytes (offsets in a block) and the value that makes every quant its largest magnitude
EXTREME_QUANTS = {"q4_k": [(16, 144, 0xFF)], "q5_k": [(16, 176, 0xFF)], "q6_k": [(0, 192, 0x00)],  # 15, 31, −32
                  "q8_0": [(2, 34, 0x80)], "q4_0": [(2, 18, 0x00)], "q4_1": [(4, 20, 0xFF)],  # −128, −8, 15
                  "q5_0": [(2, 22, 0x00)], "q5_1": [(4, 24, 0xFF)]}  # −16, 31


@pytest.mark.parametrize("path", SIMD)
@pytest.mark.parametrize("name", qmatmul.PROMPT_TYPES)
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("kernel", ["prompt", "packed"])
def test_the_prompt_kernel_at_the_ends_of_its_integer_ranges(name, sign, kernel, path):
    """Every quant at its largest magnitude and every x at ±127 once quantized: the kernels' int16 sums of pairs
    (AVX2's: a slot's for Q4_K, half a slot's for Q5_K and Q6_K) reach their bounds and must not wrap or saturate; the
    packed kernel's Q6_K −32 · Σ x start and its quants' bits 6–7 at their ends."""
    simd_here(path)
    N, K = 32, 512
    blocks = _extreme(name, N, K)
    x = torch.full((37, K), sign)
    x[1::2] *= 3.0  # other rows, other dx
    zero = torch.zeros(N)
    if kernel == "packed":
        packed = qmatmul.pack(blocks, name, N, K)
        product = lambda xs: qmatmul.packed_mm(xs, packed, name, N, K, zero, path=path)  # noqa: E731
    else:
        product = lambda xs: qmatmul.prompt_mm(xs, blocks, name, N, K, zero, path=path)  # noqa: E731
    _prompt_within_rounding(name, blocks, x, zero, product)


def test_the_prompt_kernel_runs_only_where_it_can():
    blocks = gb.random_blocks("q4_k", 40, 256, seed=9)
    x = torch.randn(30, 256)
    assert qmatmul.prompt_mm(x, blocks, "q4_k", 40, 256) is None  # N not a multiple of 16
    assert qmatmul.prompt_mm(x, gb.random_blocks("q8_0", 32, 256), "q8_0", 32, 256) is None
    assert (qmatmul.prompt_mm(x, blocks[:32], "q4_k", 32, 256) is not None) == qmatmul.prompt_runs()


@pytest.mark.parametrize("path", SIMD)
@pytest.mark.parametrize("name", qmatmul.PACKED_TYPES)
def test_the_packed_kernel_is_the_quantized_product(name, path):
    """packed_mm (steps and passes of Q4_K, Q5_K and Q6_K layers) quantizes x as mm does and differs from the exact
    product of those integers only in its fp32 operations; the packed form is about the file's size (a step reads
    about its bytes)."""
    simd_here(path)
    N, K = 48, 768
    blocks = gb.random_blocks(name, N, K, seed=8)
    packed = qmatmul.pack(blocks, name, N, K)
    assert packed.dtype == torch.uint8 and packed.numel() <= 1.03 * blocks.numel()
    bias = torch.randn(N)
    x = torch.randn(37, K, generator=torch.Generator().manual_seed(1))
    x[:, 9] *= 40
    _prompt_within_rounding(name, blocks, x, bias, lambda xs: qmatmul.packed_mm(xs, packed, name, N, K, bias, path=path))


@pytest.mark.parametrize("path", SIMD)
@pytest.mark.parametrize("name", qmatmul.PACKED_TYPES + qmatmul.PACKED_32_TYPES)
def test_the_packed_kernel_computes_each_row_alike(name, path):
    """Each row's output is the same bits whatever the other rows of its call (every split into tiles of up to 9
    rows, 1 to 40 rows), the thread count, and its input as bf16 is the fp32 result rounded once."""
    simd_here(path)
    N, K = 64, 512
    blocks = gb.random_blocks(name, N, K, seed=5)
    packed = qmatmul.pack(blocks, name, N, K)
    bias = torch.randn(N)
    x = torch.randn(40, K, generator=torch.Generator().manual_seed(2))
    mm = lambda xs: qmatmul.packed_mm(xs, packed, name, N, K, bias, path=path)  # noqa: E731
    full = mm(x)
    for M in range(1, 41):
        assert torch.equal(mm(x[:M]), full[:M]), M
    for m in (0, 17, 39):
        assert torch.equal(mm(x[m]), full[m])
    with torch_threads(1):
        assert torch.equal(mm(x), full)
    xb = x[:9].to(torch.bfloat16)
    got = mm(xb[None])
    assert got.dtype == torch.bfloat16 and got.shape == (1, 9, N)
    assert torch.equal(got[0], mm(xb.float()).to(torch.bfloat16))


@pytest.mark.parametrize("name", qmatmul.PACKED_TYPES + qmatmul.PACKED_32_TYPES)
def test_the_packed_kernel_gives_the_same_bits_on_avx2_and_avx512(name):
    """One arithmetic on both paths (AVX2's int16 sums of pairs are exact, its float steps AVX-512's, in order): a
    machine's path does not change a model's outputs; the quants at their ends too, fp32 and bf16, with a bias and
    without. The prompt kernel's two paths likewise."""
    simd_here("avx512")
    N, K = 48, 768
    for blocks in (gb.random_blocks(name, N, K, seed=6), _extreme(name, N, K)):
        packed = qmatmul.pack(blocks, name, N, K)
        x = torch.randn(41, K, generator=torch.Generator().manual_seed(7))
        x[:, 3] *= 60
        for bias in (torch.randn(N), None):
            for xs in (x, x.to(torch.bfloat16)):
                for M in (1, 2, 9, 10, 41):
                    want = qmatmul.packed_mm(xs[:M], packed, name, N, K, bias, path="avx512")
                    assert torch.equal(qmatmul.packed_mm(xs[:M], packed, name, N, K, bias, path="avx2"), want), M
                if name in qmatmul.PROMPT_TYPES:
                    want = qmatmul.prompt_mm(xs, blocks, name, N, K, bias, path="avx512")
                    assert torch.equal(qmatmul.prompt_mm(xs, blocks, name, N, K, bias, path="avx2"), want)


def test_the_packed_form_is_made_only_where_it_runs(monkeypatch):
    assert ("packed" in qmatmul.backend_line()) == qmatmul.packs("q4_k", 16) == qmatmul.prompt_runs()
    assert not qmatmul.packs("q4_k", 40) and not qmatmul.packs("q8_0", 40)  # N not a multiple of 16
    ext = qmatmul.extension()
    avx2 = ext is not None and ext.best_path() >= qmatmul.PATHS["avx2"]
    for name in qmatmul.PACKED_TYPES + qmatmul.PACKED_32_TYPES:
        assert qmatmul.packs(name, 32) == avx2 == (name.upper() in qmatmul.backend_line())
    monkeypatch.setenv("SPECDEC_QMATMUL", "avx2")  # as on an AVX2 CPU: packed where that runs
    assert qmatmul.packs("q4_k", 32) == qmatmul.packs("q8_0", 32) == avx2 == ("packed" in qmatmul.backend_line())
    for path in ("portable", "torch"):  # as on a CPU without AVX2, or the twin: the blocks as they are
        monkeypatch.setenv("SPECDEC_QMATMUL", path)
        assert not any(qmatmul.packs(name, 32) for name in qmatmul.PACKED_TYPES + qmatmul.PACKED_32_TYPES)
        assert "packed" not in qmatmul.backend_line()


@pytest.mark.parametrize("path", SIMD)
@pytest.mark.parametrize("name", qmatmul.PACKED_TYPES)
def test_the_prompt_kernel_reads_the_packed_form_alike(name, path):
    """mm_prompt from pack()'s form (what a packed layer's prefill reads, its blocks let go) gives the bits it gives
    from the file's blocks, fp32 and bf16, with and without a bias, the quants at their ends too."""
    simd_here(path)
    N, K = 48, 768
    for blocks in (gb.random_blocks(name, N, K, seed=4), _extreme(name, N, K)):
        packed = qmatmul.pack(blocks, name, N, K)
        x = torch.randn(41, K, generator=torch.Generator().manual_seed(6))
        for bias in (torch.randn(N), None):
            for xs in (x, x.to(torch.bfloat16)):
                want = qmatmul.prompt_mm(xs, blocks, name, N, K, bias, path=path)
                assert torch.equal(qmatmul.prompt_mm(xs, None, name, N, K, bias, packed, path=path), want)


@pytest.mark.parametrize("name", qmatmul.PACKED_TYPES + qmatmul.PACKED_32_TYPES)
def test_the_packed_form_keeps_every_bit_of_the_blocks(name):
    """unpack(pack(blocks)) is blocks byte for byte (a packed layer lets its blocks go and rebuilds them for a subset
    head or its dequantized weights): random bytes in every field, the quants at their ends, all-ones bytes."""
    if qmatmul.extension() is None:
        pytest.skip("pack and unpack are the built kernel's")
    N, K = 32, 512
    every_byte = torch.randint(0, 256, (N, gb.row_bytes(name, K)), dtype=torch.uint8,
                               generator=torch.Generator().manual_seed(8))  # any bytes: scales, d, NaNs too
    for blocks in (every_byte, gb.random_blocks(name, N, K, seed=4), _extreme(name, N, K),
                   torch.full_like(every_byte, 255)):
        assert torch.equal(qmatmul.unpack(qmatmul.pack(blocks, name, N, K), name, N, K), blocks)


def _extreme(name, N, K):
    blocks = gb.random_blocks(name, N, K, seed=3).reshape(N, K // gb.block_elements(name), -1).clone()
    for a, b, v in EXTREME_QUANTS[name]:
        blocks[..., a:b] = v
    return blocks.reshape(N, -1)


def _int8_per_32(x):
    """x [M, K] fp32 as Q8_0's packed kernel quantizes it: per 32 elements, xq = rint(x · (127 / amax)) within ±127
    (fp32 operations, ties to even), dx = amax / 127."""
    g = x.reshape(x.shape[0], -1, 32)
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    xq = torch.round(g * inv).clamp(-127, 127)
    return xq.reshape(x.shape), (amax / 127.0).squeeze(-1)


# the 32-element types' quant bytes at their ends: every unsigned quant 0 (the value's integer −o: Q8_0 −128, Q4_0 −8,
# Q5_0 −16; Q4_1, Q5_1 0), or every one its largest (Q8_0 127, Q4_0 7, Q5_0 15; Q4_1 15, Q5_1 31)
QUANT_BYTES_32 = {"q8_0": [(2, 34, 0x80, 0x7F)], "q4_0": [(2, 18, 0x00, 0xFF)], "q4_1": [(4, 20, 0x00, 0xFF)],
                  "q5_0": [(2, 22, 0x00, 0xFF)], "q5_1": [(4, 24, 0x00, 0xFF)]}


def _at_ends32(name, blocks, ends):
    """blocks [N, row_bytes] with every quant at its lowest (`low`) or highest (`high`) value, or as they are (None)."""
    if ends is None:
        return blocks
    N = blocks.shape[0]
    blocks = blocks.reshape(N, -1, gb.TYPES[name][2]).clone()
    for a, b, low, high in QUANT_BYTES_32[name]:
        blocks[..., a:b] = low if ends == "low" else high
    return blocks.reshape(N, -1)


@pytest.mark.parametrize("path", SIMD)
@pytest.mark.parametrize("ends", [None, "low", "high"])
@pytest.mark.parametrize("name", qmatmul.PACKED_32_TYPES)
def test_the_32_element_packed_kernel_is_the_int8_product(name, ends, path):
    """The 32-element types' packed kernel quantizes x to int8 per 32 and differs from the exact product of those
    integers and the file's weights only in its fp32 operations: per group d·dx and one fma into the sum, Q4_1 / Q5_1
    one more for m · xsd (xsd = Σxq · dx, one rounding), the bias, the output: 2⁻²³ (twice the unit) on the magnitude
    of each term for each of the roundings after it. The packed form holds the file's bytes. The quants at their ends
    and x at ±127: AVX-512's unsigned quants times ±127 and its −o·Σx start, AVX2's int16 pairs (Q8_0's |q| with q's
    sign on x: |−128| · 127 twice) must neither wrap nor saturate; AVX2 gives AVX-512's bits there too."""
    simd_here(path)
    N, K = 48, 768
    blocks = _at_ends32(name, gb.random_blocks(name, N, K, seed=8), ends)
    packed = qmatmul.pack(blocks, name, N, K)
    assert packed.shape[:2] == (N // 16, K // 32) and packed.numel() == blocks.numel()  # the file's bytes
    bias = torch.randn(N)
    x = torch.randn(37, K, generator=torch.Generator().manual_seed(1))
    x[:, 9] *= 40
    if ends is not None:
        x = torch.full((37, K), 1.0)
        x[1::2] *= -3.0
    xq, dx = _int8_per_32(x)
    dxk = dx.double().repeat_interleave(32, 1)
    w = gb.dequantize(name, blocks, N, K).double()
    want = (xq.double() * dxk) @ w.T + bias.double()
    size = w.abs()
    if name in ("q4_1", "q5_1"):  # |d·q| + |m| bounds each part of d·q + m: m alone, with d = 0
        no_d = blocks.reshape(N, K // 32, -1).clone()
        no_d[..., 0:2] = 0
        m = gb.dequantize(name, no_d.reshape(N, -1), N, K).double().abs()
        size = (w - m).abs() + 2 * m
    tol = (2 * (K // 32) + 3) * 2.0**-23 * ((xq.double().abs() * dxk) @ size.T + bias.double().abs())
    for M in (37, 10, 9, 2, 1):
        got = qmatmul.packed_mm(x[:M], packed, name, N, K, bias, path=path)
        assert got.dtype == torch.float32 and got.shape == (M, N)
        assert ((got.double() - want[:M]).abs() <= tol[:M]).all(), (M, ((got.double() - want[:M]).abs() / tol[:M]).max())
        if path == "avx2" and qmatmul.extension().best_path() == qmatmul.PATHS["avx512"]:
            assert torch.equal(got, qmatmul.packed_mm(x[:M], packed, name, N, K, bias, path="avx512")), M


@pytest.mark.parametrize("ends", [None, "low", "high"])
@pytest.mark.parametrize("name", qmatmul.PACKED_32_TYPES)
def test_a_32_element_prompt_has_the_packed_kernels_bits(name, ends):
    """The 32-element types' prompt kernel (AVX-512 VNNI, from the packed form) is the packed kernel's arithmetic in
    other tiles (two blocks of 16 outputs, 6 rows, the quants unpacked once): every row gets mm_packed's bits, whatever
    the rows (tiles short of 6, an odd block left over), fp32 and bf16, with and without a bias, the quants at their
    ends too. On AVX2 prompt_mm leaves them to packed_mm (None)."""
    simd_here("avx2")
    N, K = 48, 768  # three blocks of 16: a pair and one alone
    blocks = _at_ends32(name, gb.random_blocks(name, N, K, seed=5), ends)
    packed = qmatmul.pack(blocks, name, N, K)
    assert qmatmul.prompt_mm(torch.randn(40, K), None, name, N, K, None, packed, path="avx2") is None
    if qmatmul.extension().best_path() < qmatmul.PATHS["avx512"]:
        pytest.skip("the 32-element prompt kernel runs on AVX-512 VNNI only")
    x = torch.randn(41, K, generator=torch.Generator().manual_seed(2))
    x[:, 5] *= 30
    if ends is not None:
        x = torch.full((41, K), 1.0)
        x[1::2] *= -3.0
    for dtype in (torch.float32, torch.bfloat16):
        for bias in (None, torch.randn(N)):
            for M in (41, 36, 35, 6, 1):
                xm = x[:M].to(dtype)
                got = qmatmul.prompt_mm(xm, None, name, N, K, bias, packed)
                assert got is not None and got.dtype == dtype and got.shape == (M, N)
                assert torch.equal(got, qmatmul.packed_mm(xm, packed, name, N, K, bias)), (dtype, M)
