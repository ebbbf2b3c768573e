"""What every verification implementation returns, and the pieces of the contract they share.

Every implementation (reference, baseline, exact, sigmoid; torch or Triton) has one signature,

    fn(draft_tokens, draft, target_logits, uniforms, temperature=1.0, alpha=-1e4, beta=1e4) -> Verification

with the shapes of decoding/verify.py: `draft` is what the mode reads of the draft (its probabilities, or its
logits for baseline and sigmoid), or None for a deterministic draft (q one-hot at the draft tokens). α and β
are sigmoid's constants (paper eq. 5); the other modes take them and do not read them.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from specdec_cli.errors import InvalidDraftTokensError, NonFiniteLogitsError

PAD = -1  # out_tokens after the emitted ones

# error bits a Triton launch leaves in Verification.counts[1] (exact._draw writes them)
ERRORS = {1: "target logits contain NaN or +inf", 2: "target logits are all -inf in a row: every token is masked",
          4: "draft token ids outside [0, V): the draft's vocabulary is not the target's"}


def triton_backend_name() -> str:
    """"triton" when kernels compile for a GPU, "triton-interpreter" when they run on the CPU."""
    return "triton-interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else "triton"


def raise_for(error: list[int]) -> None:
    """The error of a launch's flags (any row's), read on the host by the caller when it chooses (the decoding loop
    reads them with the accepted counts it copies anyway). Bits are ORed over the rows."""
    bits = 0
    for b in error:
        bits |= b
    if bits & 4:
        raise InvalidDraftTokensError(ERRORS[4])
    if bits:
        raise NonFiniteLogitsError(ERRORS[1] if bits & 1 else ERRORS[2])


def check_draft_tokens(draft_tokens: torch.Tensor, vocab: int) -> None:
    """Every draft id in [0, V), as every implementation demands (the Triton kernel flags the others and never reads
    them): InvalidDraftTokensError otherwise."""
    if draft_tokens.numel() and bool(((draft_tokens < 0) | (draft_tokens >= vocab)).any()):
        raise InvalidDraftTokensError(ERRORS[4])


class Verification(NamedTuple):
    """One verification step's result."""

    out_tokens: torch.Tensor  # int64 [B, γ+1]: the accepted draft tokens, the resampled or bonus token, then PAD
    num_accepted: torch.Tensor  # int64 [B]: draft tokens accepted (0..γ)
    counts: torch.Tensor | None = None  # int64 [2, B]: Triton's num_accepted, then its error bits (one buffer, one
    #                                     copy reads both), not read yet; None: no flags to read
    backend: str = "torch"  # "torch" | "triton" | "triton-interpreter"

    def checked(self) -> Verification:
        """This result with its error flags read (a host synchronisation): NonFiniteLogitsError when one is set."""
        if self.counts is None:
            return self
        raise_for(self.counts[1].tolist())  # one host synchronisation
        return self._replace(counts=None)

    def accepted(self) -> list[int]:
        """num_accepted on the host, with the error flags in the same copy: the step's one host
        synchronisation. NonFiniteLogitsError when a flag is set."""
        if self.counts is None:
            return self.num_accepted.tolist()
        accepted, error = self.counts.tolist()
        raise_for(error)
        return accepted
