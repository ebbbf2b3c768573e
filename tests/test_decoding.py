"""The decoding loop on tiny random llama / qwen2 models (fp32, CPU).

Greedy speculative decoding must match autoregressive token for token; sampling must reproduce the
target's distribution (the exact joint of the first two tokens, computed from the target's probs).
The draft is the target's own first layers, with the target's later layers damped so that the
truncated copy agrees often but not always (acceptance well inside (0, 1): both paths run).
"""

import copy
import math

import pytest
import torch

from conftest import (
    GREEDY,
    N_SAMPLES,
    PROMPT,
    PROMPTS,
    ROOT,
    autoregressive,
    exact_first_two,
    first_two_pvalue,
    left_pad,
    make_pair,
    sample_many,
    sample_one_by_one,
    torch_threads,
)
from specdec_cli.decoding import Decoder, Seq2SeqDecoder, generate, rows_share
from specdec_cli.decoding.sampling import SamplingParams
from specdec_cli.errors import SpecdecError


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models are faster on one thread, and far faster when other jobs share the 2 cores."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request):
    return make_pair(request.param)


# ----------------------------------------------------------------------------------------------------
# greedy: token for token


def test_autoregressive_matches_transformers_generate(pair):
    target, _ = pair
    ours = autoregressive(target, PROMPT, n=24)
    theirs = target.generate(PROMPT, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert ours.tokens[0] == theirs[0, PROMPT.shape[1] :].tolist()
    assert ours.stats.new_tokens == 24 and ours.stats.target_calls == 24 and ours.stats.draft_tokens == 0


@pytest.mark.parametrize("mode", ["baseline", "exact"])
@pytest.mark.parametrize("gamma", [1, 3, 5, 8])
def test_greedy_speculative_equals_autoregressive(pair, mode, gamma):
    target, draft = pair
    expected = autoregressive(target, PROMPT, n=30).tokens
    got = generate(target, draft, PROMPT, mode=mode, gamma=gamma, params=GREEDY, max_new_tokens=30)
    assert got.tokens == expected
    s = got.stats
    assert 0.0 < s.acceptance_rate < 1.0, "the test needs both accepted and rejected drafts"
    assert s.new_tokens == 30 and s.accepted_tokens == sum(k * c for k, c in enumerate(s.accepted_histogram))
    assert s.target_calls < 30 and s.backend == "torch"


@pytest.mark.parametrize("mode", ["baseline", "exact"])
@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
def test_greedy_batch_rows_equal_their_own_b1_run(pair, mode, schedule):
    target, draft = pair
    expected = [autoregressive(target, torch.tensor([r]), n=20).tokens[0] for r in PROMPTS]
    ids, mask = left_pad(PROMPTS)
    got = generate(target, draft, ids, mask, mode=mode, gamma=3, gamma_schedule=schedule, params=GREEDY, max_new_tokens=20)
    assert got.tokens == expected
    assert autoregressive(target, ids, mask, n=20).tokens == expected  # batched autoregressive too


def test_right_padding_is_accepted(pair):
    target, draft = pair
    expected = [autoregressive(target, torch.tensor([r]), n=8).tokens[0] for r in PROMPTS]
    width = max(map(len, PROMPTS))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in PROMPTS])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in PROMPTS])
    assert generate(target, draft, ids, mask, gamma=4, params=GREEDY, max_new_tokens=8).tokens == expected


def test_heuristic_schedule_rule():
    """+2 when every draft token was accepted, −1 otherwise, never below 1."""
    target, draft = make_pair("llama")
    expected = autoregressive(target, PROMPT, n=40).tokens
    got = generate(target, draft, PROMPT, gamma=2, gamma_schedule="heuristic", params=GREEDY, max_new_tokens=40)
    assert got.tokens == expected
    hist = got.stats.gamma_history
    assert min(hist) >= 1 and len(set(hist)) > 1
    # replay the rule from the accepted counts (B=1): the next γ follows from this round's outcome
    same = generate(target, target, PROMPT, gamma=2, gamma_schedule="heuristic", params=GREEDY, max_new_tokens=40)
    assert same.stats.gamma_history[:4] == [2, 4, 6, 8]  # the draft is the target: all accepted
    assert same.stats.acceptance_rate == 1.0


