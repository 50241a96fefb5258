"""What the decoding loop asks of a drafter and of a proposal (protocols), and the hand-over of the
target's cache to a drafter that can read it.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..runtime.cached import CachedLM
from ..sampling import Sampling


class Proposal(Protocol):
    """What the decoding loop needs from a proposal: a chain (specdec.draft.proposal.Draft) or a tree
    (specdec.draft.tree.TreeDraft) of `size` tokens, each with the q row it was drawn from."""

    tokens: torch.Tensor  # (n,)
    q: torch.Tensor  # (n, V)
    forwards: int  # draft-model passes spent
    parents: torch.Tensor  # (n,) the proposal as a tree (-1: the root)

    @property
    def size(self) -> int: ...

    def depths(self) -> list[int]: ...

    def score(self, target: CachedLM, sequence: torch.Tensor, sampling: Sampling, vocab: int) -> torch.Tensor:
        """One target pass over the unseen tail of sequence and the proposal: p (n+1, V)."""

    def overlaps(self, p: torch.Tensor, path: list[int]) -> torch.Tensor:
        """beta = sum_x min(p, q) at the positions on the output path that the round tested."""


class Drafter(Protocol):
    """What the decoding loop needs from a source of draft tokens: chains (ModelDrafter, NGramDrafter) or
    token trees (specdec.draft.trees), one call shape."""

    vocab_size: int | None  # logits width, or None for drafters without a vocabulary of their own
    # How drafting time grows with the draft length, which k="auto" needs (specdec.choose.cost):
    # "per_token" (one draft-model forward per token) or "per_call" (a lookup: about the same for any length).
    draft_cost: str

    def start(self, prompt: torch.Tensor) -> None:
        """Forget the previous sequence; prompt is (1, L)."""

    def propose(
        self, sequence: torch.Tensor, k: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> Proposal:
        """Up to k tokens (a tree: depth at most k) continuing sequence (1, L), and their processed q rows of
        width vocab_size."""

    def rollback(self, length: int) -> None:
        """Only the first `length` tokens of the last sequence are still valid."""


def share_cache(drafter: object, target: CachedLM) -> None:
    """Offer the target's cache to a drafter that can read it (a copy of the target built to read it)."""
    share = getattr(drafter, "share_cache", None)
    if share is not None:
        share(target)
