"""Attention masks for passes that are not plain causal ones (token trees, batches of ragged rows): the backends
that take them, and their form (specdec.runtime.cached builds them from slot positions).

Sliding-window layers (Gemma2, Mistral, Qwen2) get their own mask, which also hides keys a window or more
behind each query. Attention backends that take no 4D mask (FlashAttention, flex attention) are refused.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .attention import GROUPED

SDPA_BACKENDS = ("sdpa", GROUPED)  # take boolean 4D masks (GROUPED: the compiled runtime's, specdec.runtime.attention)
MASKED_BACKENDS = ("eager", *SDPA_BACKENDS)  # attention implementations that take a user-supplied 4D mask


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


def model_mask(seen: torch.Tensor, model: PreTrainedModel) -> torch.Tensor:
    """(B, q, kv) bool -> (B, 1, q, kv): bool for SDPA, additive float (0 / dtype min) for eager attention."""
    if model.config._attn_implementation in SDPA_BACKENDS:
        return seen[:, None]
    mask = torch.zeros(seen.shape, dtype=model.dtype, device=seen.device)
    return mask.masked_fill_(~seen, torch.finfo(model.dtype).min)[:, None]
