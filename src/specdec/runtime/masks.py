"""Attention masks for passes that are not plain causal ones: token trees and batches of ragged rows.

Sliding-window layers (Gemma2, Mistral, Qwen2) get their own mask, which also hides keys a window or more
behind each query. Attention backends that take no 4D mask (FlashAttention, flex attention) are refused.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .cached import CachedLM

MASKED_BACKENDS = ("eager", "sdpa")  # attention implementations that take a user-supplied 4D mask


def check_tree_backend(model: PreTrainedModel) -> None:
    """Trees need an attention implementation that takes a 4D mask."""
    check_masked_backend(model, "token trees", "decode with a chain (speculative_generate)")


def check_masked_backend(model: PreTrainedModel, what: str, otherwise: str) -> None:
    """`what` passes 4D attention masks, which only MASKED_BACKENDS take; the error names the fix (or `otherwise`)."""
    backend = model.config._attn_implementation
    if backend not in MASKED_BACKENDS:
        raise ValueError(
            f"{what} need a 4D attention mask, which attn_implementation={backend!r} does not take: load "
            f"the model with attn_implementation='sdpa' (or 'eager'), or {otherwise}"
        )


def tree_mask(
    ancestors: torch.Tensor, depths: torch.Tensor, cached: int, tail: int, visible: int, window: int | None
) -> torch.Tensor:
    """Which keys each query may see: bool (tail + n, visible + tail + n), True = attend.

    Queries are the `tail` sequence tokens at positions cached.. and then the n nodes at the root's
    position plus their depth (n,); keys are the last `visible` cached tokens and then the queries.
    A window hides keys `window` or more positions behind the query, as a sliding-window layer does.
    """
    n, device = ancestors.shape[0], ancestors.device
    width = tail + n
    positions = torch.cat([torch.arange(cached, cached + tail, device=device), cached + tail - 1 + depths])
    new = torch.zeros(width, width, dtype=torch.bool, device=device)
    new[:tail, :tail] = torch.ones(tail, tail, dtype=torch.bool, device=device).tril()
    new[tail:, :tail] = True
    new[tail:, tail:] = ancestors
    seen = torch.cat([torch.ones(width, visible, dtype=torch.bool, device=device), new], dim=1)
    if window is not None:
        key_positions = torch.cat([torch.arange(cached - visible, cached, device=device), positions])
        seen &= (positions[:, None] - key_positions[None, :]) < window
    return seen


def layer_kinds(lm: CachedLM) -> dict[str, tuple[int, int | None]]:
    """Attention type -> (cached tokens its layers let the next pass see, sliding window or None)."""
    kinds: dict[str, tuple[int, int | None]] = {}
    for layer in lm.cache.layers:
        if getattr(layer, "is_sliding", False):
            held = layer.keys.shape[-2] if layer.is_initialized and layer.keys is not None else 0
            kind = ("sliding_attention", (min(held, layer.sliding_window - 1), layer.sliding_window))
        else:
            kind = ("full_attention", (lm.length, None))
        if kinds.setdefault(*kind) != kind[1]:
            raise ValueError(f"layers of one attention type disagree on their cache ({kinds[kind[0]]}, {kind[1]})")
    return kinds


def as_model_mask(seen: torch.Tensor, model: PreTrainedModel) -> torch.Tensor:
    """(q, kv) bool -> (1, 1, q, kv) (see model_mask)."""
    return model_mask(seen[None], model)


def model_mask(seen: torch.Tensor, model: PreTrainedModel) -> torch.Tensor:
    """(B, q, kv) bool -> (B, 1, q, kv): bool for SDPA, additive float (0 / dtype min) for eager attention."""
    if model.config._attn_implementation == "sdpa":
        return seen[:, None]
    mask = torch.zeros(seen.shape, dtype=model.dtype, device=seen.device)
    return mask.masked_fill_(~seen, torch.finfo(model.dtype).min)[:, None]
