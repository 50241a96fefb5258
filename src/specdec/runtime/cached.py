"""A causal language model together with the KV caches of B sequences (B = 1: one sequence).

Both the target and a draft model go through this wrapper: `forward` appends tokens to every row and returns
their logits, `keep` keeps each row's accepted path of the last proposal, `select` lets finished rows leave.

Layout. Every row of the cache holds one sequence's keys and values in cache slots; each slot carries the position
of its token in that row's sequence, or DEAD (-1) for a slot that holds nothing (left padding of a shorter prompt,
a padded query of a ragged pass, a rejected draft token). A forward appends the same number of slots to every
row, so one model pass serves all rows however far each has got.

A batch of one crops. One row never holds a dead slot: a rejection crops it (a slice, no copy) and a token tree
keeps its accepted path by one gather per layer (compaction), so a single sequence passes no mask of its own and
its chains run with the model's own causal (and sliding-window) masks. Several rows accept different numbers of
tokens; cropping each to its own length would need a cache whose rows have their own lengths, or a copy of
every row after every round. So there a rejected token's slot is marked dead instead: the masks hide it from
every later query, and the slots are compacted (each row's live states moved to the right end, one gather per
layer) only when dead slots outnumber live ones, which keeps the copying amortized to O(1) per token.

Masks from positions (trees, and several rows). Every such forward gets one 4D mask per attention type, built
from the slots' positions: a query sees the live slots of its own row that are not ahead of it (for a token
tree: its ancestors), and a sliding-window layer additionally hides keys `window` or more positions behind the
query, exactly what that layer computes for one sequence alone. Position ids are the tokens' own positions, so
rotary embeddings see each row as if it were alone. For this every layer keeps every state (sliding-window
layers too): a window is applied by the mask, never by dropping states, so a dead slot inside the window cannot
push a live state out of it, and a crop never needs a state a window already dropped.
"""

from __future__ import annotations

import functools

import torch
from transformers import PreTrainedModel

from .compiled import CompiledForward, Rebucket, compiled_forward, runs_compiled
from .features import FeatureStore, tapped
from .layers import attention_windows, full_cache, slot_cache
from .masks import SDPA_BACKENDS, check_masked_backend, model_mask
from .passes import DEAD, causal_ancestry, left_padded, padded_pass

__all__ = ["DEAD", "CachedLM", "context_length", "left_padded", "logits_width"]


def logits_width(model: PreTrainedModel) -> int:
    """Number of logits the model emits per position (its lm_head rows, padding included)."""
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    return int(model.config.get_text_config().vocab_size)


def context_length(model: PreTrainedModel) -> int | None:
    """Longest sequence the model was built for, or None when the config does not say."""
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)


