"""A draft with int8 weights: close to the original layer, never touching the target, and lossless."""

import copy

import pytest
import torch
from torch import nn

from conftest import GREEDY, PROMPT, autoregressive, make_pair
from specdec_cli.decoding import generate
from specdec_cli.drafts.int8 import quantize_draft
from specdec_cli.drafts.layers import self_draft
from specdec_cli.drafts.subset_head import SubsetHead, frequent_ids, restrict_head
from specdec_cli.models import LoadedModel
from specdec_cli.models.int8 import DENSE_ROWS, Int8Linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_is_close_to_the_layer(dtype):
    torch.manual_seed(0)
    layer = nn.Linear(96, 40).to(dtype)
    q = Int8Linear(layer, dense=True)
    x = torch.randn(3, 1, 96).to(dtype)  # 3 rows: the int8 kernel
    want, got = layer(x).float(), q(x).float()
    assert got.shape == want.shape
    # W and each row of x rounded to int8 with their own scales (to nearest): each rounding moves an element by at most
    # half a step, amax / 254, ~0.4-0.6 % of its typical size for these uniform weights and normal x, so y moves by
    # well under 1 % (bf16 outputs add a rounding of 2^-9)
    rel = (got - want).norm() / want.norm()
    assert rel < (0.02 if dtype == torch.float32 else 0.04), f"relative error {rel:.4f}"
    assert not torch.equal(got, want), "the int8 kernel ran (rounded weights give a different result)"


def test_int8_linear_uses_the_original_weight_for_a_prompt():
    torch.manual_seed(0)
    layer = nn.Linear(32, 8)
    x = torch.randn(1, DENSE_ROWS + 1, 32)  # more rows than a step or pass: a prompt
    torch.testing.assert_close(Int8Linear(layer, dense=True)(x), layer(x), rtol=0, atol=0)
    assert not torch.equal(Int8Linear(layer)(x), layer(x)), "without dense: the int8 kernel, whatever the rows"


def loaded(model, source="local"):
    return LoadedModel(model=model, tokenizer=None, name="tiny", source=source)


def test_quantize_draft_replaces_every_linear_and_is_idempotent():
    _, draft = make_pair("llama")
    d = loaded(restrict_head(copy.deepcopy(draft), frequent_ids(32, 64)))
    quantize_draft(d)
    assert not [m for m in d.model.modules() if type(m) is nn.Linear], "every linear is int8"
    assert isinstance(d.model.get_output_embeddings().proj, Int8Linear)
    layers = list(d.model.modules())
    quantize_draft(d)  # again: nothing new
    assert all(a is b for a, b in zip(layers, d.model.modules()))


def test_without_the_int8_kernel_the_draft_keeps_its_weights(monkeypatch):
    from specdec_cli.kernels import int8_rows

    monkeypatch.setattr(int8_rows, "extension", lambda: None)  # no build: its fp64 twin would be slower than the layer
    _, draft = make_pair("llama")
    d = loaded(copy.deepcopy(draft))
    quantize_draft(d)
    assert not [m for m in d.model.modules() if isinstance(m, Int8Linear)]
    assert [m for m in d.model.modules() if type(m) is nn.Linear]


def test_a_self_draft_never_changes_the_target():
    target, _ = make_pair("qwen2")
    t = loaded(target)
    before = {name: type(m) for name, m in target.named_modules()}
    draft = self_draft(t, 2)
    quantize_draft(draft)  # full head: int8 on the draft only
    assert isinstance(draft.model.get_output_embeddings(), Int8Linear)
    restrict_head(draft.model, frequent_ids(32, 64))
    quantize_draft(draft)  # subset head: its projection, the draft's own
    assert isinstance(draft.model.get_output_embeddings(), SubsetHead)
    assert {name: type(m) for name, m in target.named_modules()} == before, "the target's layers are untouched"


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("mode", ["baseline", "exact"])
def test_greedy_output_unchanged_with_an_int8_draft(mode, gamma):
    target, draft = make_pair("llama")
    d = loaded(restrict_head(copy.deepcopy(draft), torch.cat([frequent_ids(48, 64), PROMPT[0]])))
    quantize_draft(d)
    want = autoregressive(target, PROMPT, n=24).tokens
    got = generate(target, d.model, PROMPT, mode=mode, gamma=gamma, params=GREEDY, max_new_tokens=24)
    assert got.tokens == want
    assert got.stats.acceptance_rate > 0
