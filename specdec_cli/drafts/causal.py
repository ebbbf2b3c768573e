"""A causal LM as the draft: another model (`--draft MODEL`) or the target's own first layers (`self:K`,
drafts/layers.py), made cheaper for each batch without changing the output:

    - an output layer over the `head_size` most frequent ids, the batch's prompt ids and EOS (subset_head.py);
    - int8 weights on a CPU (int8.py) for the layers not on GGUF blocks (models/weights.py: those are 4-8 bits
      already and stay as they are).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from specdec_cli.decoding import Batch, Decoder, ModelDraft
from specdec_cli.decoding.llama_like import draft_decoder
from specdec_cli.drafts.int8 import has_plain_linears, quantize_draft
from specdec_cli.drafts.subset_head import frequent_ids, restrict_head
from specdec_cli.kernels import int8_rows
from specdec_cli.models import LoadedModel, check_compatible
from specdec_cli.models.causal_lm import eos_ids
from specdec_cli.models.progress import build_kernels
from specdec_cli.models.weights import load_held
from specdec_cli.options import DecodeOptions


class CausalDraft(ModelDraft):
    """A causal LM draft. Fitted to a batch: its output layer scores only `head_size` frequent ids (0: every id)
    plus the batch's prompt ids and `keep_ids`, and with `quantized` its weights are int8 on a CPU."""

    def __init__(self, loaded: LoadedModel, vocab: int | None, *, head_size: int = 0, keep_ids: Iterable[int] = (),
                 quantized: bool = False):
        super().__init__(loaded.model, vocab=vocab)
        self.loaded = loaded
        self.head_size, self.keep_ids, self.quantized = head_size, sorted(keep_ids), quantized

    def decoder_for(self, batch: Batch) -> Decoder:
        if self.head_size > 0:
            keep = torch.cat([frequent_ids(self.head_size, self.loaded.output_size), batch.input_ids.flatten().cpu(),
                              torch.tensor(self.keep_ids, dtype=torch.int64)])
            restrict_head(self.loaded.model, keep)
        if self.quantized:
            quantize_draft(self.loaded)
        return draft_decoder(self.loaded.model)


def adopt(loaded: LoadedModel, target: LoadedModel, vocab: int, opts: DecodeOptions,
          progress: bool = True) -> CausalDraft:
    """`loaded` as the draft of `target`, with the options' output layer and weights (draft_vocab, draft_quantized;
    the int8 kernel built now, at load, where it will run)."""
    if opts.draft_quantized and has_plain_linears(loaded):
        build_kernels(progress, (int8_rows.KERNEL,))
    return CausalDraft(loaded, vocab, head_size=opts.draft_vocab, keep_ids=eos_ids(target),
                       quantized=opts.draft_quantized)


def build(draft_spec: str, target: LoadedModel, opts: DecodeOptions, progress: bool = True) -> CausalDraft:
    """Another causal LM, read in the target's dtype and on its device, checked against the target, its weights held
    as the target's are (--target-quant: with gguf, a GGUF draft on its own blocks on a CPU)."""
    loaded = load_held(draft_spec, getattr(opts, "target_quant", "none"), role="draft", dtype=target.dtype,
                       device=str(target.device), progress=progress)
    return adopt(loaded, target, check_compatible(target, loaded), opts, progress)
