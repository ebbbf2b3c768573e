"""Another Whisper model as the draft (`--draft DIR-or-ID`, the same vocabulary: a smaller Whisper, a
Distil-Whisper): its own decoder, fed the target's encoder output when the two encoders have the same
weights, else its own encoder's."""

from __future__ import annotations

import torch

from specdec_cli.decoding import Batch, ModelDraft
from specdec_cli.drafts.lean_whisper import head_extras, refuse_timestamps
from specdec_cli.drafts.subset_head import frequent_ids, restrict_head
from specdec_cli.models import LoadedModel, load_compatible
from specdec_cli.models.whisper import WHISPER, decoder_layers
from specdec_cli.models.whisper_decoding import WindowDecoder, cross_kv, encode, features, same_encoder
from specdec_cli.options import TranscribeOptions


class WhisperDraft(ModelDraft):
    """Fitted to a batch of windows: the draft's decoder over the target's encoder output (or its own, when its
    encoder differs). timestamps: its output layer scores the timestamp ids."""

    def __init__(self, loaded: LoadedModel, target: LoadedModel, vocab: int, timestamps: bool = True):
        super().__init__(loaded.model, vocab=vocab)
        self.loaded, self.name, self.timestamps = loaded, loaded.name, timestamps
        self.shares_encoder = same_encoder(target.model, loaded.model)

    def decoder_for(self, batch: Batch) -> WindowDecoder:
        refuse_timestamps(self.timestamps, batch)
        window = batch.window
        encoded = window.encoded if self.shares_encoder else encode(self.loaded, features(self.loaded, window.audio))
        return WindowDecoder(self.loaded.model, encoded, cross_kv(decoder_layers(self.loaded), encoded),
                             batch.logits_hook)


def build(draft_spec: str, target: LoadedModel, opts: TranscribeOptions, progress: bool = True) -> WhisperDraft:
    """Another Whisper model, checked against the target; with draft_vocab its output layer keeps the
    draft_vocab first ids, EOT and (with timestamps) the timestamp ids."""
    loaded, vocab = load_compatible(draft_spec, target, WHISPER, progress=progress)
    restricted = 0 < opts.draft_vocab < loaded.output_size
    if restricted:
        extra = head_extras(target, opts.timestamps)
        keep = torch.cat([frequent_ids(opts.draft_vocab, loaded.output_size), torch.tensor(extra)]).unique()
        restrict_head(loaded.model, keep)
    return WhisperDraft(loaded, target, vocab, timestamps=opts.timestamps or not restricted)
