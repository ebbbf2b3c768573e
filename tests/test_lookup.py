"""Prompt lookup (drafts/lookup.py): what it proposes, greedy output token for token the target's, sampled
output the target's distribution."""

import numpy as np
import pytest
import torch

from conftest import GREEDY, autoregressive, exact_first_two, first_two_pvalue, left_pad, make_pair, sample_many
from specdec_cli.decoding import SamplingParams, as_draft, generate
from specdec_cli.drafts.lookup import Lookup, LookupThen, continuation

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("context, longest, k, want", [
    ([1, 2, 3, 4, 1, 2], 2, 5, [3, 4, 1, 2]),  # up to k, running into the tail itself
    ([1, 2, 9, 1, 2, 7, 1, 2], 2, 1, [7]),  # the latest of equally frequent continuations
    ([1, 2, 9, 1, 2, 9, 1, 2, 7, 1, 2], 2, 1, [9]),  # the most frequent continuation, though not the latest
    ([1, 2, 3], 2, 4, []),  # no earlier occurrence
    ([5, 5], 1, 3, [5]),  # a repeated token
    ([7], 1, 3, []),  # too short
])
def test_continuation(context, longest, k, want):
    assert continuation(np.array(context), k, longest).tolist() == want


def test_longest_tail_first():
    # the 3-token tail (8, 1, 2) matched at 0 proposes 3; the 1-token tail (2) alone would follow its occurrences
    assert Lookup(longest=3).lookup(np.array([8, 1, 2, 3, 2, 6, 8, 1, 2]), 2).tolist() == [3, 2]
    assert Lookup(longest=1).lookup(np.array([8, 1, 2, 3, 2, 6, 8, 1, 2]), 2).tolist() == [6, 8]
    assert Lookup(longest=3, shortest=2).lookup(np.array([4, 2, 9, 2]), 2).tolist() == []
    # a longer tail seen once beats the 1-token tail (5) that was followed by 2 three times
    ctx = np.array([9, 8, 7, 6, 5, 1, 5, 2, 5, 2, 5, 2, 9, 8, 7, 6, 5])
    assert Lookup().lookup(ctx, 1).tolist() == [1] and Lookup(longest=2).lookup(ctx, 1).tolist() == [1]
    assert Lookup(longest=1).lookup(ctx, 1).tolist() == [2]


def test_continuation_agrees_with_a_brute_force_search():
    """On random contexts over a small alphabet: the longest earlier-seen tail, then the most frequent next token."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        ctx = rng.integers(0, 4, int(rng.integers(1, 40)))
        L, want = len(ctx), []
        for n in range(min(6, L - 1), 0, -1):
            hits = [i for i in range(L - n) if (ctx[i : i + n] == ctx[L - n :]).all()]  # starts of earlier occurrences
            if hits:
                nxt = [int(ctx[i + n]) for i in hits]
                top = max(nxt.count(t) for t in nxt)
                start = [i for i in hits if nxt.count(int(ctx[i + n])) == top][-1] + n
                want = ctx[start : start + 3].tolist()
                break
        assert continuation(ctx, 3, 6).tolist() == want, ctx.tolist()


@pytest.fixture(scope="module")
def pair():
    return make_pair("qwen2", seed=3, vocab=32)


REPEATING = [[3, 14, 15, 9, 26, 5, 3, 14, 15, 9], [7, 1, 7, 1, 7], [20, 8, 8, 19]]  # the last: little to look up


@pytest.mark.parametrize("drafter", ["lookup", "lookup:2", "lookup+model"])
def test_greedy_lookup_equals_autoregressive(pair, drafter):
    target, draft = pair
    make = {"lookup": Lookup, "lookup:2": lambda: Lookup(2, 2),
            "lookup+model": lambda: LookupThen(Lookup(), as_draft(draft))}[drafter]
    for schedule in ("constant", "auto"):
        for prompt in REPEATING:
            ids = torch.tensor([prompt])
            want = autoregressive(target, ids, n=30).tokens
            got = generate(target, make(), ids, mode="exact", gamma=4, gamma_schedule=schedule, params=GREEDY,
                           max_new_tokens=30)
            assert got.tokens == want, f"{drafter} {schedule} {prompt}"
        ids, mask = left_pad(REPEATING)  # a batch: rows propose different lengths, some nothing
        got = generate(target, make(), ids, mask, mode="exact", gamma=4, gamma_schedule=schedule, params=GREEDY,
                       max_new_tokens=30)
        assert got.tokens == autoregressive(target, ids, mask, n=30).tokens


def test_lookup_proposes_and_plain_steps_where_nothing_matches(pair):
    target, _ = pair
    got = generate(target, Lookup(), torch.tensor([REPEATING[0]]), mode="exact", gamma=4, gamma_schedule="constant",
                   params=GREEDY, max_new_tokens=30)
    s = got.stats
    assert s.draft_tokens > 0 and s.accepted_tokens > 0  # the prompt repeats: proposals, some accepted
    assert s.target_calls < 30  # fewer target calls than tokens
    none = generate(target, Lookup(), torch.tensor([[1, 2, 3]]), mode="exact", gamma=4, max_new_tokens=1,
                    params=GREEDY)
    assert none.stats.draft_tokens == 0 and none.tokens == autoregressive(target, torch.tensor([[1, 2, 3]]), n=1).tokens


@pytest.fixture(scope="module")
def small():
    return make_pair("llama", seed=5, vocab=8, hidden=16, layers=3, keep=1, damp=0.6)[0]


@pytest.mark.parametrize("mode, params", [("exact", SamplingParams(temperature=1.0, seed=31)),
                                          ("baseline", SamplingParams(temperature=1.0, seed=32)),
                                          ("exact", SamplingParams(temperature=0.7, top_k=5, top_p=0.95, seed=33))])
def test_sampling_with_lookup_keeps_the_targets_distribution(small, verify_calls, mode, params):
    """12 000 runs of a prompt whose last 2-gram occurred before (lookup proposes 2, 3, 1 in the first round):
    the joint of the first two tokens must fit the exact joint, chi-square p > 1e-3, and every verification of
    the one-hot path makes the reference's decisions on the inputs the loop handed it (VerifyCalls.replay)."""
    prompt = torch.tensor([[1, 6, 2, 3, 1, 6]])
    joint = exact_first_two(small, prompt, params)
    tokens, rate = sample_many(small, Lookup(), prompt, params, mode=mode, gamma=3, max_new_tokens=3,
                               gamma_schedule="constant")
    assert rate is not None and 0.02 < rate < 0.98  # acceptance and rejection both happen
    assert first_two_pvalue(tokens, joint) > 1e-3
    assert verify_calls.replay()["resampled"] > 1000


def test_sigmoid_refuses_lookup(pair):
    from specdec_cli.errors import SpecdecError

    with pytest.raises(SpecdecError, match="lookup"):
        generate(pair[0], Lookup(), torch.tensor([REPEATING[0]]), mode="sigmoid", gamma=3,
                 params=SamplingParams(temperature=1.0), max_new_tokens=5)