class CachedLM:
    """B sequences' KV caches for `model`: row b holds the first lengths()[b] tokens of sequence b.

    positions (B, S): the position in its row of the token each of the S slots holds, DEAD for none.
    Invariant: a row's live positions are exactly 0..lengths()[b] - 1 (a prefix of its sequence); one row has no
    dead slot.
    """

    def __init__(self, model: PreTrainedModel, vocab_size: int | None = None, eager: bool = False):
        self.model = model
        self.eager = eager  # passes on the eager runtime even where the model has a compiled one (a timing's baseline)
        self.vocab_size = vocab_size or logits_width(model)
        self.device = model.device
        self.windows = attention_windows(model)
        self.keeps_features = False  # keep_features(): hold the last hidden state of every slot too
        self.reset()

    def reset(self) -> None:
        self.compiled = compiled_forward(self.model) if runs_compiled(self.model) and not self.eager else None
        self.cache = (full_cache(self.model) if self.compiled is None
                      else slot_cache(self.model, self.compiled.capacity, self.compiled.cache_dtype))
        self.features = FeatureStore() if self.keeps_features else None
        self.positions = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.layout = 0  # changes whenever kept slots move (compaction, rows leaving): a reader must copy afresh

    def keep_features(self) -> None:
        """From the next sequences on, keep each slot's last hidden state (specdec.runtime.features)."""
        self.keeps_features = True
        if self.features is None and not self.slots:
            self.features = FeatureStore()

    def row_features(self, row: int | None = None) -> list[torch.Tensor] | torch.Tensor:
        """Each row's features (L_b, d) at its cached positions 0..L_b - 1, in order (after keep_features); or the
        one row's."""
        live = self.positions != DEAD
        return self.features.rows_of(live) if row is None else self.features.rows_of(live, [row])[0]

    @property
    def stores(self) -> list:
        """What each slot holds: the KV cache's layers, and the features when kept."""
        return self.cache.layers + ([self.features] if self.features is not None else [])

    @property
    def rows(self) -> int:
        return self.positions.shape[0]

    @property
    def slots(self) -> int:
        return self.positions.shape[1]

    @property
    def length(self) -> int:
        """Tokens cached in the one row of a batch of one (its slots)."""
        if self.rows > 1:
            raise ValueError(f"the cache holds {self.rows} rows: read lengths() for each row's")
        return self.slots

    @property
    def graphs_built(self) -> int:
        """Graphs the compiled runtime has traced in this process, for any model (this one, a draft model, a
        draft head): a pass during which this grew timed a compile, not a pass."""
        return CompiledForward.built

    def lengths(self) -> torch.Tensor:
        """(B,) tokens cached per row."""
        return (self.positions != DEAD).sum(dim=1)

    def masks(self, positions: torch.Tensor, ancestry: torch.Tensor, keys: int | None = None
              ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The 4D mask of every attention type for new tokens at `positions` (B, n) with `ancestry` (B, n, n),
        over `keys` slots (default: the cached ones and the new; more are hidden: a slot cache's free slots)."""
        check_masked_backend(self.model, "token trees and batches", "decode one sequence with chains")
        rows, width = positions.shape
        positions_of_keys = torch.cat([self.positions, positions], dim=1)  # (B, S + n)
        new = ancestry & (positions != DEAD)[:, None, :]
        seen = torch.cat([(self.positions != DEAD)[:, None, :].expand(rows, width, self.slots), new], dim=2)
        seen[:, torch.arange(width), self.slots + torch.arange(width)] = True  # every query sees itself: a dead
        # one (padding) then has one finite key, so no row of the softmax is empty; nothing live ever sees it
        if keys is not None:
            seen = torch.cat([seen, seen.new_zeros(rows, width, keys - seen.shape[2])], dim=2)
            positions_of_keys = torch.cat([positions_of_keys, positions_of_keys.new_full(
                (rows, keys - positions_of_keys.shape[1]), DEAD)], dim=1)
        masks = {}
        for kind, window in self.windows.items():
            visible = seen if window is None else seen & ((positions[:, :, None] - positions_of_keys[:, None, :]) < window)
            masks[kind] = model_mask(visible, self.model)
        return next(iter(masks.values())) if len(masks) == 1 else masks

    def chain_mask(self, width: int, keys: int) -> torch.Tensor | None:
        """masks() for one row's chain of `width` new tokens over `keys` slots, built in one comparison (a step's
        mask, on every draft step and target pass): query i sees slots 0..slots + i. None where masks() is needed: a
        sliding window, an additive mask (eager attention), several rows."""
        if self.rows != 1 or self.windows != {"full_attention": None} or (
                self.model.config._attn_implementation not in SDPA_BACKENDS):
            return None
        last = torch.arange(self.slots, self.slots + width, device=self.device)[:, None]  # (n, 1)
        return (torch.arange(keys, device=self.device) <= last)[None, None]  # (1, 1, n, keys)

    @torch.inference_mode()
    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor | None = None, ancestry: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Append tokens (B, n) to every row at positions (B, n) (DEAD: padding; default: each row's next n); their
        logits (B, n, V), or (B, 1, V) with last_only. ancestry (B, n, n): which new tokens each new token sees
        (default: a chain). One row's chain takes the model's own masks."""
        rows, width = tokens.shape
        if not self.rows:
            self.positions = torch.zeros(rows, 0, dtype=torch.long, device=self.device)
        if rows != self.rows:
            raise ValueError(f"the cache holds {self.rows} rows, the tokens have {rows}")
        if positions is None:
            positions = self.lengths()[:, None] + torch.arange(width, device=self.device)
        positions = positions.to(self.device)
        if self.compiled is not None:
            logits = self.slot_pass(tokens.to(self.device), positions, ancestry, last_only)
            return logits[:, -1:] if last_only else logits
        plain = rows == 1 and ancestry is None
        if not plain:
            ancestry = causal_ancestry(rows, width, self.device) if ancestry is None else ancestry.to(self.device)
        with tapped(self.model, self.features):
            out = self.model(
                input_ids=tokens.to(self.device),
                cache=self.cache,
                use_cache=True,
                attention_mask=None if plain else self.masks(positions, ancestry),
                position_ids=None if plain else positions.clamp_min(0),
                logits_to_keep=1 if last_only else 0,
            )
        self.positions = torch.cat([self.positions, positions], dim=1)
        return out.logits[..., : self.vocab_size]

    def slot_pass(self, tokens: torch.Tensor, positions: torch.Tensor, ancestry: torch.Tensor | None,
                  last_only: bool = False) -> torch.Tensor:  # fmt: skip
        """forward on the compiled runtime: the pass padded with dead queries to its bucket (or eager when wider than
        every bucket), over a window of the slot buffer; the padding's slots are cropped afterwards. last_only: an
        eager pass without padding (a prompt) runs the output layer over its last position alone (a 2k-token
        prompt's logits are 0.4 GB in float32 for a 49k vocabulary)."""
        rows, width = tokens.shape
        tokens = tokens.clone(memory_format=torch.contiguous_format)  # a graph guards on strides: a slice of a
        # longer sequence (stride L) would compile a graph per sequence length
        chain = ancestry is None
        ancestry = causal_ancestry(rows, width, self.device) if ancestry is None else ancestry.to(self.device)
        bucket = self.compiled.bucket(width)
        padded = bucket or width
        if padded > width:
            tokens, positions, ancestry = padded_pass(tokens, positions, ancestry, padded)
        for layer in self.cache.layers:
            layer.reserve(self.compiled.room(self.slots + padded))
        keys = self.compiled.window(self.slots + padded, self.cache.layers[0].capacity)
        mask = self.chain_mask(width, keys) if chain and padded == width else None
        mask = self.masks(positions, ancestry, keys=keys) if mask is None else mask
        held = all(layer.held() for layer in self.cache.layers)
        keep = 1 if last_only and padded == width else 0
        run = self.compiled if bucket is not None and held else functools.partial(self.compiled.run, keep=keep)
        try:
            logits, hidden = run(tokens, positions.clamp_min(0), mask, self.cache)
        except Rebucket:  # one graph for every width failed: the same pass again, padded to a bucket
            return self.slot_pass(tokens[:, :width], positions[:, :width], ancestry[:, :width, :width], last_only)
        for layer in self.cache.layers:
            layer.keep_slots(self.slots + width)
        if self.features is not None:
            self.features.append(hidden[:, :width])
        self.positions = torch.cat([self.positions, positions[:, :width]], dim=1)
        return logits[:, :width, : self.vocab_size]

    def advance(self, sequences: list[torch.Tensor], last_only: bool = False) -> torch.Tensor:
        """Feed each row the part of its sequence (1, L_b) it has not cached, left-padded; their logits."""
        lengths = self.lengths().tolist() if self.rows else [0] * len(sequences)
        tokens, positions = left_padded([s[0, n:] for s, n in zip(sequences, lengths)], lengths, self.device)
        return self.forward(tokens, positions, last_only=last_only)

    def prefill(self, prompts: list[torch.Tensor]) -> None:
        """Cache every token but the last of each prompt (1, L_b), left-padded to the longest."""
        self.reset()
        self.positions = torch.zeros(len(prompts), 0, dtype=torch.long, device=self.device)
        if max(p.shape[-1] for p in prompts) > 1:
            self.advance([p[:, :-1] for p in prompts], last_only=True)

    def keep(self, width: int, kept: list[list[int]]) -> None:
        """Of the last `width` slots of every row (a pass's proposal), keep kept[b] (indices into them, in path
        order) in row b. One row: a crop when they are its first slots (a chain), a compaction otherwise; several:
        the others die, and the slots are compacted when dead ones outnumber live ones."""
        start = self.slots - width
        if self.rows == 1:
            path = kept[0]
            if path == list(range(len(path))):
                self.crop(start + len(path))
            else:
                self.keep_path(start, torch.tensor(path, dtype=torch.long, device=self.device))
            return
        alive = torch.ones(self.rows, self.slots, dtype=torch.bool)
        alive[:, start:] = False
        for row, ids in enumerate(kept):
            alive[row, [start + i for i in ids]] = True
        self.positions = torch.where(alive.to(self.device), self.positions, DEAD)
        self.compact_if_sparse()

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens of the one row (never grows it)."""
        if length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        for layer in self.stores:
            layer.keep_slots(length)
        self.positions = self.positions[:, :length]

    @torch.inference_mode()
    def keep_path(self, start: int, kept: torch.Tensor) -> None:
        """Keep slots [0, start) and start + kept (j,) of the one row, in that order (a tree's accepted path)."""
        for layer in self.stores:
            layer.compact(start, kept)
        self.positions = torch.cat([self.positions[:, :start], self.positions[:, start + kept]], dim=1)

    def truncate(self, lengths: list[int]) -> None:
        """Keep the first lengths[b] tokens of row b (never grows a row): one row crops, several mark slots dead."""
        if self.rows == 1:
            self.crop(min(lengths[0], self.slots))
            return
        limit = torch.tensor(lengths, device=self.device)[:, None]
        self.positions = torch.where(self.positions >= limit, DEAD, self.positions)

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
        for layer in self.stores:
            layer.gather(index)
        self.positions = self.positions.gather(1, index)
        self.layout += 1

    @torch.inference_mode()
    def select(self, rows: list[int]) -> None:
        """Keep only these rows (finished ones leave the batch), in this order."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        for layer in self.stores:
            layer.rows(index)
        self.positions = self.positions.index_select(0, index)
        self.layout += 1
        if len(rows) == 1:
            self.compact()  # a batch of one holds no dead slot: it crops from now on
        else:
            self.compact_if_sparse()

    @torch.inference_mode()
    def copy_from(self, other: CachedLM, start: int) -> None:
        """Hold other's slots: keep our first `start` (copied from it before, same layout), append its slots from
        `start` on cast to our dtype (a slot cache casts them to its own), and take its positions (slots it marked
        dead since are dead here too)."""
        embedding = self.model.get_input_embeddings()
        dtype = getattr(embedding, "dtype", None) or embedding.weight.dtype  # (a PanelEmbedding's: its panels')
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.reserve(other.slots)
            mine.keep_slots(start)
            if other.slots > start:
                keys, values = theirs.live
                mine.update(keys[..., start:, :].to(dtype), values[..., start:, :].to(dtype))
        self.positions = other.positions.clone()