def test_one_token_prompt_and_vocab_mismatch():
    """A prompt of one token (empty prefill) and a draft with a wider vocabulary than the target."""
    target, _ = make_pair("qwen2", vocab=64)
    _, wide = make_pair("qwen2", seed=1, vocab=72)
    ids = torch.tensor([[11]])
    expected = autoregressive(target, ids, n=12).tokens
    assert generate(target, wide, ids, gamma=3, params=GREEDY, max_new_tokens=12).tokens == expected


def test_logits_hook_suppresses_tokens_in_every_mode(pair):
    """The hook Whisper needs: suppressed tokens never appear, and speculative still equals autoregressive."""
    target, draft = pair
    plain = autoregressive(target, PROMPT, n=20).tokens[0]
    banned = sorted(set(plain[:5]))

    def hook(logits, positions, tokens):
        logits = logits.clone()
        logits[..., banned] = -math.inf
        return logits

    t, d = Decoder(target, logits_hook=hook), Decoder(draft, logits_hook=hook)
    expected = autoregressive(t, PROMPT, n=20).tokens
    assert not set(expected[0]) & set(banned)
    assert generate(t, d, PROMPT, gamma=4, params=GREEDY, max_new_tokens=20).tokens == expected
    sampled = generate(t, d, PROMPT, gamma=4, params=SamplingParams(temperature=1.0, seed=3), max_new_tokens=20)
    assert not set(sampled.tokens[0]) & set(banned)


def test_logits_hook_reads_each_rows_own_prefix(pair):
    """A hook whose rule depends on the tokens before each row (never either of the last two tokens; the
    rejected slots a shorter row keeps as holes are not its tokens): batched left-padded prompts, greedy
    speculative equals autoregressive row by row, and no sampled token equals either of the two before it,
    though the target scores γ+1 rows each with the draft tokens before it as its prefix."""
    target, draft = pair

    def no_repeat(logits, positions, tokens):
        T = logits.shape[1]
        logits = logits.clone()
        for b, row in enumerate(tokens.tolist()):
            for t in range(T):
                prefix = [x for x in row[: len(row) - (T - 1 - t)] if x >= 0]
                logits[b, t, prefix[-2:]] = -math.inf
        return logits

    ids, mask = left_pad(PROMPTS)
    t, d = Decoder(target, logits_hook=no_repeat), Decoder(draft, logits_hook=no_repeat)
    expected = [autoregressive(t, torch.tensor([p]), n=16).tokens[0] for p in PROMPTS]
    for gamma in (2, 5):
        assert generate(t, d, ids, mask, gamma=gamma, params=GREEDY, max_new_tokens=16).tokens == expected
    sampled = generate(t, d, ids, mask, gamma=4, params=SamplingParams(temperature=1.5, seed=5), max_new_tokens=24)
    for prompt, new in zip(PROMPTS, sampled.tokens):
        seq = prompt + new
        assert all(x not in seq[i - 2 : i] for i, x in enumerate(seq) if i >= len(prompt)), seq
    assert 0 < sampled.stats.accepted_tokens < sampled.stats.draft_tokens


# ----------------------------------------------------------------------------------------------------
# EOS and the token budget


def test_eos_inside_accepted_draft_ends_there(pair):
    target, _ = pair
    plain = autoregressive(target, PROMPT, n=12).tokens[0]
    eos = plain[3]
    cut = plain[: plain.index(eos) + 1]
    # the draft is the target itself: all γ = 6 drafts accepted, the EOS sits inside them
    got = generate(target, target, PROMPT, gamma=6, params=GREEDY, max_new_tokens=12, eos_token_ids=[eos])
    assert got.tokens == [cut] and got.finish_reasons == ["eos"]
    assert got.stats.new_tokens == len(cut) and got.stats.target_calls == 1
    assert autoregressive(target, PROMPT, n=12, eos_token_ids=eos).tokens == [cut]


