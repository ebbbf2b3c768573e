"""Exact verification: a fused Triton kernel and the same math in torch (the CPU path).

The rule is kernels/reference.py's. What this adds is how little it reads:
  - acceptance needs two gathered scalars per draft position, p(x_c) and q(x_c), and p(x_c) needs only
    the row's log-sum-exp:  p(x) = exp(z(x)/T − lse),  lse = logsumexp(z/T)  (softmax fused, online);
  - only one row per sequence is resampled (the first rejection, or the bonus row), so only that row
    is read a second time, together with its draft row;
  - that row's draw is an inverse CDF over unnormalised weights (a = max(0, p − q), or p): one
    reduction gives Σ a, a second pass over one split of the row finds the token. Sums in fp64.
Memory traffic for B sequences: read B·(γ+1)·V target logits once, plus one target row and one draft row
per sequence; write B·(γ+1) tokens. No host synchronisation between the two launches.

What one step must read, at γ = 5, V = 151 936, bf16 logits and fp32 draft probabilities (2·B·6·V bytes of
logits, then 2·B·V of the drawn rows and 4·B·V of their draft rows), and the floor that sets at 3 TB/s:
    B = 1:    2.7 MB  ->  0.9 µs        (a few launches of a few µs each cost more: latency-bound)
    B = 8:   21.9 MB  ->  7.3 µs
    B = 64: 175.0 MB  -> 58.3 µs        (bandwidth-bound: the figure to compare a GPU run with)
Measured on an H100 (benchmarks/gpu-h100, CUDA-graph replays): B = 1 21.1 µs, B = 8 31.0 µs, B = 64 106.4 µs, i.e.
0.55 of the measured 3 010 GB/s copy bandwidth; FlashInfer's chain sampling with its softmax 85.7 / 165.5 / 618.9.
Eager, a step is host-bound (its device time is 21 µs at B = 1). Three launches and ten allocations cost 154 µs of
host time a call; two launches through Triton's dispatch and five 114 µs; now a shape's workspace and its two
compiled launches are kept (_Step, kernels/triton_launch.py): 36 µs against 118 in the same run, and the loop's
step with its read of the counts 89 µs at B = 1 against baseline's 997 and FlashInfer's 208 (no read) in that run
(benchmarks/gpu-h100, run E).

Triton grid (the paper's grid over (batch, draft position) with the vocabulary tiled in blocks of n,
plus a split of each row over several programs so that B = 1 still fills the GPU):
  1. _row_stats_kernel      (B·(γ+1), SPLITS): running max and Σ exp over one split of one row
  2. _accept_draw_kernel    (B, SPLITS):       lse per row, accept/reject from gathered scalars, first
                                               rejection n, Σ of the draw's weights over one split of row n;
                                               then the split of b that finishes last (an atomic count) draws:
                                               it finds the split, then the token, where the running sum of
                                               the weights reaches u·Σ, and writes tokens, counts and errors
The sigmoid approximation (kernels/sigmoid.py) reuses stage 2 with SIGMOID=True: its p̂, q̂ are elementwise, so
stage 1 is not needed at all.
"""

import functools
import math
import threading

import torch
import triton
import triton.language as tl

from specdec_cli.errors import NonFiniteLogitsError

from . import triton_launch
from .contract import PAD, Verification, check_draft_tokens, triton_backend_name
from .draw import assemble, draw_from_weights

# ----------------------------------------------------------------------------------------------------
# torch path (the CPU backend): same decisions as the reference


def row_lse(row, inv_t: float) -> float:
    """row [V] -> log Σ exp(z/T), a Python float. The row's max comes first, so NaN, +inf or a fully
    masked row is reported before anything is summed. Four passes over V: max, subtract, exp, sum."""
    top = float(row.amax())
    if math.isnan(top) or top == math.inf:
        raise NonFiniteLogitsError("target logits contain NaN or +inf")
    if top == -math.inf:
        raise NonFiniteLogitsError("target logits are all -inf in a row: every token is masked")
    x = row.float() - top  # [V] fp32, <= 0
    if inv_t != 1.0:
        x.mul_(inv_t)
    return top * inv_t + math.log(float(x.exp_().sum()))


