"""The shapes of a pass: a chain's causal ancestry, right padding with dead queries, left-padded rows."""

from __future__ import annotations

import torch

DEAD = -1  # the position of a slot that holds no token of its row


def causal_ancestry(rows: int, width: int, device: torch.device) -> torch.Tensor:
    """(B, n, n) bool: each new token sees the new tokens before it and itself (a chain in every row)."""
    return torch.ones(width, width, dtype=torch.bool, device=device).tril().expand(rows, width, width)


def padded_pass(tokens: torch.Tensor, positions: torch.Tensor, ancestry: torch.Tensor, width: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pass (B, n) padded on the right to `width` with dead queries (token 0, position DEAD, seeing nothing)."""
    rows, n = tokens.shape
    tokens = torch.cat([tokens, tokens.new_zeros(rows, width - n)], dim=1)
    positions = torch.cat([positions, positions.new_full((rows, width - n), DEAD)], dim=1)
    grown = ancestry.new_zeros(rows, width, width)
    grown[:, :n, :n] = ancestry
    return tokens, positions, grown


def left_padded(rows: list[torch.Tensor], starts: list[int], device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows (n_b,) left-padded into (B, n) with their positions starts[b].. (DEAD for padding)."""
    width = max((r.numel() for r in rows), default=0)
    tokens = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    positions = torch.full((len(rows), width), DEAD, dtype=torch.long, device=device)
    for b, (row, start) in enumerate(zip(rows, starts)):
        n = row.numel()
        if n:
            tokens[b, width - n :] = row.to(device)
            positions[b, width - n :] = torch.arange(start, start + n, device=device)
    return tokens, positions