def test_batch_rows_finish_independently(pair):
    target, draft = pair
    b1 = [autoregressive(target, torch.tensor([r]), n=16).tokens[0] for r in PROMPTS]
    eos = b1[1][2]  # ends row 1 early; maybe others too
    expected = [r[: r.index(eos) + 1] if eos in r else r for r in b1]
    ids, mask = left_pad(PROMPTS)
    got = generate(target, draft, ids, mask, gamma=4, params=GREEDY, max_new_tokens=16, eos_token_ids={eos})
    assert got.tokens == expected
    assert got.finish_reasons == ["eos" if eos in r else "length" for r in b1]


@pytest.mark.parametrize("mode", ["autoregressive", "exact"])
def test_each_rows_own_counts_add_up_to_the_batchs(pair, mode):
    """result.rows: each input row's tokens, calls, drafts and γ; summed over the rows, the batch's; a row that ends
    early took part in fewer calls. rows_share of every row is the batch's stats; the shares of a partition of the
    rows add up to the batch's calls and times."""
    target, draft = pair
    b1 = [autoregressive(target, torch.tensor([r]), n=16).tokens[0] for r in PROMPTS]
    eos = b1[1][2]  # ends row 1 early
    ids, mask = left_pad(PROMPTS)
    got = generate(target, draft, ids, mask, mode=mode, gamma=4, params=GREEDY, max_new_tokens=16, eos_token_ids={eos})
    whole, rows = got.stats, got.rows
    assert [r.new_tokens for r in rows] == [len(t) for t in got.tokens]
    for name in ("new_tokens", "row_calls", "draft_tokens", "accepted_tokens"):
        assert sum(getattr(r, name) for r in rows) == getattr(whole, name), name
    assert max(r.target_calls for r in rows) == whole.target_calls
    assert rows[1].target_calls < whole.target_calls and rows[1].target_calls == rows[1].row_calls
    hist = [sum(h) for h in zip(*(r.accepted_histogram + [0] * (len(whole.accepted_histogram) - len(r.accepted_histogram))
                                   for r in rows))]
    assert hist == whole.accepted_histogram
    if mode != "autoregressive":  # each row's γ: the batch's first rounds
        assert all(r.gamma_history == whole.gamma_history[: r.target_calls] for r in rows)
    assert rows_share(got, list(range(len(PROMPTS)))).to_dict() == whole.to_dict()
    parts = [rows_share(got, [1]), rows_share(got, [r for r in range(len(PROMPTS)) if r != 1])]
    assert parts[0].new_tokens == len(got.tokens[1]) and parts[0].gamma_history == rows[1].gamma_history
    for name in ("target_calls", "draft_calls", "verify_calls", "wall_s", "prefill_s", "draft_s", "target_s", "verify_s"):
        assert sum(getattr(p, name) for p in parts) == pytest.approx(getattr(whole, name)), name
    if whole.verify_calls:  # a cost per call stays the batch's
        assert parts[0].verify_ms_per_call == pytest.approx(whole.verify_ms_per_call)


@pytest.mark.parametrize("max_new", [1, 2, 3, 7, 13])
def test_max_new_tokens_never_exceeded(max_new):
    target, _ = make_pair("llama")
    expected = autoregressive(target, PROMPT, n=max_new).tokens
    got = generate(target, target, PROMPT, gamma=5, params=GREEDY, max_new_tokens=max_new)  # all accepted
    assert got.tokens == expected and len(got.tokens[0]) == max_new
    assert got.stats.new_tokens == max_new and got.finish_reasons == ["length"]
    assert sum(g + 1 for g in got.stats.gamma_history) <= max_new  # γ shrank instead of overshooting
    sampled = generate(target, target, PROMPT, gamma=5, params=SamplingParams(temperature=1.0, seed=1), max_new_tokens=max_new)
    assert len(sampled.tokens[0]) == max_new