def verify_exact_torch(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                       uniforms: torch.Tensor, temperature: float = 1.0, alpha: float = -1e4,
                       beta: float = 1e4) -> Verification:
    """The CPU path: sequence by sequence, row by row, stopping at the first rejection. On a CPU a
    branch costs nothing and a row's log-sum-exp is nearly all of the work, so no row after a
    sequence's first rejection is read, and the rule's scalars are Python floats (as in the
    reference). A NaN in a row that is never read cannot change the output and is not reported.
    draft_probs None: a deterministic draft, q one-hot at the draft token (q(x) = 1; residual = p without x)."""
    B, gamma = draft_tokens.shape
    check_draft_tokens(draft_tokens, target_logits.shape[-1])
    V = target_logits.shape[-1]
    inv_t = 1.0 / temperature
    x = draft_tokens[..., None]  # [B, γ, 1]
    z_x = target_logits[:, :gamma].gather(-1, x)[..., 0].double().mul(inv_t).tolist()  # [B][γ] z(x)/T
    q_x = [[1.0] * gamma] * B if draft_probs is None else draft_probs.gather(-1, x)[..., 0].double().tolist()  # [B][γ] q(x)
    u = uniforms.double().tolist()  # [B][γ+1]
    n = []  # [B] first rejection, γ if none
    weights = torch.empty(B, V, dtype=torch.float32, device=target_logits.device)  # the draw's, row n
    for b in range(B):
        for c in range(gamma + 1):
            lse = row_lse(target_logits[b, c], inv_t)
            # accept x iff q(x) > 0 and u·q(x) <= p(x) = exp(z(x)/T − lse)
            if c == gamma or not (q_x[b][c] > 0 and u[b][c] * q_x[b][c] <= math.exp(z_x[b][c] - lse)):
                break
        n.append(c)
        # row c's weights: the residual max(0, p − q) after a rejection, p itself for the bonus token
        p = target_logits[b, c].float()
        p = (p * inv_t if inv_t != 1.0 else p).sub(lse).exp_()  # [V]
        if c == gamma:
            weights[b] = p  # the bonus row
        elif draft_probs is None:  # one-hot: max(0, p − onehot(x)) = p with x removed
            weights[b] = p
            weights[b, int(draft_tokens[b, c])] = 0.0
        else:
            torch.sub(p, draft_probs[b, c], out=weights[b]).clamp_(min=0.0)
        if c < gamma and float(weights[b].sum()) == 0:
            weights[b] = p  # p == q (all-zero residual): draw from p
    num = torch.tensor(n, dtype=torch.int64, device=draft_tokens.device)
    return Verification(assemble(draft_tokens, num, draw_from_weights(weights, uniforms[:, gamma])), num)


# ----------------------------------------------------------------------------------------------------
# Triton kernels


@triton.jit(do_not_specialize=["gamma"])  # γ changes every round with adaptive schedules: no recompilation
def _row_stats_kernel(
    # pointers
    logits_ptr,  # [B, γ+1, V] target logits, any strides but a contiguous last dim
    max_ptr,  # [B·(γ+1), SPLITS] fp32 out: running max of z/T over the split
    sum_ptr,  # [B·(γ+1), SPLITS] fp32 out: Σ exp(z/T − max) over the split
    bad_ptr,  # [B·(γ+1), SPLITS] int32 out: count of NaN / +inf in the split
    # sizes and strides
    gamma,
    V,
    chunk,  # elements per split, a multiple of BLOCK
    SPLITS,
    stride_zb,
    stride_zc,
    inv_t,
    # meta-parameters
    BLOCK: tl.constexpr,
):
    # online softmax statistics: m' = max(m, max(x)), s' = s·e^(m − m') + Σ e^(x − m')
    row = tl.program_id(0).to(tl.int64)  # r = b·(γ+1) + c; 64-bit offsets: B·(γ+1)·V can pass 2^31
    split = tl.program_id(1)
    z_row = logits_ptr + (row // (gamma + 1)) * stride_zb + (row % (gamma + 1)) * stride_zc
    start = split * chunk
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    bad = tl.zeros((), tl.int32)
    for off in range(0, chunk, BLOCK):
        cols = start + off + tl.arange(0, BLOCK)
        mask = (cols < V) & (off + tl.arange(0, BLOCK) < chunk)
        x = tl.load(z_row + cols, mask=mask, other=float("-inf")).to(tl.float32) * inv_t
        bad += tl.sum(((x != x) | (x == float("inf"))).to(tl.int32))
        x = tl.where(x == x, x, float("-inf"))  # NaN is counted above, kept out of the sums
        m_new = tl.maximum(m, tl.max(x))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all masked so far: nothing to rescale
        s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe))
        m = m_new
    tl.store(max_ptr + row * SPLITS + split, m)
    tl.store(sum_ptr + row * SPLITS + split, s)
    tl.store(bad_ptr + row * SPLITS + split, bad)


