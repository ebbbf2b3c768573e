"""Verification the way Hugging Face transformers does it (`_speculative_sampling`), the paper's
baseline: softmax over the whole vocabulary (the target's logits here; the draft's are probabilities
already, softmaxed where it drew), ratios of gathered probabilities, the normalised residual of the
rejected row, and `torch.multinomial` for the draw.

Two differences from transformers, both needed to hold it against the other implementations: the
acceptance uniforms are inputs (u[:, :γ]) instead of `torch.rand`, and the multinomial draw uses a
generator seeded from u[:, γ], so the result is a deterministic function of the inputs (the same
accept/reject decisions as the reference; the drawn token from the same distribution, but not the same
draw). A zero draft probability is never accepted (transformers would accept it: p/0 = inf). Batched.
A deterministic draft (draft_probs None) becomes the one-hot [B, γ, V] tensor a library without a one-hot
path would build.
"""

import torch

from specdec_cli.errors import NonFiniteLogitsError

from .contract import PAD, Verification, check_draft_tokens


def verify_baseline(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                    uniforms: torch.Tensor, temperature: float = 1.0, alpha: float = -1e4,
                    beta: float = 1e4) -> Verification:
    """draft_probs: the draft's distributions (transformers softmaxes the draft's logits first: bench's
    synthetic baseline does that in its timed step), None for a deterministic draft."""
    B, gamma = draft_tokens.shape
    check_draft_tokens(draft_tokens, target_logits.shape[-1])
    rows = torch.arange(B, device=draft_tokens.device)[:, None]  # [B, 1]
    cols = torch.arange(gamma, device=draft_tokens.device)[None, :]  # [1, γ]
    # the full softmax of the target, as transformers does
    V = target_logits.shape[-1]
    q = torch.nn.functional.one_hot(draft_tokens, V).float() if draft_probs is None else draft_probs.float()  # [B, γ, V]
    p = (target_logits.float() / temperature).softmax(dim=-1)  # [B, γ+1, V]
    p_i = p[rows, cols, draft_tokens]  # [B, γ]
    q_i = q[rows, cols, draft_tokens]  # [B, γ]
    is_accepted = (uniforms[:, :gamma] * q_i <= p_i) & (q_i > 0)  # u ≤ p/q, written without dividing
    n_matches = ((~is_accepted).cumsum(dim=-1) < 1).sum(dim=-1)  # [B]
    read = torch.arange(gamma + 1, device=p.device)[None, :] <= n_matches[:, None]  # [B, γ+1]: rows 0..n decide
    if (torch.isnan(p).any(dim=-1) & read).any():  # NaN, +inf or an all −inf row among them
        raise NonFiniteLogitsError("target logits contain NaN or +inf, or a row is all -inf")

    p_next = p[rows[:, 0], n_matches]  # [B, V]
    q_next = torch.cat([q, q.new_zeros(B, 1, V)], dim=1)[rows[:, 0], n_matches]  # [B, V]; 0 at the bonus row
    p_prime = torch.clamp(p_next - q_next, min=0)  # [B, V]
    p_prime_sum = p_prime.sum(dim=-1, keepdim=True)
    p_prime = torch.where(p_prime_sum > 0, p_prime / p_prime_sum, p_next)  # p == q: fall back to p

    generator = torch.Generator(device=p.device)
    generator.manual_seed(int(uniforms[:, gamma].double().mean().item() * 2**52))  # mean: no overflow at any B
    t = torch.multinomial(p_prime, num_samples=1, generator=generator)[:, 0]  # [B]

    out_tokens = torch.full((B, gamma + 1), PAD, dtype=torch.int64, device=draft_tokens.device)
    out_tokens[:, :gamma] = torch.where(cols < n_matches[:, None], draft_tokens, PAD)
    out_tokens[rows[:, 0], n_matches] = t
    return Verification(out_tokens, n_matches)