def test_zero_new_tokens():
    target, draft = make_pair("llama")
    got = generate(target, draft, PROMPT, params=GREEDY, max_new_tokens=0)
    assert got.tokens == [[]] and got.stats.new_tokens == 0


# ----------------------------------------------------------------------------------------------------
# sampling: the target's distribution


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, params, gamma, n",
    [
        ("autoregressive", SamplingParams(temperature=1.0, seed=11), 3, N_SAMPLES),
        ("exact", SamplingParams(temperature=1.0, seed=12), 3, 102_000),
        ("exact", SamplingParams(temperature=1.0, seed=15), 1, N_SAMPLES),
        ("baseline", SamplingParams(temperature=1.0, seed=13), 3, N_SAMPLES),
        ("exact", SamplingParams(temperature=0.7, top_k=5, top_p=0.95, seed=14), 3, N_SAMPLES),
    ],
)
def test_sampling_matches_the_targets_distribution(small_pair, verify_calls, mode, params, gamma, n):
    """n runs of one prompt in batches of 3 000 (3 new tokens): the joint of the first two tokens must fit the
    exact joint, chi-square p > 1e-3, and every verification of the run makes the reference's decisions on the
    inputs the loop handed it (VerifyCalls.replay). γ = 3: the pair comes from accepted drafts and resampled
    tokens (the first round asks for 2: its bonus token is the third); γ = 1: a row whose first draft token is
    accepted has a bonus token second, in the batch.

    Power against the near-miss sampler (residual max(0, p − 0.9·q), joint TV 0.013 on these two tokens): the
    replay misses it with the chance near_miss_escape computes from the run's first calls, asserted < 1 %
    (exact: below 1e-30 at 12 000 draws); the chi-square alone has noncentrality ≈ 15 at 12 000 draws (power 5 %) and
    ≈ 130 at 102 000 (63 degrees of freedom: power 0.9999; the mutant's joint measured over 800 000 draws),
    hence 102 000 for exact at T = 1, γ = 3. Baseline draws its resampled tokens with its own generator: the
    replay holds its counts and accepted tokens, the chi-square the rest."""
    target, draft = small_pair
    prompt = torch.tensor([[1, 6, 2, 3]])
    joint = exact_first_two(target, prompt, params)
    results = []
    tokens, rate = sample_many(target, draft, prompt, params, n=n, results=results, mode=mode, gamma=gamma,
                               max_new_tokens=3, gamma_schedule="constant")
    assert all(len(t) == 3 for t in tokens)
    assert first_two_pvalue(tokens, joint) > 1e-3
    if mode == "autoregressive":
        return
    assert 0.2 < rate < 0.95  # rejections and resampling really happen
    replayed = verify_calls.replay()
    assert replayed["rows"] >= n and replayed["resampled"] > n / 10, replayed
    if mode == "exact":
        assert verify_calls.near_miss_escape() < 0.01
    if gamma == 1:  # the first round verifies 1 draft token: accepted, the second token is its bonus token
        bonus = sum(got.stats.accepted_histogram[1] for got in results)
        assert bonus > n / 4, f"{bonus} of {n} rows drew a bonus token second"


def near_miss(draft_tokens, draft_probs, target_logits, uniforms, temperature=1.0, alpha=-1e4, beta=1e4):
    """The rule of kernels/reference.py but for its residual, max(0, p − 0.9·q): the same acceptance, the
    resampled tokens a little off (joint TV 0.013 on small_pair's first two tokens). A sampler tests must reject."""
    from specdec_cli.kernels import Verification
    from specdec_cli.kernels.draw import assemble, draw_from_weights, first_rejection

    B, gamma = draft_tokens.shape
    p = (target_logits.double() / temperature).softmax(-1)  # [B, γ+1, V]
    q = draft_probs.double()  # [B, γ, V]
    x = draft_tokens[..., None]
    q_x, p_x = q.gather(-1, x)[..., 0], p[:, :gamma].gather(-1, x)[..., 0]  # [B, γ]
    n = first_rejection((q_x > 0) & (uniforms[:, :gamma].double() * q_x <= p_x))  # [B]
    weights = torch.cat([(p[:, :gamma] - 0.9 * q).clamp(min=0), p[:, gamma:]], dim=1)[torch.arange(B), n]  # [B, V]
    return Verification(assemble(draft_tokens, n, draw_from_weights(weights.float(), uniforms[:, gamma])), n)


