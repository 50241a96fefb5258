"""A causal language model together with its KV cache, holding a prefix of one sequence.

Both the target and a draft model go through this wrapper: `forward` appends tokens to the
cache and returns their logits, `crop` rolls the cache back after a rejection. Rolling back
sliding-window layers (Gemma2, Mistral) needs past recording, switched on after the prefill,
as transformers' own assisted generation does.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel


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
    """One sequence's KV cache for `model`; `length` tokens of the sequence are cached."""

    def __init__(self, model: PreTrainedModel, vocab_size: int | None = None, rollback: bool = True):
        self.model = model
        self.vocab_size = vocab_size or logits_width(model)
        self.rollback = rollback
        self.device = model.device
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Append tokens (1, n) to the cache; return their next-token logits (n, V), or (1, V) if last_only."""
        out = self.model(
            input_ids=tokens.to(self.device),
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        if self.rollback and self.length == 0:
            self.cache.activate_past_recording()  # after the prefill, as generation/utils.py does
        self.length += tokens.shape[-1]
        return out.logits[0, :, : self.vocab_size]  # (n, V)

    def crop(self, length: int) -> None:
        """Keep the first `length` cached tokens (never grows the cache)."""
        if length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        self.cache.crop(length - self.length)  # a negative count: tokens to drop
        self.length = length

    def advance(self, sequence: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Feed the part of sequence (1, L) the cache has not seen; return those positions' logits."""
        return self.forward(sequence[:, self.length :], last_only=last_only)
