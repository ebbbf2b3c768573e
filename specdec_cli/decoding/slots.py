"""The slot grid the target and the draft share: what every row holds, position by position.

All rows of a batch share one grid of cache *slots*. Slot s of row b holds a token, a validity bit and a
position id. Prompts are left-padded (pad slots invalid). Each round every row uses the same γ+1 new slots; a
row that accepted fewer draft tokens than the longest row keeps its rejected slots in the cache, marked
invalid (attention mask 0), and position ids count only valid slots, so every row sees exactly its own
contiguous sequence.

Between rounds the last slot (`pending`) holds each row's newest token, which no cache has seen yet.

Drafts read the slots (tokens, valid, length, window, ahead) and never change them; the loop alone appends a
round's proposal (extend), commits what verification kept (commit) and drops finished rows (select).
"""

from __future__ import annotations

import torch

from specdec_cli.errors import SpecdecError


class Slots:
    """tokens, validity and positions of every slot, for the rows still decoding."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, device: torch.device):
        rows = _real_tokens(input_ids, attention_mask)
        B, T = len(rows), max(len(r) for r in rows)
        capacity = T + 64
        tokens = torch.zeros(B, capacity, dtype=torch.int64)  # [B, S]
        valid = torch.zeros(B, capacity, dtype=torch.bool)  # [B, S]
        for b, r in enumerate(rows):
            tokens[b, T - len(r) : T] = torch.tensor(r)
            valid[b, T - len(r) : T] = True
        positions = (valid.long().cumsum(1) - 1).clamp_min(0)  # [B, S]: the valid slots before each
        self.tokens, self.valid, self.positions = tokens.to(device), valid.to(device), positions.to(device)
        self.length = T  # slots in use; the last one is `pending`
        self.has_holes = any(len(r) < T for r in rows)  # False: every slot valid, a mask may be None

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def pending(self) -> int:
        return self.length - 1

    def window(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(tokens [B, end−start], mask [B, end] or None, positions [B, end−start]) for slots start..end."""
        mask = self.valid[:, :end] if self.has_holes else None
        return self.tokens[:, start:end], mask, self.positions[:, start:end]

    def ahead(self, k: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """What k tokens appended next would get: (mask [B, length+k] or None, positions [B, k])."""
        positions = self.positions[:, self.pending : self.length] + torch.arange(1, k + 1, device=self.tokens.device)
        if not self.has_holes:
            return None, positions
        ones = torch.ones(self.rows, k, dtype=torch.bool, device=self.valid.device)
        return torch.cat([self.valid[:, : self.length], ones], 1), positions

    # ------------------------------------------------------------------------------------------------
    # The loop's: drafts never call these

    def ensure(self, extra: int) -> None:
        """Room for `extra` more slots."""
        need = self.length + extra
        if need <= self.tokens.shape[1]:
            return
        grow = max(need, 2 * self.tokens.shape[1]) - self.tokens.shape[1]
        self.tokens = torch.nn.functional.pad(self.tokens, (0, grow))
        self.valid = torch.nn.functional.pad(self.valid, (0, grow))
        self.positions = torch.nn.functional.pad(self.positions, (0, grow))

    def extend(self, tokens: torch.Tensor) -> None:
        """k new valid slots per row, right after the last: tokens [B, k] (a round's proposal)."""
        k = tokens.shape[1]
        s = self.length
        self.ensure(k)
        self.tokens[:, s : s + k] = tokens
        self.valid[:, s : s + k] = True
        self.positions[:, s : s + k] = self.positions[:, s - 1 : s] + torch.arange(1, k + 1, device=tokens.device)
        self.length += k

    def commit(self, start: int, accepted: list[int], new_token: torch.Tensor) -> int:
        """After a round that began at `start` (its pending slot): keep each row's accepted slots, mark its
        rejected ones invalid, write new_token [B] (the resampled or bonus token) to the new pending slot.
        -> the new pending slot, the same for every row (start + the longest row's accepted + 1)."""
        longest = max(accepted)
        pending = start + longest + 1
        n = torch.tensor(accepted, device=self.tokens.device)  # [B]
        if longest > min(accepted):  # rows that accepted fewer: their extra slots become holes
            offsets = torch.arange(1, longest + 1, device=n.device)  # [longest]
            self.valid[:, start + 1 : pending] = offsets[None, :] <= n[:, None]
            self.has_holes = True
        self.tokens[:, pending] = new_token
        self.valid[:, pending] = True
        self.positions[:, pending] = self.positions[:, start] + n + 1
        self.length = pending + 1
        return pending

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows (int64 [B'])."""
        self.tokens, self.valid, self.positions = (t.index_select(0, rows) for t in (self.tokens, self.valid,
                                                                                     self.positions))


def _real_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """Each row's real prompt tokens (any padding side accepted)."""
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise SpecdecError("input_ids must be a non-empty [batch, length] tensor")
    ids = input_ids.cpu().tolist()
    if attention_mask is None:
        return ids
    keep = attention_mask.cpu().bool().tolist()
    rows = [[t for t, k in zip(r, m) if k] for r, m in zip(ids, keep)]
    if any(len(r) == 0 for r in rows):
        raise SpecdecError("a prompt is empty (its attention mask is all zero)")
    return rows