@pytest.mark.slow
def test_distribution_test_has_power(small_pair, monkeypatch):
    """The same test rejects the draft's own distribution and sigmoid's lossy one (chi-square), and the
    near-miss sampler: its tokens pass the chi-square at 12 000 draws, its decisions fail the replay."""
    import dataclasses

    from conftest import VerifyCalls
    from specdec_cli.decoding.verify import VERIFIERS

    target, draft = small_pair
    prompt = torch.tensor([[1, 6, 2, 3]])
    params = SamplingParams(temperature=1.0, seed=21)
    joint = exact_first_two(target, prompt, params)
    drafted, _ = sample_many(draft, None, prompt, params, mode="autoregressive", max_new_tokens=2)
    assert first_two_pvalue(drafted, joint) < 1e-6
    sig, rate = sample_many(target, draft, prompt, params, mode="sigmoid", gamma=3, max_new_tokens=3)
    assert rate > 0.95  # α = −1e4, β = 1e4: almost everything is accepted
    assert first_two_pvalue(sig, joint) < 1e-6
    monkeypatch.setitem(VERIFIERS, "exact", dataclasses.replace(VERIFIERS["exact"], torch_kernel=near_miss))
    calls = VerifyCalls(monkeypatch)
    near, _ = sample_many(target, draft, prompt, params, mode="exact", gamma=3, max_new_tokens=3)
    assert first_two_pvalue(near, joint) > 1e-3, "seed 21: the chi-square misses it (power 5 %)"
    with pytest.raises(AssertionError, match="differ from the reference"):
        calls.replay()


def test_sigmoid_runs_end_to_end_and_reports(pair):
    target, draft = pair
    got = generate(target, draft, PROMPT, mode="sigmoid", gamma=4, params=SamplingParams(temperature=1.0, seed=0), max_new_tokens=20)
    d = got.stats.to_dict()
    assert len(got.tokens[0]) == 20 and d["acceptance_rate"] is not None and d["mode"] == "sigmoid"
    assert d["draft_tokens"] > 0 and d["verify_ms_per_call"] > 0


def test_same_seed_same_output(pair):
    target, draft = pair
    runs = [generate(target, draft, PROMPT, params=SamplingParams(temperature=1.0, seed=7), max_new_tokens=16).tokens for _ in range(2)]
    assert runs[0] == runs[1]


# ----------------------------------------------------------------------------------------------------
# stats and errors


def test_stats_are_json_and_consistent(pair):
    import json

    target, draft = pair
    got = generate(target, draft, PROMPT, gamma=3, params=GREEDY, max_new_tokens=20)
    s = json.loads(json.dumps(got.stats.to_dict()))
    for key in ("new_tokens", "target_calls", "draft_tokens", "accepted_tokens", "acceptance_rate",
                "mean_accepted_per_call", "wall_s", "tokens_per_s", "verify_ms_per_call"):
        assert key in s
    assert s["draft_tokens"] == sum(s["gamma_history"]) and s["verify_calls"] == sum(g > 0 for g in s["gamma_history"])
    assert sum(s["rounds_per_gamma"]) == s["target_calls"] == len(s["gamma_history"])  # γ 0: a plain step
    assert s["acceptance_rate"] == pytest.approx(s["accepted_tokens"] / s["draft_tokens"])
    assert s["new_tokens"] == s["accepted_tokens"] + s["target_calls"]  # B=1: one extra token per call
    assert s["wall_s"] >= s["draft_s"] + s["target_s"] + s["verify_s"]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(mode="fast"), "mode"),
        (dict(gamma=0), "gamma"),
        (dict(gamma_schedule="cosine"), "schedule"),
        (dict(max_new_tokens=-1), "max-new-tokens"),
    ],
)
def test_bad_arguments_raise(pair, kwargs, words):
    target, draft = pair
    with pytest.raises(SpecdecError, match=words):
        generate(target, draft, PROMPT, **kwargs)


