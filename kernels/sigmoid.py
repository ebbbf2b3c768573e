"""Sigmoid-approximated verification (the paper, section 3.2.2, eq. 5). Lossy by design.

    p̂(x) = σ((z_p(x)/T − α) / (β − α)),   q̂(x) = σ((z_q(x)/T − α) / (β − α))      elementwise, no softmax

and then the rule of kernels/reference.py with p̂, q̂ in place of p, q: accept iff u·q̂(x) <= p̂(x); at the
first rejection draw from max(0, p̂ − q̂) (or p̂ when that is all zero), else the bonus token from p̂.
p̂ and q̂ do not sum to one, so the output is NOT the target's distribution: with α = −10⁴, β = 10⁴
every p̂ is close to σ(0.5) ≈ 0.62, almost every draft token is accepted, and a resampled token is
nearly uniform over the vocabulary. `specdec verify-kernel --mode sigmoid` measures how far it moves.

Nothing needs a pass over every row: acceptance reads gathered scalars, the draw one row per sequence.
The Triton kernel is stage 2 of kernels/exact.py (with its draw) with SIGMOID=True; below is its torch twin.
"""

import math

import torch

from specdec_cli.errors import NonFiniteLogitsError

from .contract import Verification, check_draft_tokens, triton_backend_name
from .draw import assemble, draw_from_weights, first_rejection
from .exact import run_kernels


def sigmoid_probs(logits, temperature: float, alpha: float, beta: float):
    """p̂ = σ((z·(1/T) − α)/(β − α)), elementwise, in fp32 (the kernel's own order of operations)."""
    x = logits.float()
    x = (x * (1.0 / temperature) if temperature != 1.0 else x) - alpha  # a new tensor: the input is kept
    return x.div_(beta - alpha).sigmoid_()


def _check(logits):
    """Raise on NaN or +inf; a max over the values shows both (max propagates NaN)."""
    top = float(logits.amax()) if logits.numel() else 0.0
    if math.isnan(top) or top == math.inf:
        raise NonFiniteLogitsError("logits contain NaN or +inf")


def verify_sigmoid_torch(draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None, target_logits: torch.Tensor,
                         uniforms: torch.Tensor, temperature: float = 1.0, alpha: float = -1e4,
                         beta: float = 1e4) -> Verification:
    """The CPU path. draft_logits: the draft's raw logits (a deterministic draft has none: refused)."""
    if draft_logits is None:
        raise ValueError("sigmoid verification needs the draft's logits")
    B, gamma = draft_tokens.shape
    check_draft_tokens(draft_tokens, target_logits.shape[-1])
    zp_x = target_logits[:, :gamma].gather(-1, draft_tokens[..., None])[..., 0]  # [B, γ]
    zq_x = draft_logits.gather(-1, draft_tokens[..., None])[..., 0]  # [B, γ]
    _check(zp_x)
    _check(zq_x)
    p_x = sigmoid_probs(zp_x, temperature, alpha, beta)  # [B, γ]
    q_x = sigmoid_probs(zq_x, temperature, alpha, beta)  # [B, γ]
    n = first_rejection((q_x > 0) & (uniforms[:, :gamma] * q_x <= p_x))  # [B]

    # the one row each sequence draws from: max(0, p̂ − q̂) after a rejection, p̂ for the bonus token
    weights = torch.empty(B, target_logits.shape[-1], dtype=torch.float32, device=target_logits.device)  # [B, V]
    for b, c in enumerate(n.tolist()):
        _check(target_logits[b, c])
        p = sigmoid_probs(target_logits[b, c], temperature, alpha, beta)  # [V]
        if c == gamma:
            weights[b] = p
            continue
        _check(draft_logits[b, c])
        q = sigmoid_probs(draft_logits[b, c], temperature, alpha, beta)  # [V]
        if float(torch.sub(p, q, out=weights[b]).clamp_(min=0.0).sum()) == 0:
            weights[b] = p  # p̂ == q̂: draw from p̂
    return Verification(assemble(draft_tokens, n, draw_from_weights(weights, uniforms[:, gamma])), n)


def verify_sigmoid_triton(draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None, target_logits: torch.Tensor,
                          uniforms: torch.Tensor, temperature: float = 1.0, alpha: float = -1e4,
                          beta: float = 1e4) -> Verification:
    """The Triton kernel (stage 2 of kernels/exact.py with SIGMOID); error flags unread, as exact's."""
    if draft_logits is None:
        raise ValueError("sigmoid verification needs the draft's logits")
    out, counts = run_kernels(draft_tokens, draft_logits, target_logits, uniforms, temperature, True, alpha, beta)
    return Verification(out, counts[0], counts, triton_backend_name())
