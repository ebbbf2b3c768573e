"""decoding/llama_like.py: a Llama-shaped causal LM driven without transformers' forward gives transformers' logits bit
for bit with the torch ops (GGUF blocks, bf16 weights, a padded batch, steps, passes, a prompt) — with the fused ones
(kernels/layer_ops, tested against their twins in test_layer_ops.py) its passes still give each row a step's bits —
and GGUF layers joined into one buffer (models/gguf_linear.join) give their parts' outputs bit for bit."""

from __future__ import annotations

import pytest
import torch

from conftest import smollm2_cache
from specdec_cli.decoding.adapters import Decoder
from specdec_cli.decoding.exact_rows import ROWS, exact_rows
from specdec_cli.decoding.llama_like import LlamaLike, decoder_for
from specdec_cli.kernels import gguf_blocks as gb
from specdec_cli.kernels import layer_ops
from specdec_cli.models import gguf_linear
from specdec_cli.models.gguf_linear import GgufLinear, join


def _parts(qtypes, sizes, K=512, bias=True):
    return [GgufLinear(gb.random_blocks(q, n, K, seed=i), q, K, n, torch.randn(n) if bias else None)
            for i, (q, n) in enumerate(zip(qtypes, sizes, strict=True))]


@pytest.mark.parametrize("bias", [True, False])
def test_joined_layers_are_their_parts(bias):
    parts = _parts(["q4_k"] * 3, [64, 16, 16], bias=bias)
    if bias:
        parts[1].bias = None  # a missing bias joins as zeros
    xs = [torch.randn(1, t, 512, dtype=torch.bfloat16) for t in (1, 3, gguf_linear.PREFILL_TOKENS + 5)]
    alone = [[p(x) for p in parts] for x in xs]
    joint = join(parts)
    assert joint is not None and joint.out_features == 96
    base = joint.blocks.data_ptr()
    for p in parts:  # each part's blocks a view of its rows in the joint buffer
        assert p.joint is joint and base <= p.blocks.data_ptr() < base + joint.blocks.numel()
    assert [p.joint_start for p in parts] == [0, 64, 80]
    assert joint not in list(parts[0].modules())  # not a submodule: its bytes are counted once
    for x, want in zip(xs, alone, strict=True):
        got = joint(x).split([64, 16, 16], -1)
        for g, w, p in zip(got, want, parts, strict=True):
            assert torch.equal(g, w) and torch.equal(p(x), w)


def test_layers_of_other_types_are_not_joined():
    parts = _parts(["q4_k", "q6_k"], [32, 32])
    before = [p.blocks for p in parts]
    assert join(parts) is None
    assert all(p.joint is None and p.blocks is b for p, b in zip(parts, before, strict=True))


@pytest.fixture(scope="module")
def smollm2_blocks(session_model_cache):
    with smollm2_cache(session_model_cache):
        return gguf_linear.load_gguf_causal_lm("embedded:smollm2", dtype=torch.bfloat16, progress=False)


