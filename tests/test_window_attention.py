"""The window attention kernel (kernels/window_attention.cpp) of batch-invariant compiled passes: softmax attention
of a few query rows over a window of the cache, next to SDPA, and a row's bits independent of the other rows and of
masked slots past its own (a wider pass's window)."""

import pytest
import torch
import torch.nn.functional as F

from specdec.runtime.attention import window_kernel
from specdec.runtime.packed import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
SHAPES = [(1, 9, 3, 1, 64, 64), (1, 9, 3, 5, 64, 600), (2, 4, 1, 3, 256, 300), (1, 4, 2, 16, 8, 40)]  # B H H_kv n d K


def window(shape, dtype, seed=0):
    """Query rows, a window of K slots of a longer cache buffer (a view, as the compiled runtime passes it), a mask."""
    B, H, H_kv, n, d, K = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, d, generator=g).to(dtype)
    buffer = torch.randn(2, B, H_kv, K + 80, d, generator=g).to(dtype)
    buffer[..., K:, :] = float("nan")  # slots past the window: never read
    mask = torch.rand(B, 1, n, K, generator=g) > 0.3
    mask[..., 0] = True
    return q, buffer, mask


# several chunks of the chunked kernel's 256 slots; d = 8, 48, 64, 128, 256; 1 to 16 rows
SHAPES = [*SHAPES, (1, 9, 3, 1, 64, 2100), (2, 8, 2, 3, 128, 520), (1, 6, 2, 2, 48, 300)]


@pytest.mark.parametrize("kernel", ["window_attention", "split_attention"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_attention_kernels_are_sdpa_and_masked_slots_add_nothing(shape, dtype, kernel):
    """Either kernel: SDPA's result; a boolean and an additive mask give the same bits, and so does a wider window
    (a wider pass's: its masked slots, even NaN, add nothing); a row that attends to nothing gets zeros. The window
    kernel (batch-invariant passes): one row alone (a step) has the bits it has among the others (a pass)."""
    assert window_kernel()
    op = getattr(torch.ops.specdec, kernel)
    q, buffer, mask = window(shape, dtype)
    K = mask.shape[-1]
    k, v = buffer[0, :, :, :K], buffer[1, :, :, :K]
    out = op(q, k, v, mask, 0.125)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=0.125,
                                              enable_gqa=True).transpose(1, 2)  # fmt: skip
    assert out.dtype == dtype and out.shape == expected.shape
    torch.testing.assert_close(out.float(), expected, atol=2e-6 if dtype == torch.float32 else 1e-2, rtol=1e-2)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert torch.equal(op(q, k, v, additive, 0.125), out)
    wider = torch.cat([mask, torch.zeros(*mask.shape[:-1], 80, dtype=torch.bool)], -1)  # NaN slots, past a chunk too
    assert torch.equal(op(q, buffer[0, :, :, : K + 80], buffer[1, :, :, : K + 80], wider, 0.125), out)
    if kernel == "window_attention":
        for i in range(q.shape[2]):
            assert torch.equal(op(q[:, :, i : i + 1], k, v, mask[:, :, i : i + 1], 0.125)[:, 0], out[:, i])
    mask[..., 0, :] = False  # the first row attends to nothing
    assert torch.equal(op(q, k, v, mask, 0.125)[:, 0], torch.zeros_like(out[:, 0]))


@pytest.mark.parametrize("kernel", ["window_attention", "split_attention"])
@pytest.mark.parametrize("shape", SHAPES[1::2], ids=lambda s: "x".join(map(str, s)))
def test_a_float32_query_over_a_bfloat16_cache_reads_it_widened_exactly(shape, kernel):
    """A draft's cache kept in bfloat16 (specdec.auto.runtime.draft_cache_dtype): a float32 query over bfloat16 keys
    and values has the bits of the same query over those keys and values widened to float32, in float32."""
    op = getattr(torch.ops.specdec, kernel)
    q, buffer, mask = window(shape, torch.float32)
    K = mask.shape[-1]
    k, v = buffer[0, :, :, :K].bfloat16(), buffer[1, :, :, :K].bfloat16()
    out = op(q, k, v, mask, 0.125)
    assert out.dtype == torch.float32
    assert torch.equal(out, op(q, k.float(), v.float(), mask, 0.125))
    with pytest.raises(RuntimeError, match="float32 query"):
        op(q.bfloat16(), k.float(), v.float(), mask, 0.125)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_where_its_attended_slots_lie(dtype):
    """The same attended keys and values, in the same order, at other slots among masked ones (as a tree's accepted
    path before it is moved into place, or a batch row after compaction): the same bits."""
    op = torch.ops.specdec.window_attention
    q, buffer, mask = window((1, 9, 3, 2, 64, 700), dtype, seed=1)
    mask[:] = True
    k, v = buffer[0], buffer[1]
    out = op(q, k[:, :, :700], v[:, :, :700], mask, 0.125)
    spread = torch.randperm(1500, generator=torch.Generator().manual_seed(2))[:700].sort().values  # 700 of 1,500 slots
    k2 = torch.full((1, 3, 1500, 64), float("nan"), dtype=dtype)
    v2 = torch.full((1, 3, 1500, 64), float("nan"), dtype=dtype)
    k2[:, :, spread], v2[:, :, spread] = k[:, :, :700], v[:, :, :700]
    mask2 = torch.zeros(1, 1, 2, 1500, dtype=torch.bool)
    mask2[..., spread] = True
    assert torch.equal(op(q, k2, v2, mask2, 0.125), out)

