"""The target's features: its last hidden state at every cached slot, kept next to its KV cache.

A trained draft head (specdec.draft.head) drafts from the features the target's own passes computed (EAGLE, Li et
al. 2024): the output of the target's last layer after its final norm, the vector its output layer turns into
logits. `FeatureStore` holds them slot by slot as a cache layer of one "head" with no values, so every slot
operation of the KV cache (crop, a tree's compaction, rows leaving) applies to the features unchanged, and a
slot's feature always belongs to the token whose keys and values sit in that slot.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from .layers import GrowingLayer


class FeatureStore(GrowingLayer):
    """(B, S, d) features, one per cache slot, in the slots' order."""

    def append(self, features: torch.Tensor) -> None:
        """The features (B, n, d) of a pass's n new slots."""
        self.update(features[:, None], features.new_empty(*features.shape[:2], 0)[:, None])

    def gather(self, index: torch.Tensor) -> None:
        """Keep the slots `index` (B, S') of every row, in that order (there are no values to move)."""
        if self.held():
            keys = self.keys.gather(2, index[:, None, :, None].expand(-1, 1, -1, self.keys.shape[-1]))
            self.take(keys, keys[..., :0])

    def rows_of(self, live: torch.Tensor, rows: list[int] | None = None) -> list[torch.Tensor]:
        """Rows' features at their live slots (live: (B, S) bool), in slot order: row b's (L_b, d), for every row or
        the rows listed."""
        rows = range(live.shape[0]) if rows is None else rows
        if not self.held():
            return [torch.zeros(0, 0) for _ in rows]
        features = self.keys[:, 0]  # (B, S, d)
        return [features[b, : live.shape[1]] if bool(live[b].all()) else features[b][live[b]] for b in rows]


def last_hidden_state(model: PreTrainedModel) -> torch.nn.Module:
    """The module whose output's first element is the last hidden state (after the final norm)."""
    return model.base_model


@contextmanager
def tapped(model: PreTrainedModel, store: FeatureStore | None) -> Iterator[None]:
    """During a forward of `model`, append the last hidden state of its new tokens to `store` (None: nothing)."""
    if store is None:
        yield
        return

    def keep(module, args, output) -> None:
        store.append(output[0])

    handle = last_hidden_state(model).register_forward_hook(keep)
    try:
        yield
    finally:
        handle.remove()
