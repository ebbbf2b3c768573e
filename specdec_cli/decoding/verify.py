"""The verification contract, and one registry entry per verification mode.

Every implementation takes the same inputs and returns the same outputs, so they can be held against
each other and against `reference` (kernels/reference.py), which is the specification.

Inputs
    draft_tokens  int64 [B, γ]        tokens the draft proposed
    draft         float [B, γ, V]     what the mode reads of the draft (Verifier.reads): the distribution
                  or None             each draft token was drawn from (after temperature / top-k / top-p),
                                      or for sigmoid the draft's logits. None: a deterministic draft (prompt
                                      lookup), q one-hot at the draft tokens: accept x iff u <= p(x), after a
                                      rejection draw from p without x. No [B, γ, V] tensor is built (baseline
                                      builds it, as a library without this path would)
    target_logits float [B, γ+1, V]   target logits at the γ draft positions plus the bonus position
                                      (fp32, bf16 or fp16); −inf marks a masked token
    uniforms      float [B, γ+1]      randomness in (0, 1]: column c < γ decides draft token c,
                                      column γ draws the resampled (or bonus) token by inverse CDF
Outputs (kernels.Verification)
    out_tokens    int64 [B, γ+1]      accepted draft tokens, then the resampled or bonus token, then PAD (−1)
    num_accepted  int64 [B]           how many draft tokens were accepted (0..γ)
    error         int32 [B] or None   Triton's flags, read with the counts (Verification.accepted)

At the edges, every implementation alike (tests/test_verify.py holds each against the others):
    - a draft id outside [0, V) is refused (InvalidDraftTokensError); the Triton kernel flags it and never reads
      the logits it would point at;
    - only the rows a decision reads are judged: the accepted positions and the row drawn from (the first
      rejection, or the bonus row). NaN, +inf or an all −inf row there is refused (NonFiniteLogitsError); after
      the first rejection a row changes nothing and is not read;
    - γ = 0 is a plain draw: out_tokens [B, 1] holds the token drawn from row 0, num_accepted is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec_cli import options
from specdec_cli.decoding.sampling import greedy_tokens
from specdec_cli.errors import SpecdecError
from specdec_cli.kernels import Verification, baseline, exact, reference, sigmoid

PROBS, LOGITS = "probs", "logits"  # what a verification mode reads of a model draft


class Kernel(Protocol):
    """The one signature of every implementation (kernels/contract.py)."""

    def __call__(self, draft_tokens: torch.Tensor, draft: torch.Tensor | None, target_logits: torch.Tensor,
                 uniforms: torch.Tensor, temperature: float = ..., alpha: float = ...,
                 beta: float = ..., /) -> Verification: ...


@dataclass(frozen=True)
class Verifier:
    """One verification mode: what it reads of the draft, and its implementations."""

    name: str
    reads: str  # PROBS | LOGITS: what a model draft hands it (a deterministic draft hands neither: one-hot)
    torch_kernel: Kernel  # the CPU path, or the only one
    triton_kernel: Kernel | None = None  # the fused Triton kernels (compiled on CUDA, interpreted on a CPU)
    one_hot: bool = True  # verifies a deterministic draft (q one-hot at its tokens)
    lossless: bool = True  # the output is the target's distribution

    def kernel(self, backend: str, device: torch.device) -> Kernel:
        """Its implementation for `backend` (options.BACKENDS: auto = Triton on CUDA, torch on a CPU)."""
        options.one_of("--backend", backend, options.BACKENDS)
        triton = backend == "triton" or (backend == "auto" and device.type == "cuda")
        return self.triton_kernel if triton and self.triton_kernel is not None else self.torch_kernel

    def refuse_one_hot(self) -> SpecdecError:
        return SpecdecError(f"--mode {self.name} needs a model draft's {self.reads}; a deterministic draft such as "
                            "lookup has none: use --mode exact")


VERIFIERS: dict[str, Verifier] = {v.name: v for v in (
    Verifier("reference", PROBS, reference.verify_reference),  # the specification, for tests
    Verifier("baseline", PROBS, baseline.verify_baseline),
    Verifier("exact", PROBS, exact.verify_exact_torch, exact.verify_exact_triton),
    Verifier("sigmoid", LOGITS, sigmoid.verify_sigmoid_torch, sigmoid.verify_sigmoid_triton, one_hot=False,
             lossless=False),
)}
assert tuple(VERIFIERS) == options.VERIFY_MODES, "options.VERIFY_MODES names the registry's modes"


def verify(
    mode: str,
    draft_tokens: torch.Tensor,
    draft: torch.Tensor | None,
    target_logits: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    temperature: float = 1.0,
    alpha: float = options.DecodeOptions.alpha,
    beta: float = options.DecodeOptions.beta,
    backend: str = options.DecodeOptions.backend,
) -> Verification:
    """Verify one step of γ draft tokens for B sequences (shapes: the module docstring) with the mode's
    implementation for `backend`. Triton's error flags come back unread: `.checked()` raises now,
    `.accepted()` raises with the counts.

    >>> B, g, V = 1, 2, 4
    >>> toks = torch.tensor([[1, 2]]); q = torch.full((B, g, V), 0.25); z = torch.zeros(B, g + 1, V)
    >>> verify("exact", toks, q, z, torch.ones(B, g + 1)).num_accepted   # p == q: always accepted
    tensor([2])
    """
    options.one_of("mode", mode, options.VERIFY_MODES)
    verifier = VERIFIERS[mode]
    if draft is None and not verifier.one_hot:
        raise verifier.refuse_one_hot()
    fn = verifier.kernel(backend, target_logits.device)
    return fn(draft_tokens, draft, target_logits, uniforms, temperature, alpha, beta)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verification:
    """Temperature 0, in every mode: accept while the draft token is the target's argmax (kernels/reference.py), that
    of greedy sampling (sampling.greedy_tokens)."""
    return reference.verify_greedy(draft_tokens, greedy_tokens(target_logits))
