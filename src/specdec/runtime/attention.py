"""Grouped-query attention that reads each key/value head in place: the compiled runtime's attention on a CPU.

Models with fewer key/value heads than query heads (SmolLM2-135M: 9 query heads on 3; Gemma 3 270M: 4 on 1) share
each key/value head among a group of query heads. Transformers' SDPA path, given a 4D mask on a CPU, first copies
every key/value head once per query head of its group (`repeat_kv`). Over the compiled runtime's preallocated cache
(512 slots a row) those copies cost 2.4 MB a layer a pass, whatever the pass's width. SDPA's `enable_gqa` lets each
query head read its group's key/value head where it lies: the same sums, without the copies.

It also reads only the slots its mask covers: the compiled runtime's cache is a buffer of fixed capacity, and its
masks cover a window of the slots in use (rounded up to a multiple of WINDOW, one graph for every window), not the
whole buffer.

Inside a compiled pass (decode steps and verification passes), where the CPU has AVX-512, attention runs on kernels
of our own (kernels/window_attention.cpp). By default torch.ops.specdec.split_attention: each chunk of 256 slots of a
key/value head is one unit of work for the threads, its keys and values read once for all the head's query rows, and
each row's chunks are combined by their log-sum-exp (Flash-Decoding). Reading the cache is the cost after long
contexts: after 2048 tokens SmolLM2's 30 layers attend in about half SDPA's time (docs/performance.md, context
length).

Batch-invariant passes (`rowwise=True`): torch.ops.specdec.window_attention instead, whose order of summation does
not depend on the pass. SDPA's matrix products (and the chunked kernel) sum in an order that depends on the number
of query rows (in bfloat16, a position's logits then differ between a
one-token step and a verification pass, and greedy outputs part at near-ties). It sums each score over d in one
order, and a row's denominator and outputs over the slots it attends to, one after another in slot order, whatever
the pass's width; it reads each key/value head in place (a bfloat16 cache as bfloat16). With the linears on the
packed kernel (itself batch-invariant), a position's logits have the same bits in a step and in any pass up to the
packed rows, and wherever its attended slots lie: a tree's accepted path moved into place and a batch row's compacted
slots too (tests/test_invariance.py, tests/test_window_attention.py). Where the kernel cannot run (no AVX-512), sums
as torch operations that inductor fuses (rowwise_attention): slower after long contexts, and their vectorized
reductions group slots by position. Prompts (prefill, shared by every method) keep SDPA.

`use_grouped_attention(model)` switches a CPU model on SDPA to it (registered with transformers' attention and mask
interfaces as GROUPED); `as_shipped(model)` gives a block of code the model's own attention and linears back
(Hugging Face's generate, timed as the outside reference).
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED = "sdpa_grouped"  # the attention implementation's name in transformers' registries
KERNEL = Path(__file__).parent / "kernels" / "window_attention.cpp"


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
    if torch.compiler.is_compiling():  # a decode step or verification pass of the compiled runtime
        rowwise = getattr(module, "rowwise", False)
        if getattr(module, "window_kernel", False) and query.dtype in (torch.float32, torch.bfloat16):
            scale = query.shape[-1] ** -0.5 if scaling is None else scaling
            kernel = torch.ops.specdec.window_attention if rowwise else torch.ops.specdec.split_attention
            return kernel(query, key, value, attention_mask, scale), None
        if rowwise:
            return rowwise_attention(query, key, value, attention_mask, scaling), None
    key, value = key.to(query.dtype), value.to(query.dtype)  # a cache kept in another dtype (a draft's bfloat16)
    if not torch.compiler.is_compiling() and causal_prompt(attention_mask):  # a prompt on an empty cache: SDPA
        n = query.shape[2]  # skips the blocks above the diagonal
        key, value, attention_mask = key[:, :, :n], value[:, :, :n], None
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=query.shape[1] != key.shape[1],
                                         is_causal=attention_mask is None)
    return out.transpose(1, 2).contiguous(), None


def causal_prompt(mask: torch.Tensor) -> bool:
    """Whether a boolean mask (1, 1, n, K) of n > 1 queries lets query i see exactly slots 0..i: a prompt's pass on an
    empty cache (one row, full attention), which SDPA runs as is_causal without computing the blocks above the
    diagonal that the mask would hide (after 2k tokens half of the prefill's attention). Every layer of a pass gets
    the same mask: the answer is kept on it."""
    shape = mask.shape
    if mask.dtype != torch.bool or mask.dim() != 4 or shape[:2] != (1, 1) or not 1 < shape[2] <= shape[3]:
        return False
    if not hasattr(mask, "causal_prompt"):
        n = mask.shape[2]
        causal = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril_()
        mask.causal_prompt = torch.equal(mask[0, 0, :, :n], causal) and not mask[0, 0, :, n:].any()
    return mask.causal_prompt


@functools.cache
def window_kernel() -> bool:
    """Whether torch.ops.specdec.window_attention runs here: built (once per machine, into the specdec cache folder)
    and loaded; False where the CPU has no AVX-512 (kernels/window_attention.cpp)."""
    from .packed import build_library, unavailable_reason

    if unavailable_reason() is not None:
        return False
    build_library("specdec_window_attention", KERNEL, ("-mavx512bw", "-mavx512vl"))

    for op in ("specdec::window_attention", "specdec::split_attention"):

        @torch.library.register_fake(op)
        def _(query, key, value, mask, scale):  # shapes for the compiler: (B, n, H, d)
            return query.new_empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3])

    return True


def rowwise_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                      scaling: float | None) -> torch.Tensor:
    """softmax(q k^T * scaling + mask) v as sums in float32, no matrix product: query (B, H, n, d), key and value
    (B, H_kv, K, d) (the window), mask (B, 1 or H, n, K) boolean (True: attend) or additive; (B, n, H, d) in query's
    dtype. Under torch.compile the products and sums fuse into loops that sum each output in one order whatever n."""
    B, H, n, d = query.shape
    H_kv, K = key.shape[1], key.shape[2]
    q = query.float().view(B, H_kv, H // H_kv, n, 1, d)  # each group of query heads over its key/value head
    scores = (q * key.float()[:, :, None, None]).sum(-1) * (d**-0.5 if scaling is None else scaling)  # (B, H_kv, g, n, K)
    mask = mask.view(B, 1, 1, n, K) if mask.shape[1] == 1 else mask.view(B, H_kv, H // H_kv, n, K)
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    p = torch.softmax(scores, dim=-1)
    out = (p[..., None] * value.float()[:, :, None, None]).sum(-2)  # (B, H_kv, g, n, d)
    return out.view(B, H, n, d).to(query.dtype).transpose(1, 2).contiguous()


AttentionInterface.register(GROUPED, grouped_sdpa)
AttentionMaskInterface.register(GROUPED, sdpa_mask)  # the same boolean masks as SDPA's


def use_grouped_attention(model: PreTrainedModel, rowwise: bool = False) -> bool:
    """Switch a CPU model on SDPA to grouped_sdpa (rowwise: its compiled passes batch-invariant); whether it did."""
    if model.config._attn_implementation != "sdpa" or model.device.type != "cpu":
        return False
    model.set_attn_implementation(GROUPED)
    kernel = window_kernel()  # loaded now, not while a graph is traced
    for module in model.modules():
        if hasattr(module, "q_proj") or hasattr(module, "qkv_proj"):  # an attention layer (fused: runtime.fused):
            # grouped_sdpa reads the settings from it
            module.rowwise, module.window_kernel = rowwise, kernel
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
