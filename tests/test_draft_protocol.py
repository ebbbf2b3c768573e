"""One draft, one verifier: every draft kind follows decoding.draft.Draft and reads the slots without changing
them; the --draft grammar reaches a builder for each kind; each verification mode is one registry entry, and the
loop asks the entry, never the mode's name."""

import ast
import copy

import numpy as np
import pytest
import torch

from conftest import GREEDY, ROOT, left_pad, save_tiny_whisper
from specdec_cli import drafts, options
from specdec_cli.decoding import (
    VERIFIERS,
    Batch,
    Draft,
    DraftSettings,
    ModelDraft,
    SamplingParams,
    Slots,
    as_draft,
    generate,
)
from specdec_cli.drafts import spec
from specdec_cli.drafts.lookup import Lookup
from specdec_cli.models import load_whisper
from specdec_cli.models.causal_lm import CAUSAL_LM
from specdec_cli.models.whisper import WHISPER, cross_attention_dtype, decoder_layers
from specdec_cli.models.whisper_decoding import EncodedWindows, cross_kv
from specdec_cli.options import SummarizeOptions, TranscribeOptions
from specdec_cli.tasks import summarize, transcribe

PROMPTS = [[1, 2, 3, 4, 1, 2], [5, 1, 2, 3]]  # the first repeats: lookup proposes there


def _snapshot(slots: Slots):
    return slots.tokens.clone(), slots.valid.clone(), slots.positions.clone(), slots.length, slots.has_holes


def _assert_reads_only(draft: Draft, input_ids, mask, vocab: int, params=GREEDY):
    """Prefill the draft's caches as the loop does, then propose: the slots are the same before and after."""
    assert isinstance(draft, Draft)
    slots = Slots(input_ids, mask, torch.device("cpu"))
    slots.ensure(8)
    for d in draft.decoders:
        d.prefill(*slots.window(0, slots.pending))
    before = _snapshot(slots)
    settings = DraftSettings(params, params.generator(), vocab, keep_logits=True)
    with torch.inference_mode():
        proposal = draft.propose(slots, 4, settings)
    after = _snapshot(slots)
    assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(before, after))
    assert proposal.tokens.shape[0] == len(input_ids) and proposal.tokens.shape[1] <= 4
    return proposal


def test_causal_draft_kinds_follow_the_protocol_and_never_change_the_slots(tiny_target):
    ids, mask = left_pad(PROMPTS)
    opts = SummarizeOptions(draft_vocab=50, draft_quantized=False)
    kinds = {s: summarize.load_draft(s, tiny_target, opts, progress=False) for s in ("self:2", "lookup", "lookup+self:1")}
    kinds["a transformers model"] = as_draft(copy.deepcopy(tiny_target.model))
    for name, draft in kinds.items():
        fitted = draft.fit(Batch(ids))
        proposal = _assert_reads_only(fitted, ids, mask, tiny_target.output_size)
        if name == "lookup":
            assert proposal.tokens[0].tolist()[:2] == [3, 4] and proposal.probs is None  # one-hot: no distribution
        if name != "lookup":
            assert fitted.decoders, name
    sampled = kinds["self:2"].fit(Batch(ids))
    proposal = _assert_reads_only(sampled, ids, mask, tiny_target.output_size, SamplingParams(temperature=1.0, seed=3))
    assert proposal.probs is not None and proposal.logits is not None  # keep_logits: what sigmoid reads


def test_whisper_draft_kinds_fit_a_window(tmp_path):
    target = load_whisper(str(save_tiny_whisper(tmp_path / "t")), dtype="float32", device="cpu", progress=False)
    other = str(save_tiny_whisper(tmp_path / "o", seed=3, decoder_layers=1))
    opts = TranscribeOptions(draft_vocab=0, draft_quantized=False)
    kinds = {s: transcribe.load_draft(s, target, opts, progress=False) for s in ("self", "self:1", other, "lookup+self")}
    encoded = torch.randn(2, 1500, target.model.config.d_model)
    kv = cross_kv(decoder_layers(target), encoded, cross_attention_dtype(target.model))
    window = EncodedWindows([np.zeros(16000, dtype=np.float32)] * 2, encoded, kv)
    ids = torch.tensor([[1, 2, 3], [1, 2, 3]])
    for draft in kinds.values():
        _assert_reads_only(draft.fit(Batch(ids, None, window)), ids, None, target.output_size)
    assert drafts.model_draft(kinds["lookup+self"]) is not None and drafts.model_draft(Lookup()) is None


def test_every_kind_of_the_grammar_has_a_builder():
    for family in (CAUSAL_LM, WHISPER):
        for example in ("lookup", "lookup:3", "self", "self:2", "./a-model", "Org/name"):
            kind = spec.kind(example)
            assert (kind, family) in drafts.BUILDERS or (kind, drafts.ANY) in drafts.BUILDERS, (kind, family)


def test_one_registry_entry_per_mode():
    assert tuple(VERIFIERS) == options.VERIFY_MODES and set(options.SPECULATIVE_MODES) <= set(VERIFIERS)
    for v in VERIFIERS.values():
        assert v.reads in ("probs", "logits")
        assert v.kernel("torch", torch.device("cpu")) is v.torch_kernel
        assert v.kernel("auto", torch.device("cpu")) is v.torch_kernel  # a CPU decodes with the torch twin
    assert not VERIFIERS["sigmoid"].one_hot and not VERIFIERS["sigmoid"].lossless


def test_the_loop_never_names_a_verification_mode():
    """decoding/loop.py reads what a mode needs from its Verifier: no verification mode's name is written there."""
    source = (ROOT / "specdec_cli" / "decoding" / "loop.py").read_text()
    strings = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not strings & set(options.VERIFY_MODES), strings & set(options.VERIFY_MODES)


def test_a_new_draft_kind_needs_no_change_to_the_loop(small_pair):
    """A kind written here (it drafts the target's own argmax, as an oracle) runs through generate() unchanged,
    and greedy output stays the target's."""
    target = small_pair[0]

    class Echo(ModelDraft):  # a model draft whose decoder is the target itself: every token accepted
        pass

    ids, mask = left_pad(PROMPTS)
    want = generate(target, None, ids, mask, mode="autoregressive", params=GREEDY, max_new_tokens=12)
    got = generate(target, Echo(target).fit(Batch(ids)), ids, mask, mode="exact", gamma=3,
                   gamma_schedule="constant", params=GREEDY, max_new_tokens=12)
    assert got.tokens == want.tokens and got.stats.acceptance_rate == 1.0


@pytest.mark.parametrize("mode", ["sigmoid"])
def test_a_mode_without_a_one_hot_path_refuses_lookup_before_loading(mode):
    from specdec_cli.errors import SpecdecError

    with pytest.raises(SpecdecError, match="lookup"):
        drafts.check_mode(SummarizeOptions(mode=mode, draft="lookup+embedded"))
