"""The KV caches of B sequences of different lengths in one model cache, for batched decoding.

Layout. Every row of the cache holds one sequence's keys and values in cache slots; each slot carries
the position of its token in that row's sequence, or -1 for a slot that holds nothing (left padding of
a shorter prompt, a padded query of a ragged pass, a rejected draft token). A forward appends the same
number of slots to every row, so one model pass serves all rows however far each has got.

Why slots marked dead instead of crops. Rows accept different numbers of draft tokens, so after a round
the rows' lengths differ. Cropping each row to its own length would need a cache whose rows have their
own lengths, or a copy that moves every row's states into place after every round (O(L) per row and
round). Instead a rejected token's slot is marked dead (position -1): the masks hide it from every later
query, it costs nothing to drop, and the slots are compacted (the live states of each row moved to the
right end, one gather per layer) only when dead slots outnumber live ones, which keeps the copying
amortized to O(1) per token.

Masks from positions. Every forward gets one 4D mask per attention type, built from the slots'
positions rather than their order: a query sees the live slots of its own row that are not ahead of it
(for a token tree: its ancestors), and a sliding-window layer additionally hides keys `window` or more
positions behind the query, exactly what that layer computes for one sequence alone. Position ids are
the tokens' own positions, so rotary embeddings see each row as if it were alone. For this the cache
keeps every state in every layer (sliding-window layers included, as full layers do): the window is
applied by the mask, never by dropping states, so a dead slot inside the window cannot push a live
state out of it. Memory therefore grows as for full attention.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from .cached import GrowingLayer, logits_width
from .masks import check_masked_backend, model_mask

DEAD = -1  # the position of a slot that holds no token of its row


def attention_windows(model: PreTrainedModel) -> dict[str, int | None]:
    """Attention type -> its sliding window (None: full attention), as the model's own cache would build it."""
    kinds: dict[str, int | None] = {}
    for layer in DynamicCache(config=model.config).layers:
        if type(layer) is DynamicSlidingWindowLayer:
            kinds["sliding_attention"] = layer.sliding_window
        elif type(layer) is DynamicLayer:
            kinds["full_attention"] = None
        else:
            raise NotImplementedError(
                f"cache layer {type(layer).__name__} cannot be batched here; batched decoding supports "
                "full-attention and sliding-window dynamic caches: decode this model one sequence at a time"
            )
    return kinds


