"""A draft whose output layer covers a subset of the vocabulary: cheaper, and still lossless."""

import copy

import pytest
import torch

from conftest import (
    GREEDY,
    PROMPT,
    assert_same_up_to_rounding,
    autoregressive,
    exact_first_two,
    first_two_pvalue,
    make_pair,
    sample_many,
)
from specdec_cli.decoding import generate
from specdec_cli.decoding.sampling import SamplingParams
from specdec_cli.drafts.subset_head import SubsetHead, frequent_ids, restrict_head

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_subset_head_scores_only_its_tokens():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=True)
    keep = torch.tensor([3, 7, 7, 0, 49])
    sub = SubsetHead(head.weight, head.bias, keep)
    h = torch.randn(2, 5, 16)
    full, got = head(h), sub(h)
    assert got.shape == full.shape
    kept = torch.tensor([0, 3, 7, 49])
    assert_same_up_to_rounding(got[..., kept], full[..., kept], sums=16)  # one dot product over d = 16
    others = torch.ones(50, dtype=torch.bool)
    others[kept] = False
    assert torch.isneginf(got[..., others]).all()
    assert sub.weight is head.weight, "the full head is shared, not copied"


def test_restrict_head_leaves_the_original_untouched():
    target, draft = make_pair("qwen2")
    before = target.lm_head
    restricted = restrict_head(draft, frequent_ids(20, 64))
    assert isinstance(restricted.get_output_embeddings(), SubsetHead)
    assert target.lm_head is before
    restrict_head(restricted, frequent_ids(30, 64))  # restricting again replaces, never nests
    assert restricted.get_output_embeddings().keep.numel() == 30


@pytest.mark.parametrize("mode", ["baseline", "exact"])
def test_greedy_output_unchanged_with_a_subset_draft(mode):
    target, draft = make_pair("llama")
    draft = restrict_head(copy.deepcopy(draft), torch.cat([frequent_ids(32, 64), PROMPT[0]]))
    want = autoregressive(target, PROMPT, n=24).tokens
    got = generate(target, draft, PROMPT, mode=mode, gamma=4, params=GREEDY, max_new_tokens=24)
    assert got.tokens == want
    assert 0 < got.stats.acceptance_rate < 1


@pytest.mark.slow
def test_sampling_keeps_the_targets_distribution_when_the_draft_misses_tokens(verify_calls):
    # the draft can only propose tokens 0..3 of 8: q = 0 elsewhere; the residual must restore p there.
    # chi-square on the joint of the first two tokens, p > 1e-3, and every verification replayed (as in
    # test_decoding).
    target, draft = make_pair("llama", seed=5, vocab=8, hidden=16, layers=3, keep=1, damp=0.6)
    draft = restrict_head(copy.deepcopy(draft), frequent_ids(4, 8))
    prompt = torch.tensor([[1, 6, 2, 3]])
    params = SamplingParams(temperature=1.0, seed=31)
    joint = exact_first_two(target, prompt, params)
    tokens, _ = sample_many(target, draft, prompt, params, mode="exact", gamma=3, max_new_tokens=3)
    assert any(t[0] >= 4 for t in tokens), "tokens the draft cannot propose still come out"
    assert first_two_pvalue(tokens, joint) > 1e-3
    assert verify_calls.replay()["resampled"] > 1000  # (q = 0 on half the tokens: a 0.9·q residual barely moves)