@triton.jit
def _weight(z, q, lse, inv_t, alpha, beta, use_residual, SIGMOID: tl.constexpr):
    """The draw's weight of each token: p, or the residual max(0, p − q).
    exact:   p = exp(z/T − lse), q = the draft's probability;
    sigmoid: p̂ = σ((z/T − α)/(β − α)), q̂ the same of the draft logits (q holds them)."""
    if SIGMOID:
        p = tl.sigmoid((z * inv_t - alpha) / (beta - alpha))
        q = tl.sigmoid((q * inv_t - alpha) / (beta - alpha))
    else:
        p = tl.exp(z * inv_t - lse)
    return tl.where(use_residual, tl.maximum(p - q, 0.0), p), p


@triton.jit
def _tile(row_z, row_q, x_n, cols, mask, has_draft, V, SIGMOID: tl.constexpr, ONE_HOT: tl.constexpr):
    """One BLOCK of the drawn row: target logits z [BLOCK], and the draft's q [BLOCK] when the row has
    a draft row (n < γ); at the bonus row q = 0 (sigmoid: raw logit −inf, so q̂ = 0). ONE_HOT: q is 1 at
    the row's draft token x_n and 0 elsewhere, read from nowhere."""
    z = tl.load(row_z + cols, mask=mask, other=float("-inf")).to(tl.float32)
    if ONE_HOT:
        q = ((cols == x_n) & has_draft).to(tl.float32)
    else:
        q = tl.load(row_q + cols, mask=mask & (cols < tl.where(has_draft, V, 0)), other=0.0).to(tl.float32)
    if SIGMOID:
        q = tl.where(has_draft, q, float("-inf"))
    return z, q


