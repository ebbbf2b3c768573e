"""specdec_cli.drafts: the one --draft grammar, and self:K drafts of causal LMs (weights shared, caches their own)."""

import pytest
import torch
from transformers import DynamicCache

from conftest import assert_same_up_to_rounding, causal_lm_sums, ids_for
from specdec_cli.drafts.layers import self_draft
from specdec_cli.drafts.spec import self_layers
from specdec_cli.errors import SpecdecError
from specdec_cli.tasks.summarize import load_draft

# --------------------------------------------------------------------------------------------------
# self:K drafts


def test_self_draft_shares_weights_and_equals_a_truncated_forward(tiny_target):
    target = tiny_target
    draft = load_draft("self:2", target).loaded  # the LoadedModel the causal draft runs
    assert draft.source == "self" and len(draft.model.model.layers) == 2
    assert draft.tokenizer is target.tokenizer
    # no parameter of its own: every one is a target parameter, same storage
    target_ptrs = {p.data_ptr() for p in target.model.parameters()}
    assert all(p.data_ptr() in target_ptrs for p in draft.model.parameters())
    assert draft.model.lm_head.weight.data_ptr() == target.model.lm_head.weight.data_ptr()
    assert draft.model.model.norm is target.model.model.norm
    # the target is untouched
    assert len(target.model.model.layers) == 4

    ids = ids_for()
    with torch.no_grad():
        out = target.model(ids, output_hidden_states=True)
        # hidden_states[2] = output of the target's layer 1; then the final norm and lm_head
        expected = target.model.lm_head(target.model.model.norm(out.hidden_states[2]))
        got = draft.model(ids).logits
    assert_same_up_to_rounding(got, expected, causal_lm_sums(draft.model.config, keys=ids.shape[1]))
    assert not torch.allclose(got, out.logits, atol=1e-3)  # it really is a different model


def test_self_draft_kv_cache_is_its_own(tiny_target):
    target, draft = tiny_target, self_draft(tiny_target, 3)
    assert [layer.self_attn.layer_idx for layer in draft.model.model.layers] == [0, 1, 2]
    ids = ids_for(10)
    with torch.no_grad():
        full = draft.model(ids).logits
        target_cache, draft_cache = DynamicCache(config=target.model.config), DynamicCache(config=draft.model.config)
        target.model(ids[:, :6], past_key_values=target_cache, use_cache=True)
        steps = [draft.model(ids[:, :6], past_key_values=draft_cache, use_cache=True).logits]
        for t in range(6, 10):  # one token at a time, the target's cache left behind
            steps.append(draft.model(ids[:, t : t + 1], past_key_values=draft_cache, use_cache=True).logits)
    assert_same_up_to_rounding(torch.cat(steps, dim=1), full, causal_lm_sums(draft.model.config, keys=10))
    assert len(draft_cache.layers) == 3 and draft_cache.get_seq_length() == 10
    assert len(target_cache.layers) == 4 and target_cache.get_seq_length() == 6


@pytest.mark.parametrize("spec, words", [
    ("self:0", "between 1 and 3"), ("self:4", "between 1 and 3"), ("self:-1", "between 1 and 3"),
    ("self:x", "self:K"), ("self", "self:K"), ("self:", "self:K"),
])  # fmt: skip
def test_self_draft_refuses_bad_k(tiny_target, spec, words):
    with pytest.raises(SpecdecError, match=words):
        load_draft(spec, tiny_target)


def test_one_grammar_for_every_task():
    assert self_layers("self:4", 6) == (0, 1, 2, 3) and self_layers(" SELF:2 ", 6) == (0, 1)
    assert self_layers("self", 3) == self_layers("self:", 3) == (0, 1, 2)
    assert self_layers("self:0-2,5", 6) == (0, 1, 2, 5) and self_layers("self:1,3", 4) == (1, 3)
    assert self_layers("embedded", 6) is None and self_layers("Qwen/Qwen2.5-0.5B", 6) is None
    # a causal LM runs only its first K layers, fewer than all
    assert self_layers("self:3", 4, max_layers=3, prefix_only=True) == (0, 1, 2)
    for bad, words in [("self:0,2", "self:K"), ("self", "K between 1 and 3"), ("self:4", "between 1 and 3")]:
        with pytest.raises(SpecdecError, match=words):
            self_layers(bad, 4, max_layers=3, prefix_only=True)
    for bad, words in [("self:2,1", "increase"), ("self:0-9", "0..5"), ("self:a", "self:0-2,4"), ("self:7", "between 1 and 6")]:
        with pytest.raises(SpecdecError, match=words):
            self_layers(bad, 6)
