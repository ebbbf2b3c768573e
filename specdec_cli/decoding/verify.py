"""The verification contract: one entry point, several implementations.

Every implementation takes the same inputs and returns the same outputs, so they can be held against
each other and against `reference` (kernels/reference.py), which is the specification.

Inputs
    draft_tokens  int64 [B, γ]        tokens the draft proposed
    draft_probs   float [B, γ, V]     the distribution each draft token was drawn from (after
                  or None             temperature / top-k / top-p); None: a deterministic draft (prompt
                                      lookup), q one-hot at the draft tokens: accept x iff u <= p(x), after
                                      a rejection draw from p without x. No [B, γ, V] tensor is built
                                      (baseline builds it, as a library without this path would)
    target_logits float [B, γ+1, V]   target logits at the γ draft positions plus the bonus position
                                      (fp32, bf16 or fp16); −inf marks a masked token
    uniforms      float [B, γ+1]      randomness in (0, 1]: column c < γ decides draft token c,
                                      column γ draws the resampled (or bonus) token by inverse CDF
    draft_logits  float [B, γ, V]     sigmoid only: the raw draft logits (sigmoid refuses a deterministic
                                      draft: σ of draft logits that do not exist has no meaning)
Outputs
    out_tokens    int64 [B, γ+1]      accepted draft tokens, then the resampled or bonus token, then −1
    num_accepted  int64 [B]           how many draft tokens were accepted (0..γ)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_cli import kernels, options
from specdec_cli.errors import NonFiniteLogitsError, SpecdecError
from specdec_cli.kernels import baseline, exact, reference, sigmoid


@dataclass
class Verified:
    out_tokens: torch.Tensor  # int64 [B, γ+1], −1 after the emitted tokens
    num_accepted: torch.Tensor  # int64 [B]
    backend: str  # "torch" | "triton" | "triton-interpreter"
    error: torch.Tensor | None = None  # int32 [B] error flags not read yet (Triton, check=False): see accepted()

    def accepted(self) -> list[int]:
        """num_accepted on the host, and the error flags with them in the same copy: the step's one host
        synchronisation. NonFiniteLogitsError when a flag is set."""
        if self.error is None:
            return self.num_accepted.tolist()
        B = self.num_accepted.shape[0]
        both = torch.cat([self.num_accepted, self.error.to(self.num_accepted.dtype)]).tolist()
        if any(both[B:]):
            exact.raise_for(torch.tensor(both[B:]))
        return both[:B]


def _use_triton(backend: str, device: torch.device) -> bool:
    options.one_of("--backend", backend, options.BACKENDS)
    if backend == "auto":
        return device.type == "cuda"
    return backend == "triton"


def verify(
    mode: str,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    draft_logits: torch.Tensor | None = None,
    temperature: float = 1.0,
    alpha: float = -1e4,
    beta: float = 1e4,
    backend: str = "auto",
    check: bool = True,
) -> Verified:
    """Verify one step of γ draft tokens for B sequences (shapes: the module docstring).

    backend: "auto" (Triton on CUDA, torch on CPU), "torch", or "triton" (compiled on CUDA, the Triton
    interpreter on CPU: slow, for checking the kernel code itself). reference and baseline are torch only.
    check: raise NonFiniteLogitsError now (the Triton path then reads its flags back: a host synchronisation);
    with check=False the Triton path leaves them in Verified.error for Verified.accepted() to read.

    >>> B, g, V = 1, 2, 4
    >>> toks = torch.tensor([[1, 2]]); q = torch.full((B, g, V), 0.25); z = torch.zeros(B, g + 1, V)
    >>> verify("exact", toks, q, z, torch.ones(B, g + 1)).num_accepted   # p == q: always accepted
    tensor([2])
    """
    options.one_of("mode", mode, options.VERIFY_MODES)
    if mode == "reference":
        return Verified(*reference.verify_reference(draft_tokens, draft_probs, target_logits, uniforms, temperature), "torch")
    if mode == "baseline":
        out = baseline.verify_baseline(draft_tokens, draft_probs, target_logits, uniforms, temperature, draft_logits)
        return Verified(*out, "torch")
    triton = _use_triton(backend, target_logits.device)
    name = kernels.triton_backend_name() if triton else "torch"
    if mode == "exact" and not triton:
        return Verified(*exact.verify_exact_torch(draft_tokens, draft_probs, target_logits, uniforms, temperature), name)
    if mode == "sigmoid" and draft_logits is None:
        raise SpecdecError(options.SIGMOID_NEEDS_LOGITS)
    if mode == "sigmoid" and not triton:
        out = sigmoid.verify_sigmoid_torch(draft_tokens, draft_logits, target_logits, uniforms, temperature, alpha, beta)
        return Verified(*out, name)
    if mode == "exact":
        out = exact.verify_exact_triton(draft_tokens, draft_probs, target_logits, uniforms, temperature, check=False)
    else:
        out = sigmoid.verify_sigmoid_triton(draft_tokens, draft_logits, target_logits, uniforms, temperature, alpha, beta,
                                            check=False)
    verified = Verified(out[0], out[1], name, error=out[2])
    if check:
        exact.raise_for(verified.error)
        verified.error = None
    return verified


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verified:
    """Temperature 0: accept while the draft token is the target's argmax (kernels/reference.py)."""
    top = target_logits.amax(dim=-1)  # [B, γ+1]; NaN or +inf anywhere in a row shows up here
    if not torch.isfinite(top).all():
        raise NonFiniteLogitsError("target logits contain NaN or +inf, or a row is all -inf")
    return Verified(*reference.verify_greedy(draft_tokens, target_logits), "torch")
