"""The decoding loop's state (specdec.decoding): B rows of different lengths; a single sequence is a batch of one.

Notation of Leviathan et al.: p target distribution, q draft distribution, k = gamma draft tokens.
A round is the single-sequence round done for every row at once:

    choose      one k for the batch (a tree: one depth and node budget), from earlier rounds only
    propose     every active row gets its own proposal (a batched draft model drafts all rows per step)
    score       one target pass over all rows: row b's last token and its proposal, padded to the widest
    accept      each row's acceptance rule runs on that row's p and q alone, with the shared generator
    commit      each row keeps its accepted path in both caches (specdec.runtime.cached: one row crops, several
                mark dead slots, no copy)
    retire      rows that ended (an end token or their budget) leave the batch: no more drafting for them

Why every row stays exact. Row b's round uses only row b's p and q: the pass computes row b's logits
from row b's own tokens (the masks hide every other row and every dead slot), and the rule accepts row
b's tokens with uniforms drawn for row b alone. So, given the tokens before the round, row b's emitted
tokens have the distribution the single-sequence rule gives them, which is the target's. Sharing a
generator only interleaves the rows' draws; it never makes one row's acceptance depend on another's.
Cutting every row to the batch's shortest accepted length, or one uniform shared by all rows, would not
be exact (tests/test_batch.py shows a chi-square test rejecting both).

Why k may depend only on the past. k (and a tree's shape) is fixed before the pass that computes p, from
rounds that are finished; so for each row the round is a round of speculative sampling with a k chosen
independently of this round's p, which is exact for any k. A k chosen after seeing this round's p (for
example "draft longer while the rows agree") would bias the output.

Seeding: one torch.Generator for the whole batch. Draft tokens are drawn row by row in the order of the
rows still active, then each row's uniforms in the same order; a run is reproducible given its seed and
its batch, but a row's draws depend on which rows share its batch (its distribution does not).
"""

from __future__ import annotations

import time

import torch

from .choose.cost import ObservedRound
from .draft.base import Drafter
from .metrics import Generation, Stats
from .runtime.cached import CachedLM
from .stopping import EosSet, truncate_at_eos


class Batch:
    """The loop state for B rows: each row's tokens so far, its budget, whether it ended, and when.

    `order` lists the rows still in the caches, in cache order; the loop's tokens and proposals follow it.
    """

    def __init__(self, prompts: list[torch.Tensor], max_new_tokens: int, eos: EosSet, device: torch.device):
        self.rows = [p.to(device) for p in prompts]  # (1, L_b) each, grown as rows emit
        self.prompt_lengths = [p.shape[-1] for p in prompts]
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self.ended = [False] * len(prompts)
        self.order = list(range(len(prompts)))
        self.start = time.perf_counter()
        self.latency = [0.0] * len(prompts)  # seconds from here to the row's last token (a loop makes its state
        # inside its total's stopwatch, so that no row ends after the call)
        self.stats = [Stats() for _ in prompts]  # each row's own counts
        self.overlaps = [torch.zeros((), device=device) for _ in prompts]  # each row's sum of beta, on the device

    @property
    def tokens(self) -> list[torch.Tensor]:
        """The active rows' sequences (1, L_b), in cache order."""
        return [self.rows[b] for b in self.order]

    def emitted(self, b: int) -> int:
        return self.rows[b].shape[-1] - self.prompt_lengths[b]

    def row_active(self, b: int) -> bool:
        return not self.ended[b] and self.emitted(b) < self.max_new_tokens

    @property
    def active(self) -> bool:
        return bool(self.order)

    def rooms(self) -> list[int]:
        """Draft tokens each active row may still add (one token of its budget is the target's own)."""
        return [self.max_new_tokens - self.emitted(b) - 1 for b in self.order]

    def room(self) -> int:
        return max(self.rooms())

    def extend(self, accepted: list[torch.Tensor], next_tokens: list[torch.Tensor]) -> None:
        """Append each active row's accepted tokens and its target token, cut after an end token."""
        now = time.perf_counter() - self.start
        for b, tokens, last in zip(self.order, accepted, next_tokens):
            new = truncate_at_eos(torch.cat([tokens.to(last.device), last]), self.eos)
            self.rows[b] = torch.cat([self.rows[b], new[None].to(self.rows[b].device)], dim=-1)
            self.ended[b] = self.eos.ended(new)
            self.latency[b] = now

    def retire(self, lm: CachedLM, drafter: Drafter) -> None:
        """Rows that ended leave the caches (target and draft); the others roll back to their sequence."""
        still = [i for i, b in enumerate(self.order) if self.row_active(b)]
        if len(still) < len(self.order):
            self.order = [self.order[i] for i in still]
            if self.order:
                lm.select(still)
                drafter.select(still)
        if self.order:
            drafter.rollback([self.rows[b].shape[-1] - 1 for b in self.order])

    def new_tokens(self) -> list[torch.Tensor]:
        return [row[0, start:] for row, start in zip(self.rows, self.prompt_lengths)]

    def record(self, stats: Stats, round: ObservedRound, trees: bool) -> None:
        """Each active row's share of a round, in the batch's statistics and in the row's own."""
        for b, proposal, path, overlaps in zip(self.order, round.verified.rows, round.path, round.overlaps):
            depth = max(proposal.depths(), default=0)
            for counts in (stats, self.stats[b]):
                counts.record_round(proposal.size, depth, len(path), overlaps.numel(), tree=trees)
            self.overlaps[b] = self.overlaps[b] + overlaps.sum().to(self.overlaps[b].device)

    def produced(self, round: ObservedRound) -> int:
        """Tokens the round made over all rows (accepted + 1 each, before end-token truncation)."""
        return sum(len(path) + 1 for path in round.path)

    def result(self, stats: Stats) -> Generation:
        """The finished batch: counts summed over rows, each row's latency and emitted tokens (the round's host
        syncs for the overlaps happen here, once)."""
        for b, row in enumerate(self.stats):
            row.emitted = self.emitted(b)
            row.overlap_sum = float(self.overlaps[b])
            row.seconds.update({phase: t for phase, t in stats.seconds.items() if phase != "total"})  # shared
            row.seconds["total"] = self.latency[b]
        stats.emitted = sum(row.emitted for row in self.stats)
        stats.overlap_sum = sum(row.overlap_sum for row in self.stats)
        stats.extras.update(passes=len(stats.chosen_k) or stats.extras.get("passes", 0), rows=len(self.stats))
        return Generation(self.new_tokens(), stats, self.stats, list(self.latency))