@triton.jit(do_not_specialize=["gamma"])
def _accept_draw_kernel(
    # pointers
    tokens_ptr,  # [B, γ] int64 draft tokens
    draft_ptr,  # [B, γ, V] draft probabilities (SIGMOID: raw draft logits), contiguous last dim; ONE_HOT: unread
    logits_ptr,  # [B, γ+1, V] target logits, contiguous last dim
    u_ptr,  # [B, γ+1] fp32 uniforms in (0, 1]
    max_ptr,  # [B·(γ+1), SPLITS] from stage 1 (unused when SIGMOID): a row whose max is −inf is all masked
    sum_ptr,  # [B·(γ+1), SPLITS]
    row_bad_ptr,  # [B·(γ+1), SPLITS] int32 from stage 1
    wsum_ptr,  # [B, SPLITS] fp64 scratch: Σ residual over the split of row n
    psum_ptr,  # [B, SPLITS] fp64 scratch: Σ p over the split of row n (the fallback when the residual is 0)
    draw_bad_ptr,  # [B, SPLITS] int32 scratch (SIGMOID only: NaN / +inf among what it read)
    count_ptr,  # [B] int32, 0 on entry: splits of b finished (the drawing split puts it back to 0)
    counts_ptr,  # [2, B] int64 out: the accepted count (the row drawn from), then 0 or ERR_NONFINITE |
    #              ERR_ALL_MASKED | ERR_BAD_TOKEN for what b's rows held
    out_ptr,  # [B, γ+1] int64 out: accepted draft tokens, the drawn token, then PAD
    # sizes and strides
    gamma,
    V,
    chunk,
    SPLITS,
    stride_tb,
    stride_tc,
    stride_qb,
    stride_qc,
    stride_zb,
    stride_zc,
    stride_ub,
    stride_uc,
    inv_t,
    alpha,
    beta,
    # meta-parameters
    GAMMA_P2: tl.constexpr,  # next power of 2 >= γ+1
    SPLITS_P2: tl.constexpr,
    BLOCK: tl.constexpr,
    SIGMOID: tl.constexpr,
    ONE_HOT: tl.constexpr,  # a deterministic draft: q one-hot at the draft tokens (exact only)
):
    """Stage 2 (grid (B, SPLITS)): each row's lse, accept/reject from gathered scalars, the first rejection n, and
    Σ of the draw's weights over one split of row n; the split that finishes last then draws (_draw). Long: its
    33 arguments take a line each, and the stage is one launch (the per-tile math is in _tile and _weight)."""
    b = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    c = tl.arange(0, GAMMA_P2)  # draft positions (γ is the bonus row)
    is_draft = c < gamma
    # lse of each row from the split statistics: lse = M + log Σ_s s_s·e^(m_s − M)
    if SIGMOID:
        lse = tl.zeros((GAMMA_P2,), tl.float32)
    else:
        k = tl.arange(0, SPLITS_P2)
        stat = (b * (gamma + 1) + c)[:, None] * SPLITS + k[None, :]  # [GAMMA_P2, SPLITS_P2]
        stat_mask = (c <= gamma)[:, None] & (k < SPLITS)[None, :]
        m = tl.load(max_ptr + stat, mask=stat_mask, other=float("-inf"))
        s = tl.load(sum_ptr + stat, mask=stat_mask, other=0.0)
        row_max = tl.max(m, axis=1)  # [GAMMA_P2]
        row_max_safe = tl.where(row_max == float("-inf"), 0.0, row_max)
        total = tl.sum(s * tl.exp(m - row_max_safe[:, None]), axis=1)
        lse = row_max_safe + tl.log(tl.where(c <= gamma, total, 1.0))  # padded rows: 0, unused

    # acceptance from gathered scalars: accept x_c iff q(x_c) > 0 and u_c·q(x_c) <= p(x_c)
    x = tl.load(tokens_ptr + b * stride_tb + c * stride_tc, mask=is_draft, other=0)  # [GAMMA_P2]
    x_ok = (x >= 0) & (x < V)  # an id outside the vocabulary is never read, never accepted, and flagged (_draw)
    z_x = tl.load(logits_ptr + b * stride_zb + c * stride_zc + x, mask=is_draft & x_ok, other=0.0).to(tl.float32)
    if ONE_HOT:
        q_x = tl.where(x_ok, 1.0, 0.0)
    else:
        q_x = tl.load(draft_ptr + b * stride_qb + c * stride_qc + x, mask=is_draft & x_ok,
                      other=0.0).to(tl.float32)
        q_x = tl.where(is_draft, q_x, 1.0)
    u = tl.load(u_ptr + b * stride_ub + c * stride_uc, mask=is_draft, other=1.0)
    if SIGMOID:
        p_x = tl.sigmoid((z_x * inv_t - alpha) / (beta - alpha))
        q_x = tl.sigmoid((q_x * inv_t - alpha) / (beta - alpha))
    else:
        p_x = tl.exp(z_x * inv_t - lse)
    accepted = (q_x > 0.0) & (u * q_x <= p_x)
    n = tl.min(tl.where(is_draft & ~accepted, c, gamma))  # first rejection; γ when all were accepted
    lse_n = tl.sum(tl.where(c == n, lse, 0.0))

    # Σ of the draw's weights over this split of row n
    use_residual = n < gamma  # the bonus row has no draft row to read
    row_z = logits_ptr + b * stride_zb + n * stride_zc
    row_q = draft_ptr + b * stride_qb + tl.minimum(n, gamma - 1) * stride_qc
    x_n = tl.sum(tl.where(c == n, x, 0))  # the rejected draft token (ONE_HOT's q)
    w_acc = tl.zeros((BLOCK,), tl.float64)
    p_acc = tl.zeros((BLOCK,), tl.float64)
    bad = tl.zeros((), tl.int32)
    if SIGMOID:
        bad += tl.sum(((z_x != z_x) | (z_x == float("inf"))).to(tl.int32))
    for off in range(0, chunk, BLOCK):
        cols = split * chunk + off + tl.arange(0, BLOCK)
        mask = (cols < V) & (off + tl.arange(0, BLOCK) < chunk)
        z, q = _tile(row_z, row_q, x_n, cols, mask, use_residual, V, SIGMOID, ONE_HOT)
        if SIGMOID:
            bad += tl.sum((mask & ((z != z) | (z == float("inf")))).to(tl.int32))
        w, p = _weight(z, q, lse_n, inv_t, alpha, beta, use_residual, SIGMOID)
        w_acc += tl.where(mask, w, 0.0).to(tl.float64)
        p_acc += tl.where(mask, p, 0.0).to(tl.float64)
    tl.store(wsum_ptr + b * SPLITS + split, tl.sum(w_acc))
    tl.store(psum_ptr + b * SPLITS + split, tl.sum(p_acc))
    tl.store(draw_bad_ptr + b * SPLITS + split, bad)

    # the split of b that finishes last draws: every split's stores above come before its count (the barrier
    # orders this program's threads, the acq_rel atomic the programs), and the drawing split reads them after its own
    tl.debug_barrier()
    if tl.atomic_add(count_ptr + b, 1, sem="acq_rel") == SPLITS - 1:
        tl.store(count_ptr + b, 0)  # every split has counted: the next step on this workspace starts from 0
        _draw(b, n, lse_n, x, x_n, row_z, row_q, u_ptr, max_ptr, row_bad_ptr, wsum_ptr, psum_ptr,
              draw_bad_ptr, counts_ptr, out_ptr, gamma, V, chunk, SPLITS, stride_ub, stride_uc, inv_t, alpha, beta, GAMMA_P2, SPLITS_P2, BLOCK, SIGMOID, ONE_HOT)