def _run(decoder, tokens, mask, positions, cut):
    """Logits of a prompt tokens[:, :cut] (its last row), then of one step and of a pass over the rest."""
    with torch.inference_mode():
        m = None if mask is None else mask[:, :cut]
        decoder.prefill(tokens[:, :cut], m, positions[:, :cut])
        decoder.reset()
        out = [decoder._call(tokens[:, :cut], m, positions[:, :cut], keep=1)]  # the prompt again, on a fresh cache
        decoder.prefill(tokens[:, :cut], m, positions[:, :cut])
        m = None if mask is None else mask[:, : cut + 1]
        out.append(decoder.forward(tokens[:, cut : cut + 1], m, positions[:, cut : cut + 1]))
        decoder.crop(cut)
        out.append(decoder.forward(tokens[:, cut:], mask, positions[:, cut:]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["gguf", "bf16"])
def test_llama_like_gives_transformers_logits_on_smollm2(weights, smollm2_blocks, smollm2, monkeypatch):
    monkeypatch.setattr(layer_ops.KERNEL, "module", lambda: None)  # transformers' torch ops, not the fused ones
    loaded = smollm2_blocks if weights == "gguf" else smollm2
    lean = decoder_for(loaded.model)
    assert isinstance(lean, LlamaLike)
    if weights == "gguf":
        assert any(len(sizes or ()) == 2 for layer in lean.layers for _, sizes in layer[5].gate_up.calls)  # gate, up joined
    plain = Decoder(exact_rows(loaded.model))
    texts = ["Bumblebees raise more queens near wildflower strips, a study of forty farms found, and",
             "Three farms and"]
    rows = [loaded.tokenizer(t)["input_ids"] for t in texts]
    width = max(map(len, rows))
    tokens = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])  # the second row padded on the left
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    for rows, cut in ((slice(0, 1), 12), (slice(0, 2), tokens.shape[1] - 6)):
        m = None if bool(mask[rows].all()) else mask[rows]
        want = _run(plain, tokens[rows], m, positions[rows], cut)
        got = _run(lean, tokens[rows], m, positions[rows], cut)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and torch.equal(g, w)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_llama_like_drives_each_family_as_transformers(arch, monkeypatch):
    """A random model of each family in bf16: LlamaLike's logits are transformers' (exact_rows'); in fp32, where
    exact_rows changes nothing, and with a sliding window, decoder_for keeps transformers' own forward."""
    from transformers import MistralConfig, MistralForCausalLM

    from conftest import make_pair

    if arch == "mistral":
        torch.manual_seed(0)
        config = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, initializer_range=0.3)
        assert type(decoder_for(MistralForCausalLM(MistralConfig(**config, sliding_window=4)).bfloat16())) is Decoder
        target = MistralForCausalLM(MistralConfig(**config, sliding_window=None)).eval()
    else:
        target, _ = make_pair(arch)
    assert type(decoder_for(target)) is Decoder
    target = target.to(torch.bfloat16)
    monkeypatch.setattr(layer_ops.KERNEL, "module", lambda: None)  # transformers' torch ops, not the fused ones
    lean = decoder_for(target)
    assert isinstance(lean, LlamaLike)
    tokens = torch.tensor([[3, 14, 15, 9, 26, 5, 33, 2, 40, 41, 7]])
    positions = torch.arange(tokens.shape[1])[None]
    plain = Decoder(exact_rows(target))
    for g, w in zip(_run(lean, tokens, None, positions, 6), _run(plain, tokens, None, positions, 6), strict=True):
        assert torch.equal(g, w)
    # a prompt read in two chunks longer than a pass (the loop's PREFILL_CHUNK): the second sees the first's keys.
    # Its last layer runs for the kept row alone, with a pass's products (transformers' exact_rows: the prompt's), so
    # that row's logits may differ in rounding (bf16: 2⁻⁸ of a value, a few times over); the cache does not: the
    # step and the pass after it are transformers' bits
    tokens = torch.randint(0, 64, (1, 2 * ROWS + 6), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(tokens.shape[1])[None]
    got, want = _run(lean, tokens, None, positions, ROWS + 2), _run(plain, tokens, None, positions, ROWS + 2)
    assert torch.allclose(got[0].float(), want[0].float(), rtol=0, atol=2 ** -6 * float(want[0].abs().max()))
    assert all(torch.equal(g, w) for g, w in zip(got[1:], want[1:], strict=True))


def test_a_prompts_last_layer_runs_for_the_rows_kept_only():
    """A prompt longer than a pass, read for its last row's logits (keep=1, as prefill reads it): the last layer's
    attention, o and MLP run for that row alone, every layer's keys and values are those of a whole read (bit for
    bit), so the steps after it give the same logits; the kept row's logits are the whole read's last row's."""
    from conftest import make_pair

    target, _ = make_pair("llama")
    lean = decoder_for(target.to(torch.bfloat16))
    assert isinstance(lean, LlamaLike)
    tokens = torch.randint(0, 64, (1, 2 * ROWS + 6), generator=torch.Generator().manual_seed(2))
    positions = torch.arange(tokens.shape[1])[None]
    cut = ROWS + 4
    rows = []
    down = lean.layers[-1][-1]
    hook = down.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[1]))
    runs = {}
    with torch.inference_mode():
        for keep in (0, 1):
            lean.reset()
            lean._reserve(1, cut)
            h = lean._hidden(tokens[:, :cut], None, positions[:, :cut], keep)
            logits = lean.head(h[:, -1:])
            cache = [t[:, :, :cut].clone() for t in lean.keys + lean.values]
            lean.length, lean.seen = cut, tokens[:, :cut]
            step = lean.forward(tokens[:, cut : cut + 1], None, positions[:, cut : cut + 1])
            runs[keep] = (logits, cache, step)
    hook.remove()
    assert rows == [cut, 1, 1, 1]  # the whole read, its step; the kept row, its step
    (whole, whole_cache, whole_step), (kept, kept_cache, kept_step) = runs[0], runs[1]
    assert all(torch.equal(a, b) for a, b in zip(whole_cache, kept_cache, strict=True))
    assert torch.equal(whole_step, kept_step)
    assert torch.allclose(kept.float(), whole.float(), rtol=2 ** -7, atol=2 ** -7 * float(whole.abs().max()))


