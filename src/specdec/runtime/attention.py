"""Grouped-query attention that reads each key/value head in place: the compiled runtime's attention on a CPU.

Models with fewer key/value heads than query heads (SmolLM2-135M: 9 query heads on 3; Gemma 3 270M: 4 on 1) share
each key/value head among a group of query heads. Transformers' SDPA path, given a 4D mask on a CPU, first copies
every key/value head once per query head of its group (`repeat_kv`). Over the compiled runtime's preallocated cache
(512 slots a row) those copies cost 2.4 MB a layer a pass, whatever the pass's width. SDPA's `enable_gqa` lets each
query head read its group's key/value head where it lies: the same sums, without the copies.

It also reads only the slots its mask covers: the compiled runtime's cache is a buffer of fixed capacity, and its
masks cover a window of the slots in use (rounded up to a multiple of WINDOW, one graph for every window), not the
whole buffer.

`use_grouped_attention(model)` switches a CPU model on SDPA to it (registered with transformers' attention and mask
interfaces as GROUPED); `as_shipped(model)` gives a block of code the model's own attention and linears back
(Hugging Face's generate, timed as the outside reference).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED = "sdpa_grouped"  # the attention implementation's name in transformers' registries


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs) -> tuple[torch.Tensor, None]:
    """softmax(q k^T * scaling + mask) v for query (B, H, n, d) over the first K slots of key and value
    (B, H_kv, S, d), K the mask's last dimension, with each group of H / H_kv query heads reading its key/value head
    in place; (B, n, H, d) as transformers' SDPA returns it. Without a mask, or with arguments SDPA's grouped path
    does not take, transformers' own SDPA path."""
    if attention_mask is None or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    window = attention_mask.shape[-1]
    key, value = key[:, :, :window], value[:, :, :window]  # views: the slots past the window are never read
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED, grouped_sdpa)
AttentionMaskInterface.register(GROUPED, sdpa_mask)  # the same boolean masks as SDPA's


def use_grouped_attention(model: PreTrainedModel) -> bool:
    """Switch a CPU model on SDPA to grouped_sdpa; whether it did."""
    if model.config._attn_implementation != "sdpa" or model.device.type != "cpu":
        return False
    model.set_attn_implementation(GROUPED)
    return True


def shipped_attention(model: PreTrainedModel) -> None:
    """The model's attention back to transformers' SDPA, if use_grouped_attention switched it."""
    if model.config._attn_implementation == GROUPED:
        model.set_attn_implementation("sdpa")


@contextlib.contextmanager
def as_shipped(model: PreTrainedModel):
    """Within the block, the model runs transformers' own attention and linears (not the compiled runtime's grouped
    attention or packed linears); afterwards they are back."""
    from .packed import repack_linears, unpack_linears

    grouped = model.config._attn_implementation == GROUPED
    shipped_attention(model)
    packed = unpack_linears(model)
    try:
        yield model
    finally:
        repack_linears(packed)
        if grouped:
            model.set_attn_implementation(GROUPED)
