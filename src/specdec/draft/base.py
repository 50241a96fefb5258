"""What the decoding loop asks of a drafter and of a proposal (protocols), the base of drafters that draft each
row on its own, the hand-over of the target's cache to a drafter that can read it, and any chain drafter seen
as a tree drafter (ChainTreeDrafter).

One shape: a drafter drafts for the rows of a batch, and a single sequence is a batch of one. A draft model
drafts every row per step (specdec.draft.model.ModelDrafter); a drafter whose work is per sequence (prompt
lookup, tree drafters, other vocabularies) writes its one-row steps and inherits the rest from `RowDrafter`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..runtime.cached import CachedLM
from ..sampling import Sampling
from ..verify.tree import IID
from .proposal import RowProposals
from .tree import chain


class Proposal(Protocol):
    """One row's proposal: a chain (specdec.draft.proposal.Draft) or a tree (specdec.draft.tree.TreeDraft) of
    `size` tokens, each with the q row it was drawn from."""

    tokens: torch.Tensor  # (n,)
    q: torch.Tensor  # (n, V)
    forwards: int  # draft-model passes spent
    parents: torch.Tensor  # (n,) the proposal as a tree (-1: the root)
    is_chain: bool  # every node's parent is the node before it

    @property
    def size(self) -> int: ...

    def depths(self) -> list[int]: ...

    def check(self) -> None:
        """Refuse an inconsistent proposal before the target scores it."""

    def overlaps(self, p: torch.Tensor, path: list[int]) -> torch.Tensor:
        """beta = sum_x min(p, q) at the positions on the output path that the round tested."""


class Drafter(Protocol):
    """What the decoding loop needs from a source of draft tokens, for the B rows still decoding (B = 1: one
    sequence): chains (ModelDrafter, NGramDrafter) or token trees (specdec.draft.tree), one call shape."""

    vocab_size: int | None  # logits width, or None for drafters without a vocabulary of their own
    # How drafting time grows with the draft length, which k="auto" needs (specdec.choose.cost):
    # "per_token" (one draft-model forward per token) or "per_call" (a lookup: about the same for any length).
    draft_cost: str

    def start(self, prompts: list[torch.Tensor]) -> None:
        """Forget the previous sequences; prompts are (1, L_b) each."""

    def propose(
        self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
        generator: torch.Generator | None,
    ) -> RowProposals:
        """Up to k tokens (a tree: depth at most k) continuing each sequence (1, L_b), with their processed q rows
        of width vocab_size."""

    def rollback(self, lengths: list[int]) -> None:
        """Only the first lengths[b] tokens of row b's last sequence are still valid."""

    def select(self, rows: list[int]) -> None:
        """Only these rows go on (the others finished), in this order."""


class RowDrafter:
    """Base of drafters that draft each row on its own: a subclass writes the one-row steps (`start_row`,
    `propose_row`, `rollback_row`) and `fork` (the same drafter for one more sequence); this class runs them for
    every row. Row 0 is the drafter itself, so a batch of one makes no copy."""

    stateless = False  # True: keeps nothing between calls, so one object serves every row
    forks: list[RowDrafter]

    def fork(self) -> RowDrafter:
        raise ValueError(
            f"{type(self).__name__} cannot draft for a batch (it keeps per-sequence state and has no fork()): decode "
            "one prompt at a time with it (batch_size=1), or use a model drafter, prompt lookup or a tree drafter"
        )

    def start(self, prompts: list[torch.Tensor]) -> None:
        self.forks = [self if b == 0 or self.stateless else self.fork() for b in range(len(prompts))]
        for drafter, prompt in zip(self.forks, prompts):
            drafter.start_row(prompt)

    def propose(
        self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
        generator: torch.Generator | None,
    ) -> RowProposals:
        rows = [d.propose_row(s, k, sampling, vocab_size, generator) for d, s in zip(self.forks, sequences)]
        return RowProposals(rows, forwards=sum(r.forwards for r in rows))

    def rollback(self, lengths: list[int]) -> None:
        for drafter, length in zip(self.forks, lengths):
            drafter.rollback_row(length)

    def select(self, rows: list[int]) -> None:
        self.forks = [self.forks[i] for i in rows]

    def start_row(self, prompt: torch.Tensor) -> None:
        """Forget the previous sequence; prompt is (1, L)."""

    def propose_row(
        self, sequence: torch.Tensor, k: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> Proposal:
        raise NotImplementedError

    def rollback_row(self, length: int) -> None:
        """Only the first `length` tokens of the last sequence are still valid."""


def check_rows(drafter: object, rows: int) -> None:
    """Refuse, before any work, a drafter that cannot draft for `rows` rows (the error names the fix)."""
    inner = getattr(drafter, "drafter", drafter)  # a ChainTreeDrafter drafts with its chain drafter
    if rows > 1 and isinstance(inner, RowDrafter) and not inner.stateless and type(inner).fork is RowDrafter.fork:
        inner.fork()


def share_cache(drafter: object, target: CachedLM) -> None:
    """Offer the target's cache to a drafter that can read it (a copy of the target built to read it)."""
    share = getattr(drafter, "share_cache", None)
    if share is not None:
        share(target)


class ChainTreeDrafter:
    """A chain drafter seen as a tree drafter (one child per node): chains and trees in the same loop."""

    def __init__(self, drafter: Drafter, k: int = 4):
        self.drafter = drafter
        self.k = k
        self.vocab_size = drafter.vocab_size
        self.draft_cost = getattr(drafter, "draft_cost", None)  # k="auto" prices it as the chain drafter

    def share_cache(self, target: CachedLM) -> None:
        share_cache(self.drafter, target)

    def start(self, prompts: list[torch.Tensor]) -> None:
        self.drafter.start(prompts)

    def rollback(self, lengths: list[int]) -> None:
        self.drafter.rollback(lengths)

    def select(self, rows: list[int]) -> None:
        self.drafter.select(rows)

    def propose(
        self, sequences: list[torch.Tensor], depth: int, sampling: Sampling, vocab_size: int,
        generator: torch.Generator | None,
    ) -> RowProposals:
        drafts = self.drafter.propose(sequences, min(self.k, depth), sampling, vocab_size, generator)
        return drafts.map(lambda d: chain(d.tokens, d.q, IID, d.forwards))  # one i.i.d. child: Leviathan's rule