@pytest.mark.slow
def test_with_the_fused_ops_a_pass_gives_the_bits_of_steps(smollm2_blocks):
    lean = decoder_for(smollm2_blocks.model)
    assert all(layer[5].joint is not None for layer in lean.layers)  # silu(gate) · up fused over the joint product
    ids = torch.tensor([smollm2_blocks.tokenizer("Bumblebees raise more queens near wildflower strips, a study of "
                                                 "forty farms across three summers found, and")["input_ids"]])
    positions = torch.arange(ids.shape[1])[None]
    for k in (2, 9, 17):
        cut = ids.shape[1] - k
        with torch.inference_mode():
            lean.prefill(ids[:, :cut], None, positions[:, :cut])
            steps = torch.cat([lean.forward(ids[:, t : t + 1], None, positions[:, t : t + 1])
                               for t in range(cut, ids.shape[1])], 1)
            lean.crop(cut)
            passed = lean.forward(ids[:, cut:], None, positions[:, cut:])
        assert torch.equal(steps, passed), k


def test_a_bf16_draft_is_driven_by_llama_like():
    """draft_decoder: LlamaLike for a bf16 draft (its one-query attention in fp32, not transformers' bf16 sdpa),
    transformers' forward for an fp32 one; either way greedy speculative output is the target's alone."""
    from conftest import PROMPT, make_pair
    from specdec_cli.decoding import generate
    from specdec_cli.decoding.llama_like import draft_decoder

    target, draft = make_pair("qwen2")
    assert type(draft_decoder(draft)) is Decoder
    target, draft = target.to(torch.bfloat16), draft.to(torch.bfloat16)
    assert isinstance(draft_decoder(draft), LlamaLike)
    alone = generate(target, None, PROMPT, mode="autoregressive", max_new_tokens=24)
    spec = generate(target, draft, PROMPT, mode="exact", gamma=4, gamma_schedule="constant", max_new_tokens=24)
    assert spec.tokens == alone.tokens and len(alone.tokens[0]) == 24
    assert spec.stats.target_calls < 24  # the draft's tokens were accepted: it drafts the target's continuation


def test_a_long_prompt_attends_through_frames_attention_where_it_runs(monkeypatch):
    """Heads 64 wide on an AVX2 or AVX-512 CPU: a prompt's chunks longer than a pass attend by kernels/frames_attention
    (causal, grouped heads: the second chunk sees the first's keys), steps and passes by rows as before. Its logits
    are no farther from the same model's in fp32 than twice transformers' own bf16 run's (the kernel's error alone is
    checked against fp64 in test_frames_attention.py), and a pass still gives every row a step's bits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec_cli.kernels import frames_attention

    torch.manual_seed(0)
    fp32 = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, initializer_range=0.1,
                                        attn_implementation="sdpa")).eval()
    target = LlamaForCausalLM(fp32.config).eval()
    target.load_state_dict(fp32.state_dict())
    target = target.to(torch.bfloat16)
    lean = decoder_for(target)
    calls = []
    attend = frames_attention.attend
    monkeypatch.setattr(frames_attention, "attend", lambda q, *a, **k: calls.append(q.shape[2]) or attend(q, *a, **k))
    tokens = torch.randint(0, 64, (1, 2 * ROWS + 6), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(tokens.shape[1])[None]
    cut = ROWS + 2
    got = _run(lean, tokens, None, positions, cut)
    want = _run(Decoder(exact_rows(target)), tokens, None, positions, cut)
    exact = _run(Decoder(fp32), tokens, None, positions, cut)
    taken = frames_attention.cpu_takes() and frames_attention.KERNEL.module() is not None
    rest = tokens.shape[1] - cut  # more rows than a pass: a prompt's second chunk
    # the first chunk read thrice for its last row (the last layer then runs that row alone), the second once whole
    assert calls == ([cut] * 3 + [rest] * 2 if taken else [])
    for g, w, e in zip(got, want, exact, strict=True):
        assert g.shape == w.shape
        assert float((g.double() - e.double()).norm()) <= 2 * float((w.double() - e.double()).norm())
    with torch.inference_mode():  # the pass over the rest against its steps, after the kernel's prompt
        lean.prefill(tokens[:, :cut], None, positions[:, :cut])
        steps = torch.cat([lean.forward(tokens[:, t : t + 1], None, positions[:, t : t + 1])
                           for t in range(cut, cut + 5)], 1)
        lean.crop(cut)
        assert torch.equal(lean.forward(tokens[:, cut : cut + 5], None, positions[:, cut : cut + 5]), steps)
