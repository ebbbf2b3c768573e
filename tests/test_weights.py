"""--target-quant (models/weights.py): a GGUF target and draft run on their own blocks with `gguf` on a CPU, `none`
dequantizes as before, int8 / int4 quantize a safetensors model into Q8_0 / Q4_1 blocks (llama.cpp's quantizers, bit
for bit) — and in every form greedy speculative output is that model's autoregressive output. The draft's subset
head scores its rows' own blocks; `specdec cache clear --all` deletes the built kernel too; the llama.cpp peer is
skipped in one line when it is not installed, and runs on SmolLM2's GGUF where it is."""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import json
import sys

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from conftest import make_pair, smollm2_cache
from specdec_cli.cli import app
from specdec_cli.errors import SpecdecError
from specdec_cli.kernels import gguf_blocks as gb
from specdec_cli.models.gguf_linear import GgufLinear, gguf_layers

runner = CliRunner()
ARTICLE = " ".join(f"w{(i * 37) % 900 + 2}" for i in range(60))


# ----------------------------------------------------------------------------------------------------------------
# The quantizers


@pytest.mark.parametrize("qtype", ["q8_0", "q4_1"])
def test_quantize_writes_llama_cpp_s_bytes(qtype):
    import gguf
    import gguf.quants

    torch.manual_seed(0)
    w = torch.randn(77, 320) * 0.03
    w[1, :32] = 0  # a zero block: d = 0
    w[2, :32] = torch.arange(32) - 15.5  # q4_1: (x − min)/d lands on halves
    w[3, :32] = 0.5
    w[3, 0] = 127  # q8_0: d = 1, so 0.5 · 1/d is a half: rounded away from zero (C's roundf), not to even
    w[3, 1:4] = torch.tensor([2.5, -2.5, -0.5])
    ours = gb.quantize(qtype, w, chunk=30)  # several chunks, the last one short
    ref = gguf.quants.quantize(w.numpy(), getattr(gguf.GGMLQuantizationType, qtype.upper()))
    assert ours.shape == (77, gb.row_bytes(qtype, 320)) and np.array_equal(ours.numpy(), ref)
    back = gb.dequantize(qtype, ours, 77, 320)
    step = 1 / 127 if qtype == "q8_0" else 1 / 15
    span = w.reshape(77, 10, 32).abs().amax(-1) * (1 if qtype == "q8_0" else 2)
    assert ((back - w).reshape(77, 10, 32).abs() <= span.unsqueeze(-1) * step * 0.51 + 1e-3).all()
    with pytest.raises(KeyError):
        gb.quantize("q4_k", w)


