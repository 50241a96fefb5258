"""Cache layers: every layer keeps every state in a buffer grown by doubling (sliding windows become masks), and the
attention types of a model with their windows.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


class GrowingLayer(DynamicLayer):
    """A cache layer that appends in place into a buffer grown by doubling.

    DynamicLayer concatenates, copying the whole cache at every forward (O(L) per step); here a step copies only
    its new tokens. keys/values are views of the buffer's first positions, so a crop is a slice.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_buffer = self.value_buffer = None  # (B, H, capacity, D)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if self.key_buffer is None or end > self.key_buffer.shape[-2]:
            self.key_buffer = grown(self.key_buffer, key_states, length, end)
            self.value_buffer = grown(self.value_buffer, value_states, length, end)
        self.key_buffer[..., length:end, :] = key_states
        self.value_buffer[..., length:end, :] = value_states
        self.keys = self.key_buffer[..., :end, :]  # (B, H, end, D) views
        self.values = self.value_buffer[..., :end, :]
        return self.keys, self.values

    def held(self) -> bool:
        return self.is_initialized and self.keys is not None

    @property
    def live(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, S, D) keys and values of the slots in use."""
        return self.keys, self.values

    def reserve(self, slots: int) -> None:
        """Room for `slots` slots (this buffer grows as it is written)."""

    def keep_slots(self, end: int) -> None:
        """Keep the first `end` slots (a crop)."""
        if self.held():
            self.keys, self.values = self.key_buffer[..., :end, :], self.value_buffer[..., :end, :]

    def compact(self, start: int, kept: torch.Tensor) -> None:
        """Keep slots [0, start) and start + kept, in that order; kept (j,) indexes the last slots."""
        if self.held():
            end = start + kept.numel()
            self.key_buffer[..., start:end, :] = self.key_buffer[..., start + kept, :]  # gather copies first
            self.value_buffer[..., start:end, :] = self.value_buffer[..., start + kept, :]
            self.keep_slots(end)

    def gather(self, index: torch.Tensor) -> None:
        """Keep the slots `index` (B, S') of every row, in that order."""
        if self.held():
            expanded = index[:, None, :, None].expand(-1, self.keys.shape[1], -1, self.keys.shape[-1])
            self.take(self.keys.gather(2, expanded), self.values.gather(2, expanded))

    def rows(self, index: torch.Tensor) -> None:
        """Keep the rows `index` (R,), in that order."""
        if self.held():
            self.take(self.keys.index_select(0, index), self.values.index_select(0, index))

    def take(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.key_buffer, self.value_buffer = keys, values
        self.keys, self.values = keys, values


def grown(buffer: torch.Tensor | None, new: torch.Tensor, length: int, needed: int) -> torch.Tensor:
    """A buffer with room for at least 2 * needed positions holding the first `length` of the old one."""
    shape = (*new.shape[:-2], max(2 * needed, 64), new.shape[-1])
    fresh = new.new_empty(shape)
    if buffer is not None and length:
        fresh[..., :length, :] = buffer[..., :length, :]
    return fresh


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
                f"cache layer {type(layer).__name__} is not supported: specdec caches models whose layers are "
                "full-attention or sliding-window dynamic layers (Llama, Gemma 1-3, Mistral, Mixtral, Qwen2, GPT-NeoX)"
            )
    return kinds


def full_cache(model: PreTrainedModel) -> DynamicCache:
    """A dynamic cache whose every layer keeps all states in a GrowingLayer (sliding windows are masks)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache


class SlotLayer(GrowingLayer):
    """A cache layer with a preallocated buffer written in place, for compiled forwards (the gpt-fast design).

    `filled` (a 0-d tensor, so that a compiled graph reads it instead of specializing on it) is the number of slots
    in use; `update` writes the new states at filled.. and returns the whole buffer (B, H, capacity, D), whose
    shape does not change as the cache fills. The caller's mask hides every slot at or past `filled`. Crops and
    compactions move states inside the buffer; only more rows, or more slots than the capacity, reallocate it.
    """

    def __init__(self, capacity: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.capacity, self.dtype = capacity, dtype  # the buffer's dtype (None: the states'); writes cast to it
        with torch.inference_mode(False):  # a normal tensor wherever the cache is made, so one graph's guards hold
            self.filled = torch.zeros((), dtype=torch.long)  # for every cache, and crops may run outside inference mode

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.key_buffer is None:
            self.allocate(key_states, value_states)
        return write_slots(self.key_buffer, self.value_buffer, self.filled, key_states, value_states)

    def allocate(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.key_buffer = keys.new_zeros((*keys.shape[:-2], self.capacity, keys.shape[-1]), dtype=self.dtype)
        self.value_buffer = values.new_zeros((*values.shape[:-2], self.capacity, values.shape[-1]), dtype=self.dtype)
        with torch.inference_mode(False):
            self.filled = self.filled.to(keys.device)

    def held(self) -> bool:
        return self.is_initialized and self.key_buffer is not None

    @property
    def live(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, filled, D) views of the slots in use."""
        end = int(self.filled)
        return self.key_buffer[..., :end, :], self.value_buffer[..., :end, :]

    def keep_slots(self, end: int) -> None:
        if self.held():
            self.filled.fill_(end)

    def reserve(self, slots: int) -> None:
        """Room for `slots` slots: a buffer at least twice as large when this one is too small (a new shape)."""
        if slots <= self.capacity:
            return
        self.capacity = max(2 * slots, 2 * self.capacity)
        if self.held():
            end = int(self.filled)
            keys, values = self.live
            self.allocate(keys, values)
            self.key_buffer[..., :end, :], self.value_buffer[..., :end, :] = keys, values

    def compact(self, start: int, kept: torch.Tensor) -> None:
        if self.held():
            end = start + kept.numel()
            self.key_buffer[..., start:end, :] = self.key_buffer[..., start + kept, :]  # gather copies first
            self.value_buffer[..., start:end, :] = self.value_buffer[..., start + kept, :]
            self.filled.fill_(end)

    def gather(self, index: torch.Tensor) -> None:
        if self.held():
            keys, values = self.live
            expanded = index[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[-1])
            self.take(keys.gather(2, expanded), values.gather(2, expanded))

    def rows(self, index: torch.Tensor) -> None:
        if self.held():
            keys, values = self.live
            self.take(keys.index_select(0, index), values.index_select(0, index))

    def take(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold these states (B, H, S, D) from slot 0 on (a new buffer when the row count changed)."""
        if keys.shape[0] != self.key_buffer.shape[0]:
            self.allocate(keys, values)
        end = keys.shape[-2]
        self.key_buffer[..., :end, :], self.value_buffer[..., :end, :] = keys, values
        self.filled.fill_(end)


def write_slots(key_buffer: torch.Tensor, value_buffer: torch.Tensor, filled: torch.Tensor, key_states: torch.Tensor,
                value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Write a pass's states (B, H, n, D) into slots filled.. of the buffers (B, H, capacity, D) in place (cast to
    the buffers' dtype) and count them; the whole buffers back (their shape does not change as the cache fills)."""
    index = filled + torch.arange(key_states.shape[-2], device=key_states.device)  # (n,)
    key_buffer.index_copy_(2, index, key_states.to(key_buffer.dtype))
    value_buffer.index_copy_(2, index, value_states.to(value_buffer.dtype))
    filled.add_(key_states.shape[-2])
    return key_buffer, value_buffer


def slot_cache(model: PreTrainedModel, capacity: int, dtype: torch.dtype | None = None) -> DynamicCache:
    """A cache whose every layer is a SlotLayer of `capacity` slots holding states in `dtype` (None: the model's
    own; sliding windows are masks)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [SlotLayer(capacity, dtype) for _ in cache.layers]
    return cache