@triton.jit
def _draw(b, n, lse_n, x, x_n, row_z, row_q, u_ptr, max_ptr, row_bad_ptr, wsum_ptr, psum_ptr, draw_bad_ptr,
          counts_ptr, out_ptr, gamma, V, chunk, SPLITS, stride_ub, stride_uc, inv_t, alpha,
          beta, GAMMA_P2: tl.constexpr, SPLITS_P2: tl.constexpr, BLOCK: tl.constexpr, SIGMOID: tl.constexpr,
          ONE_HOT: tl.constexpr):
    """Sequence b's drawn token, its out_tokens row, n and its error flags (counts [2, B]), from every split's sums
    (read through L2, ".cg": other programs wrote them). x [GAMMA_P2]: the draft tokens (0 past γ); x_n: the one rejected."""
    # inverse CDF in two levels: the split where Σ reaches u·total, then the token inside it
    k = tl.arange(0, SPLITS_P2)
    w_split = tl.load(wsum_ptr + b * SPLITS + k, mask=k < SPLITS, other=0.0, cache_modifier=".cg")  # fp64
    p_split = tl.load(psum_ptr + b * SPLITS + k, mask=k < SPLITS, other=0.0, cache_modifier=".cg")
    use_residual = (n < gamma) & (tl.sum(w_split) > 0)  # an all-zero residual (p == q) falls back to p
    w_split = tl.where(use_residual, w_split, p_split)
    threshold = tl.load(u_ptr + b * stride_ub + gamma * stride_uc).to(tl.float64) * tl.sum(w_split)
    running = tl.cumsum(w_split, axis=0)
    last_split = tl.max(tl.where(w_split > 0, k, 0))
    split = tl.min(tl.where((running >= threshold) & (w_split > 0), k, last_split))
    before = tl.sum(tl.where(k < split, w_split, 0.0))

    token = tl.full((), -1, tl.int64)
    last_positive = tl.full((), -1, tl.int64)
    for off in range(0, chunk, BLOCK):
        cols = split * chunk + off + tl.arange(0, BLOCK)
        mask = (cols < V) & (off + tl.arange(0, BLOCK) < chunk)
        z, q = _tile(row_z, row_q, x_n, cols, mask, n < gamma, V, SIGMOID, ONE_HOT)
        w, _ = _weight(z, q, lse_n, inv_t, alpha, beta, use_residual, SIGMOID)
        w = tl.where(mask, w, 0.0).to(tl.float64)
        reach = before + tl.cumsum(w, axis=0)
        hit = tl.min(tl.where((reach >= threshold) & (w > 0), cols, 2147483647)).to(tl.int64)
        token = tl.where((token < 0) & (hit < 2147483647), hit, token)
        last_positive = tl.maximum(last_positive, tl.max(tl.where(w > 0, cols, -1)).to(tl.int64))
        before += tl.sum(w)
    token = tl.where(token < 0, last_positive, token)  # rounding left the threshold above the total

    c = tl.arange(0, GAMMA_P2)
    x = tl.where(c < gamma, x, -1)
    out = tl.where(c < n, x, tl.where(c == n, token, OUT_PAD))
    tl.store(out_ptr + b * (gamma + 1) + c, out, mask=c <= gamma)
    tl.store(counts_ptr + b, n.to(tl.int64))

    # what the caller must hear about, read when it chooses (no host synchronisation here): any draft id outside
    # [0, V); NaN, +inf or an all −inf row among the rows the decision read (0..n), as the torch path reads them
    bad = tl.sum(tl.load(draw_bad_ptr + b * SPLITS + k, mask=k < SPLITS, other=0, cache_modifier=".cg"))
    error = tl.where(tl.sum(((c < gamma) & ((x < 0) | (x >= V))).to(tl.int32)) > 0, ERR_BAD_TOKEN, 0)
    if not SIGMOID:
        stat = (b * (gamma + 1) + c)[:, None] * SPLITS + k[None, :]  # [GAMMA_P2, SPLITS_P2]
        stat_mask = (c <= n)[:, None] & (k < SPLITS)[None, :]
        bad += tl.sum(tl.sum(tl.load(row_bad_ptr + stat, mask=stat_mask, other=0), axis=1))
        row_max = tl.max(tl.load(max_ptr + stat, mask=stat_mask, other=float("-inf")), axis=1)  # [GAMMA_P2]
        masked = tl.sum(((row_max == float("-inf")) & (c <= n)).to(tl.int32))
        error = tl.where(masked > 0, error | ERR_ALL_MASKED, error)
    error = tl.where(token < 0, error | ERR_ALL_MASKED, error)  # no weight above zero: nothing was drawn
    error = tl.where(bad > 0, error | ERR_NONFINITE, error)
    tl.store(counts_ptr + tl.num_programs(0) + b, error.to(tl.int64))  # row 1 of counts


