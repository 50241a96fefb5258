"""A causal language model together with its KV cache, holding a prefix of one sequence.

Both the target and a draft model go through this wrapper: `forward` appends tokens to the
cache and returns their logits, `crop` rolls the cache back after a rejection, and `compact`
keeps one root-to-leaf path of a token tree that was appended by the last forward. Rolling back
sliding-window layers (Gemma2, Mistral) needs past recording, switched on after the prefill,
as transformers' own assisted generation does.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


def logits_width(model: PreTrainedModel) -> int:
    """Number of logits the model emits per position (its lm_head rows, padding included)."""
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    return int(model.config.get_text_config().vocab_size)


def context_length(model: PreTrainedModel) -> int | None:
    """Longest sequence the model was built for, or None when the config does not say."""
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer that appends in place into a buffer grown by doubling.

    DynamicLayer concatenates, copying the whole cache at every forward (O(L) per step); here a step
    copies only its new tokens. keys/values are views of the buffer's first `length` positions, so
    DynamicLayer's crop (a slice) and sequence length still apply unchanged.
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

    def compact(self, start: int, kept: torch.Tensor) -> None:
        """Keep positions [0, start) and start + kept, in that order; kept (j,) indexes the last positions."""
        end = start + kept.numel()
        if self.is_initialized and self.key_buffer is not None:
            self.key_buffer[..., start:end, :] = self.key_buffer[..., start + kept, :]  # gather copies first
            self.value_buffer[..., start:end, :] = self.value_buffer[..., start + kept, :]
            self.keys = self.key_buffer[..., :end, :]
            self.values = self.value_buffer[..., :end, :]


def grown(buffer: torch.Tensor | None, new: torch.Tensor, length: int, needed: int) -> torch.Tensor:
    """A buffer with room for at least 2 * needed positions holding the first `length` of the old one."""
    shape = (*new.shape[:-2], max(2 * needed, 64), new.shape[-1])
    fresh = new.new_empty(shape)
    if buffer is not None and length:
        fresh[..., :length, :] = buffer[..., :length, :]
    return fresh


def kv_cache(model: PreTrainedModel) -> DynamicCache:
    """The model's dynamic cache with every plain full-attention layer made a GrowingLayer."""
    cache = DynamicCache(config=model.config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


class CachedLM:
    """One sequence's KV cache for `model`; `length` tokens of the sequence are cached."""

    def __init__(self, model: PreTrainedModel, vocab_size: int | None = None, rollback: bool = True):
        self.model = model
        self.vocab_size = vocab_size or logits_width(model)
        self.rollback = rollback
        self.device = model.device
        self.reset()

    def reset(self) -> None:
        self.cache = kv_cache(self.model)
        self.length = 0
        self.recording = False

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        last_only: bool = False,
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append tokens (1, n) to the cache; return their next-token logits (n, V), or (1, V) if last_only.

        attention_mask and position_ids default to the causal ones; a token tree passes its own 4D mask
        (1, 1, n, kv) (or one per attention type) and position ids (1, n).

        A first forward with last_only is the prefill, which is never cropped; every later forward may be,
        so past recording is switched on before it (a verification pass longer than a sliding window
        would otherwise drop states a crop needs, e.g. after a one-token prompt).
        """
        if self.rollback and not self.recording and not (self.length == 0 and last_only):
            self.cache.activate_past_recording()
            self.recording = True
        out = self.model(
            input_ids=tokens.to(self.device),
            cache=self.cache,
            use_cache=True,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=1 if last_only else 0,
        )
        self.length += tokens.shape[-1]
        return out.logits[0, :, : self.vocab_size]  # (n, V)

    def prefill(self, sequence: torch.Tensor) -> None:
        """Cache every token of sequence (1, L) but the last, whose logits the first round computes."""
        if sequence.shape[-1] > 1:
            self.forward(sequence[:, :-1], last_only=True)

    def crop(self, length: int, keep_past: bool = False) -> None:
        """Keep the first `length` cached tokens (never grows the cache).

        A sliding-window layer's crop trims its states back to the window, so a second crop further back
        without a forward between fails; keep_past keeps them (memory then grows as a full layer's does).
        """
        if length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        if length == self.length and not keep_past:
            return  # nothing to drop (and a sliding-window layer past its window without recording, e.g. a
            # draft that has only prefilled a long prompt, refuses even an empty crop)
        if keep_past:
            self.compact(self.length - length, torch.zeros(0, dtype=torch.long), keep_past=True)
            return
        self.cache.crop(length - self.length)  # a negative count: tokens to drop
        self.length = length

    @torch.inference_mode()
    def compact(self, width: int, kept: torch.Tensor, keep_past: bool = False) -> None:
        """Of the last `width` cached tokens (a tree appended by the last forward), keep only `kept` (j,).

        kept holds indices into those `width` tokens, in the order they are to be cached (a root-to-leaf
        path). Every layer keeps its earlier states and gathers the kept ones on the sequence axis; a
        sliding-window layer then trims back to its window as its own crop does, unless keep_past.
        """
        if width > self.length:
            raise ValueError(f"cannot compact {width} tokens of a cache holding {self.length}")
        kept = kept.to(self.device, torch.long)
        for layer in self.cache.layers:
            compact_layer(layer, width, kept, trim=not keep_past)
        self.length += kept.numel() - width

    def keep(self, width: int, kept: list[int]) -> None:
        """Of the last `width` cached tokens (a proposal the last forward appended), keep `kept` (indices into
        them, in path order): a crop when they are its first tokens (a chain), a compaction otherwise."""
        if kept == list(range(len(kept))):
            self.crop(self.length - width + len(kept))
        else:
            self.compact(width, torch.tensor(kept, dtype=torch.long))

    def advance(self, sequence: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Feed the part of sequence (1, L) the cache has not seen; return those positions' logits."""
        return self.forward(sequence[:, self.length :], last_only=last_only)


def compact_layer(layer: DynamicLayer, width: int, kept: torch.Tensor, trim: bool = True) -> None:
    """Drop the last `width` positions of one cache layer except `kept` (indices into them); `trim` cuts a
    sliding-window layer back to the states its next forward can see."""
    if not layer.is_initialized or layer.keys is None or layer.keys.numel() == 0:
        return  # a layer that shares another layer's states
    if isinstance(layer, GrowingLayer):
        layer.compact(layer.get_seq_length() - width, kept)
        return
    if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
        raise NotImplementedError(
            f"cache layer {type(layer).__name__} cannot be compacted; token trees support full-attention and "
            "sliding-window dynamic caches: use a chain (speculative_generate) with this model"
        )
    start = layer.keys.shape[-2] - width
    if start < 0:
        raise RuntimeError(f"a {type(layer).__name__} holds {layer.keys.shape[-2]} states, fewer than the {width} "
                           "to compact: its past was trimmed (crop with keep_past=True between branches)")
    layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys[..., start + kept, :]], dim=-2)
    layer.values = torch.cat([layer.values[..., :start, :], layer.values[..., start + kept, :]], dim=-2)
    if isinstance(layer, DynamicSlidingWindowLayer):
        layer.cumulative_length += kept.numel() - width
        if trim and layer.cumulative_length >= layer.sliding_window:  # what the next forward sees, as crop does
            layer.keys = layer.keys[..., -layer.sliding_window + 1 :, :]
            layer.values = layer.values[..., -layer.sliding_window + 1 :, :]
