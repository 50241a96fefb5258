"""Block verification (Sun et al., ICLR 2025): a drafted chain verified jointly, from the same p and q.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..draft.proposal import Draft
from ..sampling import sample
from .base import AcceptanceRule


class BlockVerification(AcceptanceRule):
    """Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh; ICLR 2025, arXiv
    2403.10444): the drafted block is verified jointly instead of token by token, from the same p and q.

    With r_i = p_i(x_i) / q_i(x_i), the weights w_0 = 1, w_i = min(1, w_{i-1} r_i) say how much of the target's
    mass the block keeps up to position i. Going back from the whole block (i = k) to none (i = 0), the first
    i accepted is kept: i = k with probability w_k (then a bonus token from p_{k+1}), i < k with probability
    h_i = s_i / (s_i + 1 - w_i), s_i = sum_x max(0, w_i p_{i+1}(x) - q_{i+1}(x)), and the next token is drawn
    from that residual, norm(max(0, w_i p_{i+1} - q_{i+1})). The output keeps the target's distribution
    (notebook 01 derives it; tests enumerate it); the expected number of accepted tokens is never below
    Leviathan's token-level rule and is optimal among rules that see only these conditionals. At temperature
    0 it accepts exactly the tokens the token-level rule does.
    """

    trees = False  # verifies chains

    def __init__(self, residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        self.residual = residual or block_residual  # injectable so that tests can show a wrong one caught

    def accept(self, p: torch.Tensor, draft: Draft, generator: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
        k = draft.size
        weights = block_weights(p, draft)  # (k+1,) on the host: the round's one sync
        eta = torch.rand(k + 1, generator=generator, device=p.device)  # one uniform per stopping point
        if k and float(eta[k]) < weights[k]:  # the whole block, and a bonus token from p_{k+1}
            return list(range(k)), sample(p[k][None], generator)
        w = torch.tensor(weights[:k], dtype=p.dtype, device=p.device)  # (k,)
        mass = (w[:, None] * p[:k] - draft.q).clamp_min(0.0).sum(-1)  # (k,) s_i
        rest = mass + 1.0 - w  # s_i + 1 - w_i: 0 only where nothing is left to stop on (h_0 = 1 then)
        stop = torch.where(rest > 0, mass / rest.clamp_min(torch.finfo(p.dtype).tiny), 1.0)  # (k,) h_i
        n = int(torch.nonzero(eta[:k] < stop).max()) if k else 0  # the last stopping point accepted; h_0 = 1
        q_next = draft.q[n] if k else p[0]  # k = 0: a plain step, the residual of p against itself is p
        return list(range(n)), sample(self.residual(weights[n] * p[n], q_next)[None], generator)


def block_weights(p: torch.Tensor, draft: Draft) -> list[float]:
    """w_0 = 1, w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)), i = 1..k (a draft token has q_i(x_i) > 0)."""
    i = torch.arange(draft.size, device=p.device)
    weights = [1.0]
    for ratio in (p[i, draft.tokens] / draft.q[i, draft.tokens]).tolist():
        weights.append(min(1.0, weights[-1] * ratio))
    return weights


def block_residual(scaled_p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, w p - q)): what the next token is drawn from when the block stops before its end."""  # (V,)
    r = (scaled_p - q).clamp_min(0.0)
    total = r.sum()
    return r / total if total > 0 else scaled_p / scaled_p.sum()