OUT_PAD: tl.constexpr = tl.constexpr(PAD)  # out_tokens after the emitted ones
ERR_NONFINITE: tl.constexpr = tl.constexpr(1)  # error bits of _draw (contract.ERRORS says them)
ERR_ALL_MASKED: tl.constexpr = tl.constexpr(2)
ERR_BAD_TOKEN: tl.constexpr = tl.constexpr(4)


@functools.cache  # every step asks again
def _plan(V: int, batch: int, device: torch.device | None, interpreted: bool, sms: int | None = None):
    """BLOCK, SPLITS and the chunk of the vocabulary each split covers (a multiple of BLOCK). sms: the
    streaming multiprocessors to fill (default: the device's), so that a plan can be made for a GPU this
    machine does not have (compile.py).
    SPLITS is sized by the B rows that stage 2 and its draw read (one per sequence), never below MIN_SPLITS: a drawing
    program scans its chunk tile after dependent tile, so the chunk must stay short whatever B. (Sized by stage 1's
    B·(γ+1) rows, B = 64 at V = 151 936 got 2 splits: 64 programs of 75 dependent tiles; on an H100 the step took
    256 µs in a CUDA graph against a 39 µs floor.)"""
    block = 4096 if interpreted else 1024  # the interpreter pays per tile, a GPU per register
    tiles = triton.cdiv(V, block)
    if interpreted:
        splits = min(tiles, 4)
    else:  # enough programs to cover every SM about four times over, and short chunks
        sms = sms or torch.cuda.get_device_properties(device).multi_processor_count
        splits = max(1, min(tiles, max(triton.cdiv(4 * sms, batch), MIN_SPLITS), 64))
    chunk = triton.cdiv(tiles, splits) * block
    splits = triton.cdiv(V, chunk)
    return block, splits, chunk


MIN_SPLITS = 16
# Registers a stage-2 thread may use: all it needs (8 warps · 32 threads · 255 fit an SM's 65 536). Left to itself
# ptxas held the kernel (with its draw) to 80 and spilled 4–80 bytes on sm_80/sm_90; told 255 it takes 95–192
# (ptxas -v through kernels/compile.py, which tests/test_cli_verify_kernel.py reads: no spills).
MAX_REGISTERS = 255


