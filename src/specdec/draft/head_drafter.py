"""Drafting with a trained head (specdec.draft.head) on the features the target's passes already computed.

The loop caches every token of a sequence but its last in the target; with `keep_features` the target's cache
also keeps each slot's feature f_i. Before drafting, the head catches up on the positions it has not read:
for each cached position i it takes (f_i, x_{i+1}) and writes its own KV cache; its output at the last cached
position predicts the feature of the sequence's last token, whose W_S row gives q for the first draft token.
Each further draft token feeds the head its own prediction: no target pass and no second copy of the target.
The head's cache keeps only positions read from true features; its drafting steps are cropped at the next call.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from ..runtime.cached import CachedLM
from ..sampling import Sampling, probabilities, sample
from .base import RowDrafter
from .head import DraftHead, load_head
from .proposal import Draft, RowProposals


class HeadDrafter(RowDrafter):
    """Chains of up to k tokens from a DraftHead, one row at a time (a batch: one fork per row)."""

    draft_cost = "per_token"

    def __init__(self, head: DraftHead):
        self.head = head.eval()
        self.vocab_size = head.vocab_size
        self.source: CachedLM | None = None  # the target cache whose features the head reads
        self.row = 0  # this fork's row in the target's batch

    def fork(self) -> HeadDrafter:
        twin = HeadDrafter(self.head)
        twin.source = self.source
        return twin

    def share_cache(self, target: CachedLM) -> None:
        """Read this target's features (the loop offers its cache before the target caches the prompts)."""
        target.keep_features()
        self.source = target
        if getattr(self, "forks", None):
            for fork in self.forks:
                fork.source = target

    def start(self, prompts: list[torch.Tensor]) -> None:
        if self.source is None:
            raise ValueError("a head drafter reads the target's features: decode with specdec's loop (decode, "
                             "speculative_generate), which hands it the target's cache")
        super().start(prompts)

    def start_row(self, prompt: torch.Tensor) -> None:
        self.cache = DynamicCache(config=self.head.body.config)
        self.synced = 0  # positions the head has read from true features

    def propose(
        self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
        generator: torch.Generator | None,
    ) -> RowProposals:
        for b, fork in enumerate(self.forks):
            fork.row = b
        return super().propose(sequences, k, sampling, vocab_size, generator)

    @torch.inference_mode()
    def propose_row(
        self, sequence: torch.Tensor, k: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> Draft:
        features = self.source.row_features(self.row)  # (L - 1, d): every position but the last
        cached = features.shape[0]
        if cached == 0 or k == 0:
            return Draft.empty(vocab_size, sequence.device)
        predicted = self.catch_up(features, sequence[0], cached)  # (1, d): f^ of the last token
        drafted, rows = [], []
        for i in range(k):
            q = probabilities(self.head.logits(predicted, vocab_size), sampling)  # (1, V)
            x = sample(q, generator)  # (1,)
            drafted.append(x)
            rows.append(q[0])
            if i + 1 < k:
                predicted = self.step(predicted, x, cached + i)
        return Draft(torch.cat(drafted), torch.stack(rows), forwards=k)

    def catch_up(self, features: torch.Tensor, tokens: torch.Tensor, cached: int) -> torch.Tensor:
        """Read (f_i, x_{i+1}) for the positions not read yet (at least the last one); f^ at the last (1, d)."""
        start = min(self.synced, cached - 1)
        surplus = self.cache.get_seq_length() - start
        if surplus > 0:
            self.cache.crop(-surplus)  # transformers' crop takes the number of positions to drop, negated
        positions = torch.arange(start, cached, device=features.device)[None]  # (1, n)
        predicted = self.head(features[None, start:cached], tokens[None, start + 1 : cached + 1], positions,
                              self.cache)
        self.synced = cached
        return predicted[:, -1]

    def step(self, predicted: torch.Tensor, token: torch.Tensor, position: int) -> torch.Tensor:
        """One drafting step on the head's own prediction: (f^, x) at `position` -> the next f^ (1, d)."""
        positions = torch.tensor([[position]], device=predicted.device)
        return self.head(predicted[:, None], token[None].to(predicted.device), positions, self.cache)[:, -1]

    def rollback_row(self, length: int) -> None:
        self.synced = min(self.synced, max(length - 1, 0))


def load_head_drafter(target: PreTrainedModel, checkpoint: str | None) -> HeadDrafter:
    """A HeadDrafter with the head trained for `target`, saved in the folder `checkpoint`."""
    if checkpoint is None:
        raise ValueError("no draft head is trained for this target: train one with `python -m "
                         "experiments.train_draft model=<pair>` (make train-draft), or name its folder in checkpoint=")
    return HeadDrafter(load_head(checkpoint, target))