def test_q6_k_blocks_hold_each_weight_to_half_its_step():
    """Q6_K (the Whisper encoder's weights under --encoder-int8): gguf's own numpy reader reads our bytes as we do;
    each weight is within half a step (|d·sc|, fp32 slack) of its value unless its quant sits at an end of
    [−32, 31]; a zero sub-block or block gives zeros; Gaussian weights lose ~1/32 of a sub-block's largest |w| a
    step, so ~1.8 % rms (< 2.5 %)."""
    import gguf
    import gguf.quants

    torch.manual_seed(0)
    w = torch.randn(40, 768) * 0.03
    w[0, :16] = 0  # a zero sub-block
    w[1, :256] = 0  # a zero block: d = 0
    w[2, :16] = torch.linspace(-1, 1, 16)  # exact halves of a step
    w[3, 300] = 5.0  # an outlier: its sub-block's step is large, the block's other scales small
    b = gb.quantize("q6_k", w, chunk=16)
    assert b.shape == (40, gb.row_bytes("q6_k", 768)) and b.dtype == torch.uint8
    back = gb.dequantize("q6_k", b, 40, 768)
    assert np.array_equal(back.numpy(), gguf.quants.dequantize(b.numpy(), gguf.GGMLQuantizationType.Q6_K))
    u = gb.unpack("q6_k", b, 40, 768)  # u.w = sc·(q − 32) per element, u.d per block
    sc = b.reshape(40, 3, 210)[..., 192:208].contiguous().view(torch.int8).repeat_interleave(16, -1).reshape(40, 768)
    q = torch.where(sc != 0, u.w // torch.where(sc != 0, sc, 1).to(torch.int16), 0)  # q − 32 in [−32, 31]
    step = (u.d.repeat_interleave(256, -1) * sc.float()).abs()
    inner = (q > -32) & (q < 31) & (step > 0)
    err = (back - w).abs()
    assert (err[inner] <= step[inner] * 0.5 * (1 + 1e-5) + 1e-9).all()
    assert (back[0, :16] == 0).all() and (back[1, :256] == 0).all()
    rms = (back[4:] - w[4:]).norm() / w[4:].norm()
    assert rms < 0.025, float(rms)


# ----------------------------------------------------------------------------------------------------------------
# int8 / int4 of a model without a GGUF


@pytest.mark.parametrize("form, qtype", [("int8", "q8_0"), ("int4", "q4_1")])
def test_hold_quantizes_every_linear_into_blocks(form, qtype):
    from specdec_cli.models.loading import LoadedModel
    from specdec_cli.models.weights import hold

    target, _ = make_pair("qwen2", hidden=64)
    plain = copy.deepcopy(target)
    loaded = LoadedModel(target, None, "tiny", "local", "tiny")
    assert hold(loaded, form) == form and loaded.weights == form
    assert not [n for n, m in target.named_modules() if type(m) is nn.Linear]
    assert {layer.qtype for layer in gguf_layers(target)} == {qtype}
    assert isinstance(target.get_output_embeddings(), GgufLinear) and not target.config.tie_word_embeddings
    ids = torch.tensor([[1, 5, 9, 30, 2]])
    with torch.inference_mode():
        got, want = target(ids).logits, plain(ids).logits
    assert not torch.equal(got, want)  # another model, near this one: a random model's weights in 16 levels per 32
    assert (got - want).norm() / want.norm() < (0.05 if form == "int8" else 0.6)  # (int4) move its logits ~40 %
    gone = LoadedModel(copy.deepcopy(plain), None, "tiny", "local", "tiny")
    assert hold(gone, "none") == "none" and hold(gone, "gguf") == "none"  # no GGUF: held as it is
    assert not gguf_layers(gone.model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_on_quantized_blocks_gives_the_bits_of_steps(dtype):
    """The house's exactness property for int4 targets: with exact_rows, every row of a pass over k tokens has the
    bits of its one-token step (so greedy speculative output is the autoregressive output)."""
    from transformers import DynamicCache

    from specdec_cli.decoding.exact_rows import exact_rows
    from specdec_cli.models.loading import LoadedModel
    from specdec_cli.models.weights import hold

    target, _ = make_pair("llama", hidden=64, layers=3)
    target = target.to(dtype)
    hold(LoadedModel(target, None, "tiny", "local", "tiny"), "int4")
    model = exact_rows(target)
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6, 2, 6, 4, 3]])
    for k in (2, 5, 9, 17):
        with torch.inference_mode():
            cache = DynamicCache()
            model(ids[:, :-k], past_key_values=cache, use_cache=True)
            steps = torch.stack([model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[0, -1]
                                 for t in range(ids.shape[1] - k, ids.shape[1])])
            cache = DynamicCache()
            model(ids[:, :-k], past_key_values=cache, use_cache=True)
            passed = model(ids[:, -k:], past_key_values=cache, use_cache=True).logits[0]
        assert torch.equal(steps, passed), f"k={k}"


def _summarize(*args):
    return runner.invoke(app, ["summarize", *map(str, args)])


