"""Proposals: what a drafter hands the target to score.

Notation of Leviathan et al.: p target distribution, q draft distribution. A chain `Draft` holds x_1..x_n and
the rows of q they were sampled from; `RowProposals` holds one proposal per row of a batch, scored by one
target pass over all rows. Token trees (specdec.draft.tree.TreeDraft) have the same methods.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..runtime.cached import DEAD, CachedLM
from ..sampling import Sampling, probabilities
from ..verify.tree import IID
from .tree import TreeDraft, ancestry, empty_tree


@dataclass
class RowProposals:
    """One proposal per active row (chains or trees), scored by one target pass over all rows."""

    rows: list[Draft | TreeDraft]
    forwards: int = 0  # draft passes spent (a batched draft model: one per step for all rows)

    @property
    def size(self) -> int:
        """The pass's proposal width: the largest row's (the others are padded)."""
        return max(r.size for r in self.rows)

    def depths(self) -> list[int]:
        return [d for r in self.rows for d in r.depths()]

    def depth(self) -> int:
        return max(self.depths(), default=0)

    def map(self, change) -> RowProposals:
        return RowProposals([change(r) for r in self.rows], self.forwards)

    @classmethod
    def empty(cls, rows: int, vocab_size: int, device: torch.device | str, trees: bool = False) -> RowProposals:
        """No draft in any row: the round is a plain target step."""
        empty = empty_tree if trees else Draft.empty
        return cls([empty(vocab_size, device) for _ in range(rows)])

    def score(self, lm: CachedLM, sequences: list[torch.Tensor], sampling: Sampling, vocab: int
              ) -> list[torch.Tensor]:
        """One target pass: row b's last token (the root) and its proposal; p_b (n_b + 1, V) per row. Chains in
        every row pass no ancestry (one row then takes the model's own causal mask)."""
        width = 1 + self.size
        lengths = lm.lengths().tolist()
        tokens = torch.zeros(len(self.rows), width, dtype=torch.long)
        positions = torch.full((len(self.rows), width), DEAD, dtype=torch.long)
        chains = all(r.is_chain for r in self.rows)
        seen = None if chains else torch.zeros(len(self.rows), width, width, dtype=torch.bool)
        for b, (proposal, sequence, cached) in enumerate(zip(self.rows, sequences, lengths)):
            if sequence.shape[-1] != cached + 1:
                raise RuntimeError(f"row {b}: the target caches {cached} of {sequence.shape[-1]} tokens; it must "
                                   "cache all but the last")
            proposal.check()
            n = proposal.size
            tokens[b, 0] = sequence[0, -1]
            tokens[b, 1 : 1 + n] = proposal.tokens
            positions[b, 0] = cached
            positions[b, 1 : 1 + n] = cached + torch.tensor(proposal.depths(), dtype=torch.long)
            if seen is not None:
                seen[b, : 1 + n, : 1 + n] = ancestry([-1] + [p + 1 for p in proposal.parents.tolist()])  # root = 0
        logits = lm.forward(tokens, positions, seen)  # (B, width, V)
        p = probabilities(logits[..., :vocab], sampling)
        return [p[b, : 1 + r.size] for b, r in enumerate(self.rows)]

    def overlaps(self, p: list[torch.Tensor], paths: list[list[int]]) -> list[torch.Tensor]:
        """Each row's beta = sum_x min(p, q) on its output path."""
        return [r.overlaps(p_b, path) for r, p_b, path in zip(self.rows, p, paths)]

    def accepted(self, paths: list[list[int]]) -> list[torch.Tensor]:
        return [r.tokens[path] for r, path in zip(self.rows, paths)]


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

    is_chain = True  # scored with a causal mask

    def check(self) -> None:
        """Nothing to check: a chain of any length (0: a plain step) is a valid proposal."""

    def overlaps(self, p: torch.Tensor, path: list[int]) -> torch.Tensor:
        """beta_i = sum_x min(p_i, q_i) at the positions the round tested (on the output path)."""
        return overlap(p, self.q, min(len(path) + 1, self.size))


def overlap(p: torch.Tensor, q: torch.Tensor, observed: int) -> torch.Tensor:
    """beta_i = sum_x min(p_i, q_i) at the first `observed` positions (those on the output path)."""  # (observed,)
    return torch.minimum(p[:observed], q[:observed]).sum(dim=-1)
