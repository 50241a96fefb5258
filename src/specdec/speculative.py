"""Speculative sampling, Algorithm 1 of Leviathan et al. (2023); Chen et al. (2023) use the same rule.

Notation of Leviathan et al.: p target distribution, q draft distribution, k = gamma draft tokens.
Each round: the drafter proposes x_1..x_k ~ q (a `Draft`); one target pass scores them, giving
p_1..p_{k+1} (`verify`); x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first
rejection a token is drawn from norm(max(0, p_i - q_i)) (`residual`); if all k are accepted a bonus
token is drawn from p_{k+1} (`accept`). The emitted sequence has exactly the target's distribution.

The loop that runs these steps, for chains and token trees alike, is specdec.decoding.decode:
    draft = drafter.propose(sequence, k)          # x_1..x_k ~ q
    p = draft.score(target, sequence)             # one target pass: p_1..p_{k+1}
    path, next_token = TokenLevel().accept(p, draft)
    target.keep(k, path)                          # crop the rejected tokens from the KV cache
Both KV caches hold every token of the sequence except the last; a rejection crops them, the
accepted prefix is never recomputed. A round is exact for any k fixed before its target distribution
is computed, so k may change from round to round (specdec.cost).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .cached import CachedLM
from .sampling import Sampling, probabilities, sample
from .tree_accept import IID


@dataclass
class Draft:
    """A chain proposal: tokens x_1..x_n (n,) with the rows of q they were sampled from (n, V); n may be below k."""

    tokens: torch.Tensor
    q: torch.Tensor
    forwards: int = 0  # draft-model passes spent on this proposal

    @classmethod
    def empty(cls, vocab_size: int, device: torch.device | str) -> Draft:
        """No draft: the round is a plain target step."""
        return cls(torch.zeros(0, dtype=torch.long, device=device), torch.zeros(0, vocab_size, device=device))

    @property
    def size(self) -> int:
        return self.tokens.numel()

    @property
    def parents(self) -> torch.Tensor:
        """A chain as a tree: node i's parent is node i - 1 (-1: the root, the sequence's last token)."""
        return torch.arange(-1, self.size - 1)

    @property
    def modes(self) -> torch.Tensor:
        """Each node is one i.i.d. child drawn from q: the tree rules then reduce to Leviathan's."""
        return torch.full((self.size,), IID, dtype=torch.long)

    def depths(self) -> list[int]:
        return list(range(1, self.size + 1))

    def score(self, target: CachedLM, sequence: torch.Tensor, sampling: Sampling, vocab: int) -> torch.Tensor:
        """One causal target pass: p_1..p_{k+1} (k+1, V)."""
        return verify(target, sequence, self.tokens, sampling, vocab)

    def overlaps(self, p: torch.Tensor, path: list[int]) -> torch.Tensor:
        """beta_i = sum_x min(p_i, q_i) at the positions the round tested (on the output path)."""
        return overlap(p, self.q, min(len(path) + 1, self.size))


def verify(
    target: CachedLM, sequence: torch.Tensor, draft: torch.Tensor, sampling: Sampling, vocab: int
) -> torch.Tensor:
    """One target pass over the unseen tail of sequence plus the draft; returns p_1..p_{k+1} (k+1, V)."""
    logits = target.advance(torch.cat([sequence, draft[None]], dim=-1))  # (m + k, V_target)
    return probabilities(logits[-(draft.numel() + 1) :, :vocab], sampling)


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


def overlap(p: torch.Tensor, q: torch.Tensor, observed: int) -> torch.Tensor:
    """beta_i = sum_x min(p_i, q_i) at the first `observed` positions (those on the output path)."""  # (observed,)
    return torch.minimum(p[:observed], q[:observed]).sum(dim=-1)


class TokenLevel:
    """Leviathan's token-level acceptance rule for a chain (`accept`); the accepted path is its first n tokens."""

    trees = False  # verifies chains; token trees take specdec.tree_accept.TreeRules

    def accept(self, p: torch.Tensor, draft: Draft, generator: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
        n, next_token = accept(p, draft.q, draft.tokens, generator)
        return list(range(n)), next_token


class BlockVerification:
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
