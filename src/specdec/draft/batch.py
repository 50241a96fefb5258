"""Drafters for a batch: one proposal per active row.

A chain draft model drafts all rows per step (BatchModelDrafter); every other drafter gets one copy per
row (RowDrafters, through its fork()). `batch_drafter` picks the form for a drafter.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..runtime.batch_cache import BatchedLM, left_padded
from ..sampling import Sampling, probabilities, sample
from .base import Drafter
from .model import ModelDrafter, same_shapes
from .proposal import Draft, RowProposals


class BatchDrafter:
    """What the loop asks of a batch's drafter: the Drafter protocol over rows, and `select` (rows leave)."""

    vocab_size: int | None
    draft_cost: str

    def start(self, prompts: list[torch.Tensor]) -> None: ...

    def propose(self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
                generator: torch.Generator | None) -> RowProposals: ...

    def rollback(self, lengths: list[int]) -> None: ...

    def select(self, rows: list[int]) -> None: ...


class BatchModelDrafter(BatchDrafter):
    """A draft model drafting every row at once: one forward of B tokens per draft step.

    Each row's unseen tail (its last token, and after a full acceptance or a plain step a few more) is fed
    left-padded in one pass; then k - 1 one-token steps. A rejection only marks the row's dead slots
    (specdec.runtime.batch_cache), so rollback copies nothing.

    reads_target_cache=True (a reduced-precision copy of the target, as for ModelDrafter): instead of its
    own prefill and catch-up passes, before each proposal the draft cache takes the target's cached states,
    cast to the draft's dtype (only the slots appended since the last copy, unless the target's slots moved),
    and the draft runs one-token steps only. q is still what each token is sampled from, so every row stays
    exact; the draft is "the copy, reading the target's states".
    """

    draft_cost = "per_token"

    def __init__(self, model: PreTrainedModel, reads_target_cache: bool = False):
        self.model = model
        self.lm = BatchedLM(model)
        self.vocab_size = self.lm.vocab_size
        self.reads_target_cache = reads_target_cache
        self.offered: BatchedLM | None = None  # the target cache the loop handed over for the next batch
        self.target: BatchedLM | None = None  # the target cache read during this batch
        self.synced, self.layout = 0, -1  # target slots copied, in the target's layout `layout`

    def share_cache(self, target: BatchedLM) -> None:
        if self.reads_target_cache and same_shapes(self.model, target.model) and target.device == self.lm.device:
            self.offered = target

    def start(self, prompts: list[torch.Tensor]) -> None:
        self.target, self.offered, self.synced, self.layout = self.offered, None, 0, -1
        if self.target is None:
            self.lm.prefill(prompts)

    def copy_target(self) -> None:
        """Make the draft cache hold the target's states for every slot the target holds."""
        if self.target.layout != self.layout:  # its slots moved (or a first copy): start over
            self.lm.reset()
            self.synced, self.layout = 0, self.target.layout
        self.lm.copy_from(self.target, self.synced)
        self.synced = self.target.slots

    def propose(self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
                generator: torch.Generator | None) -> RowProposals:
        if self.target is not None:
            self.copy_target()
        lengths = self.lm.lengths().tolist()
        tokens, positions = left_padded([s[0, n:] for s, n in zip(sequences, lengths)], lengths, self.lm.device)
        logits = self.lm.forward(tokens, positions, last_only=True)[:, -1, :vocab_size]  # (B, V)
        next_position = positions[:, -1:] + 1
        drafted, rows = [], []
        for i in range(k):
            q = probabilities(logits, sampling)  # (B, V)
            x = sample(q, generator)  # (B,)
            drafted.append(x)
            rows.append(q)
            if i + 1 < k:
                logits = self.lm.forward(x[:, None], next_position + i)[:, -1, :vocab_size]
        x, q = torch.stack(drafted, dim=1), torch.stack(rows, dim=1)  # (B, k), (B, k, V)
        return RowProposals([Draft(x[b], q[b], forwards=k) for b in range(len(sequences))], forwards=k)

    def rollback(self, lengths: list[int]) -> None:
        if self.target is None:  # reading the target, the next copy replaces the draft's own slots
            self.lm.truncate(torch.tensor(lengths))

    def select(self, rows: list[int]) -> None:
        if self.target is None:  # reading the target, its layout changed: the next copy starts over
            self.lm.select(rows)


class RowDrafters(BatchDrafter):
    """Any single-sequence drafter, one copy per row (fork), each proposing for its own row: prompt lookup
    and the tree drafters. A model drafter copied this way drafts its rows one after another; the target's
    pass is still one for the whole batch."""

    def __init__(self, drafter: Drafter):
        self.prototype = drafter
        self.vocab_size = drafter.vocab_size
        self.draft_cost = getattr(drafter, "draft_cost", None)
        self.drafters: list[Drafter] = []

    def start(self, prompts: list[torch.Tensor]) -> None:
        self.drafters = [fork(self.prototype) for _ in prompts]
        for drafter, prompt in zip(self.drafters, prompts):
            drafter.start(prompt)

    def propose(self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
                generator: torch.Generator | None) -> RowProposals:
        rows = [d.propose(s, k, sampling, vocab_size, generator) for d, s in zip(self.drafters, sequences)]
        return RowProposals(rows, forwards=sum(r.forwards for r in rows))

    def rollback(self, lengths: list[int]) -> None:
        for drafter, length in zip(self.drafters, lengths):
            drafter.rollback(length)

    def select(self, rows: list[int]) -> None:
        self.drafters = [self.drafters[i] for i in rows]


def fork(drafter: Drafter) -> Drafter:
    """A drafter for one more row: the same object if it keeps no state between calls, else its fork()."""
    if getattr(drafter, "stateless", False):  # prompt lookup reads only the sequence it is given
        return drafter
    if hasattr(drafter, "fork"):
        return drafter.fork()
    raise ValueError(
        f"{type(drafter).__name__} cannot draft for a batch (it keeps per-sequence state and has no fork()): use "
        "batch_size=1 with it, or a model drafter, prompt lookup or a tree drafter"
    )


def batch_drafter(drafter: Drafter | BatchDrafter) -> BatchDrafter:
    """The batch form of a drafter: a chain draft model drafts all rows per step; others get one copy per row."""
    if isinstance(drafter, BatchDrafter):
        return drafter
    if type(drafter) is ModelDrafter:
        return BatchModelDrafter(drafter.model, drafter.reads_target_cache)
    if getattr(drafter, "candidates", None) is not None:
        raise ValueError("a DraftSwitch (the draft chosen online among candidates) does not batch yet: give one "
                         "of its candidates as the drafter (the run picks the calibrated best at batch_size > 1)")
    fork(drafter)  # refuse early what cannot batch
    return RowDrafters(drafter)
