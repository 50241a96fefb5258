"""Speculative sampling, Algorithm 1 of Leviathan et al. (2023); Chen et al. (2023) use the same rule.

Notation of Leviathan et al.: p target distribution, q draft distribution, k = gamma draft tokens.
Each round: the drafter proposes x_1..x_k ~ q (a `Draft`); one target pass scores them, giving
p_1..p_{k+1}; x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first
rejection a token is drawn from norm(max(0, p_i - q_i)) (`residual`); if all k are accepted a bonus
token is drawn from p_{k+1} (`accept`). The emitted sequence has exactly the target's distribution.

The loop that runs these steps, for chains and token trees alike, is specdec.decoding.decode (each row of a
batch on its own; one sequence is a batch of one):
    drafts = drafter.propose(sequences, k)        # x_1..x_k ~ q, per row
    p = drafts.score(target, sequences)           # one target pass: p_1..p_{k+1}, per row
    paths, next_tokens = TokenLevel().accept_rows(p, drafts)
    target.keep(k, paths)                         # crop the rejected tokens from the KV cache
Both KV caches hold every token of the sequence except the last; a rejection crops them, the
accepted prefix is never recomputed. A round is exact for any k fixed before its target distribution
is computed, so k may change from round to round (specdec.choose.cost).
"""

from __future__ import annotations

import torch

from ..draft.proposal import Draft
from ..sampling import sample
from .base import AcceptanceRule


def residual(p_i: torch.Tensor, q_i: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): the distribution to resample from after a rejection."""  # (V,)
    r = (p_i - q_i).clamp_min(0.0)
    total = r.sum()
    return r / total if total > 0 else p_i  # p == q up to rounding: nothing to correct


def accept(
    p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, torch.Tensor]:
    """Accept x_i while r_i < p_i(x_i) / q_i(x_i); return n accepted and the target's next token (1,)."""
    k = draft.numel()
    i = torch.arange(k, device=p.device)
    r = torch.rand(k, generator=generator, device=p.device)  # (k,) one uniform per draft token
    kept = r < p[i, draft] / q[i, draft]  # min(1, .) is implied: r < 1
    n = int(kept.long().cumprod(0).sum())  # leading accepts; the round's one host sync
    next_token = sample(residual(p[n], q[n])[None] if n < k else p[k][None], generator)
    return n, next_token


class TokenLevel(AcceptanceRule):
    """Leviathan's token-level acceptance rule for a chain (`accept`); the accepted path is its first n tokens."""

    trees = False  # verifies chains; token trees take specdec.verify.tree.TreeRules

    def accept(self, p: torch.Tensor, draft: Draft, generator: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
        n, next_token = accept(p, draft.q, draft.tokens, generator)
        return list(range(n)), next_token