def _warps(gamma_p2: int, splits_p2: int) -> int:
    """Warps of a stage-2 program: its [GAMMA_P2, SPLITS_P2] tiles of split statistics spread at most 4 elements a
    thread (8 spilled on sm_80 at 32 × 32 with 4 warps), up to 8 warps (16 would cap a thread at 128 registers)."""
    return max(4, min(8, gamma_p2 * splits_p2 // 128))


def _last_dim_contiguous(t):
    return t if t.stride(-1) == 1 else t.contiguous()


class _Step:
    """What the steps of one shape launch with, made once (launch keeps it by its key): the workspace of the split
    statistics and the two launches. The workspace is zeroed once; its count is back at 0 after every step (the
    drawing split resets it), and a stream runs its steps one after another, so every step one host thread puts on
    that stream reuses it (the key holds both: two threads could interleave one step's two launches with another's)."""

    def __init__(self, B: int, gamma: int, plan: tuple[int, int, int], sigmoid: bool, one_hot: bool, device, stream):
        block, S, _ = plan
        R = B * (gamma + 1)
        scratch = torch.empty(2 * B * S + R * S, dtype=torch.float64, device=device)  # carved into named views
        wsum, psum = scratch[:2 * B * S].view(2, B, S)  # Σ residual, Σ p over each split of row n (fp64)
        row_max, row_sum = scratch[2 * B * S:].view(torch.float32).view(2, R, S)  # stage 1's running max, Σ exp
        flags = torch.zeros(B + R * S + B * S, dtype=torch.int32, device=device)
        count = flags[:B]  # [B] splits of b done
        row_bad, draw_bad = flags[B:B + R * S].view(R, S), flags[B + R * S:].view(B, S)  # NaN / +inf seen
        self.stage1 = (row_max, row_sum, row_bad)
        self.stage2 = (row_max, row_sum, row_bad, wsum, psum, draw_bad, count)
        self.row_stats = None if sigmoid else triton_launch.Launch(_row_stats_kernel, (R, S), stream, BLOCK=block)
        gamma_p2, splits_p2 = triton.next_power_of_2(gamma + 1), triton.next_power_of_2(S)
        self.accept_draw = triton_launch.Launch(
            _accept_draw_kernel, (B, S), stream, GAMMA_P2=gamma_p2, SPLITS_P2=splits_p2, BLOCK=block, SIGMOID=sigmoid,
            ONE_HOT=one_hot, num_warps=_warps(gamma_p2, splits_p2), maxnreg=MAX_REGISTERS)


_STEPS: dict[tuple, _Step] = {}  # launch's key -> its _Step


def launch(draft_tokens, draft, target_logits, uniforms, temperature, *, sigmoid, alpha=0.0, beta=1.0, plan=None):
    """Shared launcher of the exact and sigmoid kernels. `draft` is draft_probs, or the draft logits when
    sigmoid, or None for a deterministic draft (exact only: q one-hot at the draft tokens). Every input is read
    through its strides (a vocabulary slice is not copied; a last dim that is not contiguous is). Returns
    (out_tokens [B, γ+1], counts [2, B] int64: num_accepted, then 0 or the bits of ERRORS, in one buffer that one copy
    reads), with no host synchronisation: a CUDA graph can hold it. plan: (BLOCK, SPLITS, chunk) as _plan gives them,
    in place of this device's; the tests run a GPU's plans under the interpreter with it (tests/test_plans.py).
    The custom op never passes one. A step costs the host two allocations and two launches that skip Triton's
    dispatch (kernels/triton_launch.py): everything Triton specializes on is in the key of the step's _Step."""
    # (1) check shapes
    B, gamma = draft_tokens.shape
    V = target_logits.shape[-1]
    one_hot = draft is None
    assert not (one_hot and sigmoid), "sigmoid needs the draft's logits"
    draft = draft_tokens[:, :, None] if one_hot else draft  # never read with ONE_HOT: a pointer of the right kind
    assert one_hot or draft.shape == (B, gamma, V), "shape mismatch"
    assert target_logits.shape == (B, gamma + 1, V) and uniforms.shape == (B, gamma + 1) and gamma >= 0
    draft, target_logits = _last_dim_contiguous(draft), _last_dim_contiguous(target_logits)
    uniforms = uniforms.float()
    device = target_logits.device
    interpreted = triton_backend_name() == "triton-interpreter"
    plan = plan or _plan(V, B, device, interpreted)
    block, S, chunk = plan
    assert chunk % block == 0 and triton.cdiv(V, chunk) == S, "a plan covers V in SPLITS chunks of whole BLOCKs"
    inputs = (draft_tokens, draft, target_logits, uniforms)
    strides = (*draft_tokens.stride(), *draft.stride()[:2], *target_logits.stride()[:2], *uniforms.stride())
    inv_t, alpha, beta = 1.0 / float(temperature), float(alpha), float(beta)  # floats: Triton types others otherwise
    # (2) the step's workspace and launches: kept by everything Triton specializes on, and the stream
    if not interpreted:  # Triton loads a kernel for the current device and launches on its stream
        assert device.index == torch.cuda.current_device(), f"the logits are on {device}: make it the current device"
    stream = None if interpreted else triton_launch.current_stream(device.index)
    capturing = stream is not None and torch.cuda.is_current_stream_capturing()
    key = None if capturing else (B, gamma, V, plan, sigmoid, one_hot, strides, device, stream, threading.get_ident(),
                                  *((t.dtype, t.data_ptr() % 16 == 0) for t in inputs))
    step = _STEPS.get(key) if key is not None else None
    if step is None:  # new, or a graph's own (never shared with eager steps)
        step = _Step(B, gamma, plan, sigmoid, one_hot, device, stream)
        if key is not None:
            if len(_STEPS) >= 64:
                _STEPS.clear()
            _STEPS[key] = step
    # fresh each step (the caller keeps them); the allocator's blocks are 512-byte aligned, as the launches assume
    counts = torch.empty((2, B), dtype=torch.int64, device=device)  # out: accepted counts, error bits
    out = torch.empty((B, gamma + 1), dtype=torch.int64, device=device)
    # (3) launch
    if step.row_stats is not None:
        step.row_stats(target_logits, *step.stage1, gamma, V, chunk, S, *strides[4:6], inv_t)
    step.accept_draw(*inputs, *step.stage2, counts, out, gamma, V, chunk, S, *strides, inv_t, alpha, beta)
    return out, counts


# The Triton verification as a torch custom op, so that torch.compile and CUDA graphs can hold it: the fake
# implementation gives the shapes without running anything.
@torch.library.custom_op("specdec::verify_triton", mutates_args=())
def verify_triton_op(draft_tokens: torch.Tensor, draft: torch.Tensor | None, target_logits: torch.Tensor,
                     uniforms: torch.Tensor, temperature: float, sigmoid: bool, alpha: float,
                     beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(draft_tokens, draft, target_logits, uniforms, temperature, sigmoid=sigmoid, alpha=alpha, beta=beta)


@verify_triton_op.register_fake
def _(draft_tokens, draft, target_logits, uniforms, temperature, sigmoid, alpha, beta):
    B, gamma = draft_tokens.shape
    new = draft_tokens.new_empty
    return new((B, gamma + 1)), new((2, B))


def run_kernels(draft_tokens, draft, target_logits, uniforms, temperature, sigmoid, alpha, beta):
    """The two launches: through the custom op while torch.compile traces (it needs the op's fake shapes), a plain
    launch otherwise (the op's Python dispatch costs host time every step; a CUDA graph holds either)."""
    if torch.compiler.is_compiling():
        return verify_triton_op(draft_tokens, draft, target_logits, uniforms, temperature, sigmoid, alpha, beta)
    return launch(draft_tokens, draft, target_logits, uniforms, temperature, sigmoid=sigmoid, alpha=alpha, beta=beta)


def verify_exact_triton(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                        uniforms: torch.Tensor, temperature: float = 1.0, alpha: float = -1e4,
                        beta: float = 1e4) -> Verification:
    """The Triton kernels; the error flags come back unread (Verification.checked or .accepted reads them)."""
    out, counts = run_kernels(draft_tokens, draft_probs, target_logits, uniforms, temperature, False, 0.0, 1.0)
    return Verification(out, counts[0], counts, triton_backend_name())
