"""Whisper in all its shapes: 80 and 128 mel bins, 51 864 (English-only), 51 865 and 51 866 (large-v3) output rows,
each with a distil-style draft (its own one-layer decoder; the target's encoder weights, which transcribe checks
and then shares, or an encoder of its own, which it runs), greedy output the target alone's over a recording longer
than 30 s; a draft whose vocabulary is not the target's is refused in one line."""

import numpy as np
import pytest

from conftest import save_tiny_whisper
from specdec_cli.errors import SpecdecError
from specdec_cli.models import load_whisper
from specdec_cli.models.whisper import special_ids
from specdec_cli.tasks import transcribe as T

SHAPES = {  # name: (mel bins, output rows, tokens beyond the shared tokenizer)
    "tiny.en": (80, 51864, []),
    "base": (80, 51865, []),
    "large-v3": (128, 51866, ["<|yue|>"]),
}


@pytest.fixture(scope="module")
def recording():
    """36 s: two windows, tones in bursts (something the random models decode differently window by window)."""
    t = np.arange(36 * 16000) / 16000
    return (0.3 * np.sin(2 * np.pi * (220 + 40 * np.sin(t)) * t) * (np.sin(2 * np.pi * 2 * t) > 0)).astype(np.float32)


@pytest.fixture(scope="module", params=list(SHAPES))
def shape(request, tmp_path_factory):
    mels, vocab, extra = SHAPES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    target = save_tiny_whisper(root / "target", mels=mels, vocab=vocab, extra_tokens=extra, decoder_layers=2)
    same = save_tiny_whisper(root / "distil", seed=1, mels=mels, vocab=vocab, extra_tokens=extra, decoder_layers=1,
                             encoder_of=target)
    other = save_tiny_whisper(root / "other", seed=2, mels=mels, vocab=vocab, extra_tokens=extra, decoder_layers=1)
    return request.param, target, same, other


def test_every_shape_transcribes_greedy_as_the_target_alone(shape, recording):
    name, target_dir, same_dir, other_dir = shape
    mels, vocab, _ = SHAPES[name]
    target = load_whisper(str(target_dir), dtype="float32", device="cpu", progress=False)
    assert target.output_size == vocab and target.model.config.num_mel_bins == mels
    assert special_ids(target).multilingual == (vocab != 51864)
    kw = dict(audios=[recording], max_new_tokens=12, no_speech_threshold=1.0, language="en")
    ar = T.transcribe(target, None, ["rec"], mode="autoregressive", **kw)[0]
    assert ar.stats.windows == 2 and ar.stats.new_tokens > 2
    for spec, shares in ((str(same_dir), True), (str(other_dir), False), ("self", None), ("lookup+self:1", None)):
        draft = T.load_draft(spec, target, draft_vocab=0, progress=False)
        if shares is not None:
            assert draft.shares_encoder is shares, spec  # checked on the weights, not assumed
        sp = T.transcribe(target, draft, ["rec"], mode="exact", gamma=3, **kw)[0]
        assert sp.text == ar.text and sp.stats.new_tokens == ar.stats.new_tokens, (name, spec)
        assert sp.stats.draft_tokens > 0


def test_a_draft_of_another_vocabulary_is_refused_in_one_line(tmp_path):
    """large-v3 added a token (<|yue|>): a base-vocabulary draft for a large-v3-shaped target is refused."""
    target = load_whisper(str(save_tiny_whisper(tmp_path / "v3", mels=128, vocab=51866, extra_tokens=["<|yue|>"])),
                          dtype="float32", device="cpu", progress=False)
    draft = save_tiny_whisper(tmp_path / "base", mels=80, vocab=51865, decoder_layers=1)
    with pytest.raises(SpecdecError, match="vocabularies differ") as e:
        T.load_draft(str(draft), target, progress=False)
    assert "\n" not in str(e.value)