@pytest.fixture(scope="module")
def article(tmp_path_factory):
    p = tmp_path_factory.mktemp("articles") / "a.txt"
    p.write_text(ARTICLE)
    return p


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_a_quantized_safetensors_target_speculates_exactly(tiny_llama_dir, article, form):
    """--target-quant int8 | int4 from the CLI: the target and self:2 on blocks, greedy exact = autoregressive of the
    quantized model, and --json says how the weights were held and which kernel path ran."""
    texts = {}
    for mode in ("autoregressive", "exact"):
        r = _summarize(article, "--target", tiny_llama_dir, "--draft", "self:2", "--dtype", "float32", "--device",
                       "cpu", "--max-new-tokens", "20", "--gamma-schedule", "constant", "--target-quant", form,
                       "--mode", mode, "--json")
        assert r.exit_code == 0, r.output
        obj = json.loads(r.stdout)
        texts[mode] = obj["text"]
        assert obj["weights"]["target"] == form and obj["weights"]["qmatmul"].startswith(("C++", "torch twin"))
        if mode == "exact":
            assert obj["weights"]["draft"] == form and obj["stats"]["accepted_tokens"] > 0
    assert texts["exact"] == texts["autoregressive"] and texts["exact"]
    r = _summarize(article, "--target", tiny_llama_dir, "--draft", "self:2", "--dtype", "float32", "--max-new-tokens",
                   "4", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["weights"] == {"target": "none", "draft": "none"}  # gguf: as is


def test_target_quant_is_checked_in_one_line(tiny_llama_dir, article, tmp_path):
    r = _summarize(article, "--target", tiny_llama_dir, "--target-quant", "int3")
    assert r.exit_code == 2 and "--target-quant must be one of gguf, none, int8, int4" in r.output
    assert len(r.output.strip().splitlines()) == 1
    for args, line in ((["--task", "summarize", "--target-quant", "int3"], "--target-quant must be one of gguf, none"),
                       (["--task", "transcribe", "--target-quant", "int8"], "--target-quant is for --task summarize")):
        r = runner.invoke(app, ["bench", *args, "--data", str(tmp_path)])  # checked before the (empty) data is
        assert r.exit_code == 2 and line in r.output and len(r.output.strip().splitlines()) == 1, r.output


# ----------------------------------------------------------------------------------------------------------------
# The draft's subset head on blocks


def test_subset_head_on_blocks_scores_its_rows_own_blocks():
    from specdec_cli.drafts.int8 import quantize_linears
    from specdec_cli.drafts.subset_head import SubsetHead, restrict_head

    _, draft = make_pair("qwen2", hidden=64)
    head = draft.get_output_embeddings()
    blocks = gb.quantize("q8_0", head.weight.detach())
    on_blocks = GgufLinear(blocks, "q8_0", head.in_features, head.out_features, None, torch.float32)
    draft.set_output_embeddings(on_blocks)
    h = torch.randn(1, 3, 64)
    full = on_blocks(h)
    for keep in (torch.tensor([5, 0, 63, 5]), torch.arange(20)):  # restricting again restricts the full head
        restrict_head(draft, keep)
        sub = draft.get_output_embeddings()
        assert isinstance(sub, SubsetHead) and isinstance(sub.proj, GgufLinear)
        assert sub.source is on_blocks and sub.weight.shape == (64, 64) and sub.keep.device.type == "cpu"
        got = sub(h)
        kept = torch.unique(keep)
        assert torch.equal(got[..., kept], full[..., kept])  # a row's blocks give its bits whatever the other rows
        others = torch.ones(64, dtype=torch.bool)
        others[kept] = False
        assert torch.isneginf(got[..., others]).all()
        quantize_linears(sub)  # --draft-int8: blocks stay blocks (and the full head is no submodule to quantize)
        assert isinstance(sub.proj, GgufLinear) and sub.source is on_blocks


# ----------------------------------------------------------------------------------------------------------------
# SmolLM2's GGUF, as the CLI loads it


@pytest.fixture(scope="module")
def cache_env(session_model_cache):
    with smollm2_cache(session_model_cache) as cache:
        yield cache


@pytest.mark.slow
def test_a_gguf_pair_runs_on_blocks_and_greedy_equals_autoregressive(cache_env):
    """--target-quant gguf on a GGUF target (SmolLM2, embedded): the target and the draft model on their blocks, the
    subset head on blocks; greedy speculative (a model draft, self:K sharing the target's blocks, lookup) = the
    blocks target alone; the default (none) is the bf16 model; int8 of a GGUF is refused in one line."""
    from specdec_cli.bench.runners import data_files
    from specdec_cli.drafts.subset_head import SubsetHead
    from specdec_cli.tasks import summarize as task

    articles = [task.read_article(p) for p in data_files("summarize", None)[:2]]
    opts = task.SummarizeOptions(target="embedded:smollm2", draft="embedded:smollm2", max_new_tokens=24,
                                 gamma_schedule="constant", draft_vocab=4096, target_quant="gguf")
    target, draft = task.load_pair(opts, progress=False)
    assert target.weights == "gguf" and draft.loaded.weights == "gguf"
    assert isinstance(target.model.get_output_embeddings(), GgufLinear)
    assert not [n for n, m in target.model.named_modules() if type(m) is nn.Linear]
    want = [s.text for s in task.summarize(target, None, articles, opts, mode="autoregressive")]
    for spec in ("embedded:smollm2", "self:20", "lookup"):
        d = draft if spec == "embedded:smollm2" else task.load_draft(spec, target, opts, progress=False)
        got = task.summarize(target, d, articles, opts.replace(draft=spec))
        assert [s.text for s in got] == want, spec
        assert sum(s.stats.accepted_tokens for s in got) > 0 and got[0].weights["target"] == "gguf"
        if spec != "lookup":
            head = d.loaded.model.get_output_embeddings()
            assert isinstance(head, SubsetHead) and isinstance(head.proj, GgufLinear)
    assert task.SummarizeOptions().target_quant == "gguf"  # the default (the embedded target is a GGUF)
    bf16, _ = task.load_pair(opts.replace(target_quant="none", mode="autoregressive"), progress=False)
    assert bf16.weights == "none" and not gguf_layers(bf16.model)
    with pytest.raises(SpecdecError, match="is a GGUF: its own blocks run with --target-quant gguf"):
        task.load_pair(opts.replace(target_quant="int8", mode="autoregressive"), progress=False)


# ----------------------------------------------------------------------------------------------------------------
# The cache


@pytest.mark.parametrize("where", ["kernels", "SPECDEC_KERNEL_CACHE"])
def test_cache_clear_all_deletes_the_built_kernels(tmp_path, monkeypatch, where):
    """The kernels live in the cache's kernels/ folder, or in $SPECDEC_KERNEL_CACHE when it is set."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "kernels"
    if where == "SPECDEC_KERNEL_CACHE":
        folder = tmp_path / "elsewhere"
        monkeypatch.setenv("SPECDEC_KERNEL_CACHE", str(folder))
        (tmp_path / "cache" / "kernels").mkdir(parents=True)  # not the kernels' folder now: left alone
    else:
        monkeypatch.delenv("SPECDEC_KERNEL_CACHE", raising=False)
    built = folder / "qmatmul-0123456789abcdef"
    built.mkdir(parents=True)
    (built / "specdec_qmatmul.so").write_bytes(b"x" * 1000)
    r = runner.invoke(app, ["cache", "clear", "--all"])
    assert r.exit_code == 0, r.output
    assert not folder.exists() and "built kernels" in r.output
    assert (tmp_path / "cache" / "kernels").exists() == (where == "SPECDEC_KERNEL_CACHE")
    r = runner.invoke(app, ["cache", "clear", "--all"])  # nothing left: nothing said about kernels
    assert r.exit_code == 0 and "kernels" not in r.output


# ----------------------------------------------------------------------------------------------------------------
# The llama.cpp peer


def test_llama_cpp_missing_is_one_line_and_the_bench_runs(monkeypatch, tiny_llama_dir, tmp_path):
    from specdec_cli.bench import config, harness, peers, runners

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` now raises ImportError
    line = peers.skipped("llama.cpp", "embedded")
    assert line and "llama_cpp is not installed" in line and "GGML_NATIVE" in line and "skipped" in line
    (tmp_path / "a.txt").write_text(ARTICLE)
    tc = config.TaskConfig("summarize", [2], ["exact"], schedules=["constant"], peers=["llama.cpp"],
                           options={"data": str(tmp_path), "target": str(tiny_llama_dir), "draft": "self:2"})
    assert harness.total_steps(tc) == 2  # autoregressive, exact γ 2: no step for the peer
    assert runners.peer_runs(tc, [], None, 1) == []
    assert len([w for w in config.warnings_for(tc) if "llama" in w]) == 1  # said once, before the run
    r = runner.invoke(app, ["bench", "--task", "transcribe", "--peers", "llama.cpp"])
    assert r.exit_code == 2 and "runs beside --task summarize" in r.output


def test_llama_cpp_needs_a_gguf_target(monkeypatch, tiny_llama_dir):
    from specdec_cli.bench import peers

    if importlib.util.find_spec("llama_cpp") is None:
        monkeypatch.setitem(sys.modules, "llama_cpp", type(sys)("llama_cpp"))  # as if installed
    line = peers.skipped("llama.cpp", str(tiny_llama_dir))
    assert line is not None and "runs only on a GGUF target" in line


def test_llama_cpp_runs_without_its_extra_buffers_where_they_crash(monkeypatch, capsys):
    """The probe's child killed by a signal (a segfault, as llama.cpp's AMX product was on an AMX Xeon) sends
    llama.cpp to its plain weights with one line; a child that ends, well or with an error, keeps its defaults."""
    from specdec_cli.bench import peers

    segfault = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(peers, "_PROBE", segfault)
    assert peers._extra_buffers_run("model.gguf", [1, 2], 16, 1) is False
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and "crashed" in line and "SIGSEGV" in line and "--no-repack" in line
    # its arguments: the file, the context, the threads, the prompt's ids (a segfault where they differ)
    monkeypatch.setattr(peers, "_PROBE", f"import sys\nif sys.argv[1:] != ['model.gguf', '16', '1', '1,2']: {segfault}")
    assert peers._extra_buffers_run("model.gguf", [1, 2], 16, 1) is True
    monkeypatch.setattr(peers, "_PROBE", "raise SystemExit(1)")
    assert peers._extra_buffers_run("model.gguf", [1, 2], 16, 1) is True
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_llama_without_extra_buffers_sets_the_parameter_inside_the_block_only():
    import llama_cpp.llama_cpp as low

    from specdec_cli import internals

    assert low.llama_model_default_params().use_extra_bufts
    with internals.llama_without_extra_buffers():
        assert not low.llama_model_default_params().use_extra_bufts
    assert low.llama_model_default_params().use_extra_bufts


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed "
                    "(CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install 'specdec-cli[llama-cpp]')")
def test_llama_cpp_peer_on_smollm2s_gguf(cache_env, tmp_path):
    """--peers llama.cpp beside specdec on SmolLM2's GGUF (Q4_1 / Q8_0), greedy, 1 thread: its record has its wall
    time, tokens/s, prefill and ms per token; its text is compared with specdec's autoregressive one."""
    from specdec_cli.bench.runners import examples_dir

    data = tmp_path / "articles"
    data.mkdir()
    for name in ("bumblebees", "bike_lanes"):
        (data / f"{name}.txt").write_text((examples_dir() / "articles" / f"{name}.txt").read_text())
    saved = torch.get_num_threads()
    try:
        r = runner.invoke(app, ["bench", "--task", "summarize", "--data", str(data), "--target", "embedded:smollm2",
                                "--draft", "lookup", "--gamma", "4", "--modes", "exact", "--gamma-schedule", "auto",
                                "--threads", "1", "--max-new-tokens", "24", "--peers", "llama.cpp",
                                "--out", str(tmp_path / "r.json")])
    finally:
        torch.set_num_threads(saved)
    assert r.exit_code == 0, r.output
    saved_run = json.loads((tmp_path / "r.json").read_text())
    assert saved_run["machine"]["qmatmul"].startswith(("C++", "torch twin"))
    records = {x["mode"]: x for x in saved_run["results"]}
    ar, peer = records["autoregressive"], next(x for x in saved_run["results"] if x.get("peer") == "llama.cpp")
    assert peer["mode"] in ("llama.cpp", "llama.cpp no-repack") and peer["threads"] == 1 and len(peer["outputs"]) == 2
    assert all(peer["outputs"]) and 0 < peer["prefill_s"] < peer["wall_s"] and peer["target_ms_per_forward"] > 0
    for x in (ar, peer):  # each article's own wall, to compare article by article
        assert len(x["input_wall_s"]) == 2 and sum(x["input_wall_s"]) == pytest.approx(x["wall_s"])
    assert peer["tokens_per_s"] == pytest.approx(peer["new_tokens"] / peer["wall_s"])
    assert peer["speedup"] == pytest.approx(peer["tokens_per_s"] / ar["tokens_per_s"])
    assert peer["same_as_autoregressive"] in (0.0, 0.5, 1.0)
    first = [o.split()[:3] for o in peer["outputs"]]
    assert first == [o.split()[:3] for o in ar["outputs"]], "the same GGUF, prompt and greedy: the same first words"
    assert "llama.cpp" in r.output
