"""The verification contract: one entry point, several implementations.

Every implementation takes the same inputs and returns the same outputs, so they can be held against
each other and against `reference` (kernels/reference.py), which is the specification.

Inputs
    draft_tokens  int64 [B, γ]        tokens the draft proposed
    draft_probs   float [B, γ, V]     the distribution each draft token was drawn from (after
                                      temperature / top-k / top-p)
    target_logits float [B, γ+1, V]   target logits at the γ draft positions plus the bonus position
                                      (fp32, bf16 or fp16); −inf marks a masked token
    uniforms      float [B, γ+1]      randomness in (0, 1]: column c < γ decides draft token c,
                                      column γ draws the resampled (or bonus) token by inverse CDF
    draft_logits  float [B, γ, V]     sigmoid only: the raw draft logits
Outputs
    out_tokens    int64 [B, γ+1]      accepted draft tokens, then the resampled or bonus token, then −1
    num_accepted  int64 [B]           how many draft tokens were accepted (0..γ)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODES = ("reference", "baseline", "exact", "sigmoid")


@dataclass
class Verified:
    out_tokens: torch.Tensor  # int64 [B, γ+1], −1 after the emitted tokens
    num_accepted: torch.Tensor  # int64 [B]
    backend: str  # "torch" | "triton" | "triton-interpreter"
