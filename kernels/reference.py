"""The specification of verification, written as plain loops. Slow on purpose: read it, test against it.

The rule (Leviathan et al. 2023, Chen et al. 2023), for each sequence b and draft position c = 0..γ-1:

    p = softmax(target_logits[b, c] / T)        the target's distribution at that position
    q = draft_probs[b, c]                       the distribution the draft token x was drawn from
                                                (draft_probs None: a deterministic draft, q = one-hot at x)
    accept x  iff  q(x) > 0  and  u[b, c] · q(x) <= p(x)       (u in (0, 1]: P(accept) = min(1, p/q))

At the first rejection, emit one token drawn from the residual  a(x) = max(0, p(x) − q(x)) / Σ a,
falling back to p when the residual is all zero (p == q). For a one-hot q the test is u <= p(x) and the
residual is p with x removed. If all γ are accepted, emit a bonus token
drawn from p at position γ. Either draw is by inverse CDF with u[b, γ]: the first token whose running
sum of the (unnormalised) weights reaches u · Σ weights, skipping zero weights.

The emitted sequence is then distributed exactly as the target's (the proof: Chen et al., appendix).

The sigmoid approximation (kernels/sigmoid.py, the paper's eq. 5) is the same loops with p̂, q̂ in place of p, q:

    p̂(x) = σ((z_target(x)/T − α) / (β − α)),   q̂(x) = σ((z_draft(x)/T − α) / (β − α))      (no softmax)

verify_sigmoid_reference is that oracle: written from the formula, independent of sigmoid.py's torch twin and of
the Triton kernel, which are held against it decision for decision (tests/test_sigmoid.py).
"""

import math

import torch

from specdec_cli.errors import NonFiniteLogitsError

from .contract import PAD, Verification, check_draft_tokens


def softmax_row(logits: list[float], temperature: float) -> list[float]:
    """p(x) = exp(z(x)/T − logsumexp(z/T)); −inf logits (masked tokens) get probability 0."""
    inv_t = 1.0 / temperature
    scaled = [z * inv_t for z in logits]
    if any(math.isnan(z) or z == math.inf for z in scaled):
        raise NonFiniteLogitsError("target logits contain NaN or +inf")
    top = max(scaled)
    if top == -math.inf:
        raise NonFiniteLogitsError("target logits are all -inf: every token is masked")
    total = sum(math.exp(z - top) for z in scaled)
    return [math.exp(z - top) / total for z in scaled]


def draw_inverse_cdf(weights: list[float], u: float) -> int:
    """The first x with weights[x] > 0 whose running sum reaches u · Σ weights (u in (0, 1])."""
    threshold = u * sum(weights)
    running = 0.0
    last_positive = -1
    for x, w in enumerate(weights):
        if w > 0.0:
            running += w
            last_positive = x
            if running >= threshold:
                return x
    return last_positive  # rounding left the threshold a hair above the total


def sigmoid_row(logits: list[float], temperature: float, alpha: float, beta: float) -> list[float]:
    """p̂(x) = σ((z(x)/T − α)/(β − α)) of every token, not normalised; −inf logits (masked tokens) get 0."""
    inv_t = 1.0 / temperature
    if any(math.isnan(z) or z == math.inf for z in logits):
        raise NonFiniteLogitsError("logits contain NaN or +inf")
    out = []
    for z in logits:
        t = (z * inv_t - alpha) / (beta - alpha)
        out.append(1.0 / (1.0 + math.exp(-t)) if t >= 0 else math.exp(t) / (1.0 + math.exp(t)))  # no overflow
    return out


def _rule(draft_tokens: torch.Tensor, uniforms: torch.Tensor, vocab: int, p_row, q_row) -> Verification:
    """The loops of the rule (the module docstring), over the rows p_row(b, c) (target) and q_row(b, c, x)
    (draft; x the draft token) as lists of floats of the vocabulary's size."""
    B, gamma = draft_tokens.shape
    check_draft_tokens(draft_tokens, vocab)
    out_tokens = torch.full((B, gamma + 1), PAD, dtype=torch.int64)
    num_accepted = torch.zeros(B, dtype=torch.int64)
    for b in range(B):
        u = uniforms[b].tolist()
        emitted = []
        for c in range(gamma + 1):
            p = p_row(b, c)
            if c == gamma:  # every draft token accepted: bonus token from p
                emitted.append(draw_inverse_cdf(p, u[gamma]))
                break
            x = int(draft_tokens[b, c])
            q = q_row(b, c, x)
            if q[x] > 0.0 and u[c] * q[x] <= p[x]:
                emitted.append(x)
                continue
            residual = [max(0.0, pi - qi) for pi, qi in zip(p, q)]
            emitted.append(draw_inverse_cdf(residual if sum(residual) > 0.0 else p, u[gamma]))
            break
        num_accepted[b] = len(emitted) - 1
        out_tokens[b, : len(emitted)] = torch.tensor(emitted)
    return Verification(out_tokens, num_accepted)


def verify_reference(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                     uniforms: torch.Tensor, temperature: float = 1.0, alpha: float = -1e4,
                     beta: float = 1e4) -> Verification:
    """Shapes as in specdec_cli/decoding/verify.py; draft_probs None: one-hot at the draft tokens.
    Returns out_tokens [B, γ+1] and num_accepted [B] (α, β: sigmoid's, not read here)."""
    V = target_logits.shape[-1]

    def p_row(b, c):
        return softmax_row(target_logits[b, c].float().tolist(), temperature)

    def q_row(b, c, x):
        return draft_probs[b, c].float().tolist() if draft_probs is not None else [float(i == x) for i in range(V)]

    return _rule(draft_tokens, uniforms, target_logits.shape[-1], p_row, q_row)


def verify_sigmoid_reference(draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None,
                             target_logits: torch.Tensor, uniforms: torch.Tensor, temperature: float = 1.0,
                             alpha: float = -1e4, beta: float = 1e4) -> Verification:
    """The sigmoid approximation's oracle: the rule's loops with p̂ = sigmoid_row(target logits) and
    q̂ = sigmoid_row(draft logits) in place of p and q. draft_logits [B, γ, V]: the draft's raw logits."""
    if draft_logits is None:
        raise ValueError("sigmoid verification needs the draft's logits")

    def p_row(b, c):
        return sigmoid_row(target_logits[b, c].float().tolist(), temperature, alpha, beta)

    def q_row(b, c, x):
        return sigmoid_row(draft_logits[b, c].float().tolist(), temperature, alpha, beta)

    return _rule(draft_tokens, uniforms, target_logits.shape[-1], p_row, q_row)


def verify_greedy(draft_tokens: torch.Tensor, best: torch.Tensor) -> Verification:
    """Temperature 0, the limit of the rule: accept while the draft token is the target's argmax,
    then emit the target's argmax. best: int64 [B, γ+1], the target's argmax at each slot (ties: the lowest
    token id, as torch.argmax)."""
    gamma = draft_tokens.shape[1]
    matches = (draft_tokens == best[:, :gamma]).to(torch.int64)  # [B, γ]
    num_accepted = matches.cumprod(dim=1).sum(dim=1)  # [B] length of the agreeing prefix
    positions = torch.arange(gamma + 1, device=draft_tokens.device)  # [γ+1]
    out_tokens = torch.where(positions[None, :] <= num_accepted[:, None], best, PAD)
    return Verification(out_tokens, num_accepted)
