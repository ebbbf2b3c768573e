"""A cheaper draft on a CPU: weight-only int8 for the draft's linear layers (--draft-int8, on by default).

At batch 1 a decoding step multiplies one activation row by every weight matrix, so its time is the time to read
the weights: int8 (one scale per output row) reads half of bf16's bytes. The layers are models/int8.Int8Linear, the
int8 target's own (kernels/int8_rows), keeping the original weight for a prompt's many rows.

Only the draft is quantized. Verification checks every draft token against the unmodified target, so the output is
still exactly the target's; only the acceptance rate can move.
"""

from __future__ import annotations

from torch import nn

from specdec_cli.kernels import int8_rows
from specdec_cli.models.int8 import Int8Linear, fits
from specdec_cli.models.weights import replace_linears


def quantize_linears(module: nn.Module, skip: nn.Module | None = None) -> nn.Module:
    """Replace every nn.Linear inside `module` (except `skip`) that fits() by an Int8Linear keeping its weight for
    prompts, in place. Idempotent. Call it only on modules the draft owns: a self:K draft's layers are the target's
    own."""
    replace_linears(module, lambda linear: Int8Linear(linear, dense=True), lambda linear: linear is not skip and fits(linear))
    return module


def has_plain_linears(draft) -> bool:
    """Whether quantize_draft may find layers to replace: a draft on a CPU with an nn.Linear (not one on GGUF blocks,
    whose layers are 4-8 bits already)."""
    return draft.device.type == "cpu" and any(type(m) is nn.Linear for m in draft.model.modules())


def quantize_draft(draft) -> None:
    """Int8 for a draft (models.LoadedModel) on a CPU: its decoder layers when it owns them (not a
    self:K draft), and its output layer (after subset_head.restrict_head: the subset's projection). Not where the
    int8 kernel did not build (its torch twin, in fp64, would make the draft slower, not cheaper)."""
    model = draft.model
    if not has_plain_linears(draft) or int8_rows.extension() is None:
        return
    head = model.get_output_embeddings()
    if draft.source != "self":
        quantize_linears(model, skip=head)
    if type(head) is nn.Linear:  # the full head (a self:K draft shares it: set it on the draft only)
        if fits(head):
            model.set_output_embeddings(Int8Linear(head, dense=True))
    else:  # a SubsetHead, or an Int8Linear already
        quantize_linears(head)