def full_cache(model: PreTrainedModel) -> DynamicCache:
    """A dynamic cache whose every layer keeps all states in a GrowingLayer (sliding windows are masks)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache


def causal_ancestry(rows: int, width: int, device: torch.device) -> torch.Tensor:
    """(B, n, n) bool: each new token sees the new tokens before it and itself (a chain in every row)."""
    return torch.ones(width, width, dtype=torch.bool, device=device).tril().expand(rows, width, width)


class BatchedLM:
    """B sequences' KV caches for `model`: row b holds the first lengths()[b] tokens of sequence b.

    positions (B, S): the position in its row of the token each of the S slots holds, DEAD for none.
    Invariant: a row's live positions are exactly 0..lengths()[b] - 1 (a prefix of its sequence).
    """

    def __init__(self, model: PreTrainedModel, vocab_size: int | None = None):
        check_masked_backend(model, "batches", "decode one sequence at a time")
        self.model = model
        self.vocab_size = vocab_size or logits_width(model)
        self.device = model.device
        self.windows = attention_windows(model)
        self.reset()

    def reset(self) -> None:
        self.cache = full_cache(self.model)
        self.positions = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.layout = 0  # changes whenever slots move (compaction, rows leaving): a reader must copy afresh

    @property
    def rows(self) -> int:
        return self.positions.shape[0]

    @property
    def slots(self) -> int:
        return self.positions.shape[1]

    def lengths(self) -> torch.Tensor:
        """(B,) tokens cached per row."""
        return (self.positions != DEAD).sum(dim=1)

    def masks(self, positions: torch.Tensor, ancestry: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """The 4D mask of every attention type for new tokens at `positions` (B, n) with `ancestry` (B, n, n)."""
        rows, width = positions.shape
        keys = torch.cat([self.positions, positions], dim=1)  # (B, S + n)
        live = keys != DEAD
        new = ancestry & (positions != DEAD)[:, None, :]
        seen = torch.cat([live[:, None, : self.slots].expand(rows, width, self.slots), new], dim=2)
        seen[:, torch.arange(width), self.slots + torch.arange(width)] = True  # every query sees itself: a dead
        # one (padding) then has one finite key, so no row of the softmax is empty; nothing live ever sees it
        masks = {}
        for kind, window in self.windows.items():
            visible = seen if window is None else seen & ((positions[:, :, None] - keys[:, None, :]) < window)
            masks[kind] = model_mask(visible, self.model)
        return next(iter(masks.values())) if len(masks) == 1 else masks

    @torch.inference_mode()
    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, ancestry: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Append tokens (B, n) at positions (B, n) (DEAD: padding) to every row; their logits (B, n, V), or
        (B, 1, V) with last_only. ancestry (B, n, n): which new tokens each new token sees (default: a chain)."""
        rows, width = tokens.shape
        if self.slots == 0 and not self.rows:
            self.positions = torch.zeros(rows, 0, dtype=torch.long, device=self.device)
        if rows != self.rows:
            raise ValueError(f"the cache holds {self.rows} rows, the tokens have {rows}")
        positions = positions.to(self.device)
        ancestry = causal_ancestry(rows, width, self.device) if ancestry is None else ancestry.to(self.device)
        out = self.model(
            input_ids=tokens.to(self.device),
            cache=self.cache,
            use_cache=True,
            attention_mask=self.masks(positions, ancestry),
            position_ids=positions.clamp_min(0),
            logits_to_keep=1 if last_only else 0,
        )
        self.positions = torch.cat([self.positions, positions], dim=1)
        return out.logits[..., : self.vocab_size]

    def prefill(self, prompts: list[torch.Tensor]) -> None:
        """Cache every token but the last of each prompt (1, L_b), left-padded to the longest."""
        self.reset()
        tokens, positions = left_padded([p[0, :-1] for p in prompts], [0] * len(prompts), self.device)
        self.positions = torch.zeros(len(prompts), 0, dtype=torch.long, device=self.device)
        if tokens.shape[1]:
            self.forward(tokens, positions, last_only=True)

    def keep(self, width: int, kept: list[list[int]]) -> None:
        """Of the last `width` slots of every row (a pass's proposal), keep kept[b] (indices into them, in
        path order) in row b; the others die. Compacts when dead slots outnumber live ones."""
        alive = torch.ones(self.rows, self.slots, dtype=torch.bool)
        alive[:, self.slots - width :] = False
        for row, ids in enumerate(kept):
            alive[row, [self.slots - width + i for i in ids]] = True
        self.positions = torch.where(alive.to(self.device), self.positions, DEAD)
        self.compact_if_sparse()

    def truncate(self, lengths: torch.Tensor) -> None:
        """Keep the first lengths[b] tokens of row b (never grows a row)."""
        self.positions = torch.where(self.positions >= lengths.to(self.device)[:, None], DEAD, self.positions)

    def compact_if_sparse(self) -> None:
        live = int(self.lengths().max()) if self.rows else 0
        if self.slots > 2 * live + 32:
            self.compact()

    @torch.inference_mode()
    def compact(self) -> None:
        """Move every row's live slots to the right end, in slot order; S becomes the longest row's length."""
        live = self.positions != DEAD
        keep = int(live.sum(dim=1).max()) if self.rows else 0
        order = (live.long() * torch.arange(1, self.slots + 1, device=self.device)).argsort(dim=1, stable=True)
        index = order[:, self.slots - keep :]  # (B, keep): dead slots first, then the live ones in order
        for layer in self.cache.layers:
            gather_slots(layer, index)
        self.positions = self.positions.gather(1, index)
        self.layout += 1

    @torch.inference_mode()
    def select(self, rows: list[int]) -> None:
        """Keep only these rows (finished ones leave the batch), in this order."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            if layer.is_initialized and layer.keys is not None:
                layer.key_buffer = layer.keys.index_select(0, index)
                layer.value_buffer = layer.values.index_select(0, index)
                layer.keys, layer.values = layer.key_buffer, layer.value_buffer
        self.positions = self.positions.index_select(0, index)
        self.layout += 1
        self.compact_if_sparse()

    @torch.inference_mode()
    def copy_from(self, other: BatchedLM, start: int) -> None:
        """Hold other's slots: keep our first `start` (copied from it before, same layout), append its slots
        from `start` on cast to our dtype, and take its positions (slots it marked dead since are dead here too)."""
        dtype = self.model.get_input_embeddings().weight.dtype
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            if mine.is_initialized and mine.keys is not None:
                mine.keys, mine.values = mine.key_buffer[..., :start, :], mine.value_buffer[..., :start, :]
            if other.slots > start:
                mine.update(theirs.keys[..., start:, :].to(dtype), theirs.values[..., start:, :].to(dtype))
        self.positions = other.positions.clone()


def gather_slots(layer: GrowingLayer, index: torch.Tensor) -> None:
    """Keep the slots `index` (B, S') of every row of one layer, in that order."""
    if not layer.is_initialized or layer.keys is None:
        return
    heads, dim = layer.keys.shape[1], layer.keys.shape[-1]
    expanded = index[:, None, :, None].expand(-1, heads, -1, dim)
    layer.key_buffer = layer.keys.gather(2, expanded)
    layer.value_buffer = layer.values.gather(2, expanded)
    layer.keys, layer.values = layer.key_buffer, layer.value_buffer


def left_padded(rows: list[torch.Tensor], starts: list[int], device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows (n_b,) left-padded into (B, n) with their positions starts[b].. (DEAD for padding)."""
    width = max((r.numel() for r in rows), default=0)
    tokens = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    positions = torch.full((len(rows), width), DEAD, dtype=torch.long, device=device)
    for b, (row, start) in enumerate(zip(rows, starts)):
        n = row.numel()
        if n:
            tokens[b, width - n :] = row.to(device)
            positions[b, width - n :] = torch.arange(start, start + n, device=device)
    return tokens, positions