def test_missing_draft_and_empty_prompt_raise(pair):
    target, _ = pair
    with pytest.raises(SpecdecError, match="draft"):
        generate(target, None, PROMPT, mode="exact")
    with pytest.raises(SpecdecError, match="empty"):
        generate(target, None, PROMPT, torch.zeros_like(PROMPT), mode="autoregressive")


def test_vocab_size_cuts_padding_rows():
    """vocab_size=V: tokens >= V are never emitted, by either model (check_compatible's V)."""
    target, draft = make_pair("llama", vocab=64)
    got = generate(target, draft, PROMPT, gamma=3, params=SamplingParams(temperature=1.0, seed=2), max_new_tokens=40, vocab_size=16)
    assert max(got.tokens[0]) < 16
    greedy = generate(target, draft, PROMPT, gamma=3, params=GREEDY, max_new_tokens=10, vocab_size=16)
    assert greedy.tokens == autoregressive(target, PROMPT, n=10, vocab_size=16).tokens


def test_kept_logits_reach_the_output_layer_as_dense_rows(pair):
    """A forward over T > 1 tokens that keeps the last logits hands the output layer a dense [B, 1, H]: with a
    view whose batch stride spans all T rows, torch's matmul copies the whole [V, H] weight for every call where
    the weight needs no grad (as loading leaves it). The logits are the last row of a full forward's."""
    target = copy.deepcopy(pair[0]).requires_grad_(False)
    seen = []
    target.get_output_embeddings().register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    decoder, tokens = Decoder(target), PROMPT[:, :6]  # [1, 6]
    positions = torch.arange(6)[None]  # [1, 6]
    with torch.inference_mode():
        decoder.reset()
        kept = decoder.forward(tokens, None, positions, keep=1)  # [1, 1, V]
        decoder.reset()
        full = decoder.forward(tokens, None, positions)  # [1, 6, V]
    x = seen[0]  # [1, 1, H]
    assert x.shape[1] == 1 and x.stride(0) == x.shape[1] * x.stride(1), x.stride()
    torch.testing.assert_close(kept[:, 0], full[:, -1])


# ----------------------------------------------------------------------------------------------------
# an encoder-decoder (Whisper) through the Seq2SeqDecoder adapter


def test_whisper_decoder_plugs_in():
    """Encoder run once, its output shared by the target's decoder and a 2-layer copy; left-padded
    decoder prompts; rows finishing early (EOS) drop their encoder rows too. Reference: a plain
    greedy loop without any cache."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from transformers.modeling_outputs import BaseModelOutput

    torch.manual_seed(0)
    config = WhisperConfig(
        vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=4, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
        max_source_positions=16, max_target_positions=64, init_std=0.3,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )
    target = WhisperForConditionalGeneration(config).eval()
    draft_config = copy.deepcopy(config)
    draft_config.decoder_layers = 2
    draft = WhisperForConditionalGeneration(draft_config).eval()
    draft.load_state_dict(target.state_dict(), strict=False)
    with torch.inference_mode():
        encoded = target.model.encoder(torch.randn(3, 8, 32)).last_hidden_state  # [3, 32, 32]

    def on(model, rows):
        return Seq2SeqDecoder(model, forward_kwargs={"encoder_outputs": BaseModelOutput(last_hidden_state=encoded[rows])})

    prompts = [[1, 5, 7], [1, 9], [1, 3, 4, 6]]
    expected = []
    for b, prompt in enumerate(prompts):
        seq = list(prompt)
        with torch.inference_mode():
            for _ in range(12):
                enc = BaseModelOutput(last_hidden_state=encoded[b : b + 1])
                seq.append(int(target(decoder_input_ids=torch.tensor([seq]), encoder_outputs=enc).logits[0, -1].argmax()))
        expected.append(seq[len(prompt) :])
    ids, mask = left_pad(prompts)
    every = slice(None)
    for gamma in (1, 3, 5):
        got = generate(on(target, every), on(draft, every), ids, mask, gamma=gamma, params=GREEDY, max_new_tokens=12)
        assert got.tokens == expected
    eos = expected[1][2]
    got = generate(on(target, every), on(draft, every), ids, mask, gamma=3, params=GREEDY, max_new_tokens=12, eos_token_ids=[eos])
    assert got.tokens == [r[: r.index(eos) + 1] if eos in r else r for r in expected]
    assert got.finish_reasons[1] == "eos"


# ----------------------------------------------------------------------------------------------------
# a real model: SmolLM2-135M (llama), bf16, with its own first layers as the draft


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "baseline"])
def test_smollm2_self_draft_greedy_equals_autoregressive(smollm2, mode):
    from specdec_cli.drafts.layers import self_draft

    tok = smollm2.tokenizer
    prompts = ["The capital of France is", "def fibonacci(n):\n   "]
    rows = [tok(p)["input_ids"] for p in prompts]
    draft = self_draft(smollm2, 24)  # of 30 layers (acceptance ~ 0.1-0.3: SmolLM2's layers all matter)
    expected = [autoregressive(smollm2.model, torch.tensor([r]), n=16).tokens[0] for r in rows]
    ids, mask = left_pad(rows, pad=tok.pad_token_id or 0)
    got = generate(smollm2.model, draft.model, ids, mask, mode=mode, gamma=4, params=GREEDY, max_new_tokens=16)
    assert got.tokens == expected
    assert got.stats.acceptance_rate > 0.0


def test_greedy_output_unchanged_when_the_draft_stops_early(pair):
    target, draft = pair
    want = autoregressive(target, PROMPT, n=24).tokens
    got = generate(target, draft, PROMPT, mode="exact", gamma=4, params=GREEDY, max_new_tokens=24,
                   draft_stop_below=0.9)
    assert got.tokens == want
    assert min(got.stats.gamma_history) < 4, "some round stopped drafting early"
    assert got.stats.draft_tokens == sum(got.stats.gamma_history)


@pytest.mark.slow
def test_sampling_keeps_the_targets_distribution_when_the_draft_stops_early(small_pair, verify_calls):
    """B = 1, so the stopping rule decides per sequence; 3 000 runs, chi-square p > 1e-3 as above, and every
    verification replayed through the reference (the near-miss sampler missed with chance < 1 %)."""
    target, draft = small_pair
    prompt = torch.tensor([[1, 6, 2, 3]])
    params = SamplingParams(temperature=1.0, seed=41)
    joint = exact_first_two(target, prompt, params)
    runs = sample_one_by_one(target, draft, prompt, 3000, mode="exact", gamma=3, max_new_tokens=3,
                             draft_stop_below=0.6)
    tokens = [t for got in runs for t in got.tokens]
    stopped = sum(got.stats.gamma_history[0] < 2 for got in runs)  # the first round may draft 2 (3 new tokens at most)
    assert stopped > 300, "the rule really ends rounds early"
    assert first_two_pvalue(tokens, joint) > 1e-3
    assert verify_calls.replay()["resampled"] > 300 and verify_calls.near_miss_escape() < 0.01


@pytest.mark.slow
def test_the_python_api_example_runs(smollm2, session_model_cache, monkeypatch, capsys):
    """examples/python_api.py, the README's Python section, runs as written."""
    import runpy

    monkeypatch.setenv("SPECDEC_CACHE", str(session_model_cache))
    runpy.run_path(str(ROOT / "examples" / "python_api.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "greedy speculative == target alone: True" in out and "acceptance" in out, out
