"""A copy's c predicted from its linears before it is built (specdec.auto.linears): its linears timed block by
block as the copy makes them; a copy predicted to lose is never built; a weight's pages go back unchanged."""

import gc
import math
import mmap

import pytest
import torch

from specdec.auto.calibration import calibrate_in_turn
from specdec.auto.linears import (
    cost_bound,
    group_copies,
    linear_groups,
    linear_ratio,
    row_blocks,
    step_parts,
)
from specdec.draft.model import ModelDrafter
from specdec.draft.ngram import NGramDrafter
from specdec.runtime.cached import CachedLM
from specdec.runtime.copies import linear_copy
from specdec.runtime.machine import page_out
from specdec.runtime.packed import PackedLinear, unavailable_reason
from specdec.runtime.tiny import tiny_model

PROMPT = torch.tensor([[1, 2, 3, 4, 5, 1, 2, 3]])
FORMS = [("dynamic_int8", "float32", True), ("none", "bfloat16", True), ("int8", "float32", True),
         ("nf4", "float32", False)]  # bitsandbytes' fused 4-bit kernel needs larger layers than a tiny model's


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, scale=20.0, vocab_size=32)


def test_the_groups_hold_every_linear_once_by_role(target):
    groups = linear_groups(target)
    linears = [m for m in target.modules() if isinstance(m, torch.nn.Linear)]
    assert sorted(id(m) for members in groups.values() for _, m in members) == sorted(id(m) for m in linears)
    layers = target.config.num_hidden_layers
    assert len(groups["model.layers.*.self_attn.q_proj"]) == layers and len(groups["lm_head"]) == 1


@pytest.mark.parametrize("packed", [False, True])
def test_row_blocks_are_the_weight_and_their_copies_the_layer_copy(packed):
    """Blocks of outputs read out of a plain or a packed linear are its weight; their copies are layers of the whole
    layer's copy's kind, with its outputs (bit for bit in bfloat16; torch's int8 scales one per tensor, so a block's
    scale is its own: close)."""
    if packed and unavailable_reason() is not None:
        pytest.skip(str(unavailable_reason()))
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 5000, bias=True)
    source = PackedLinear(linear, (1, 16)) if packed else linear
    blocks = list(row_blocks(source))
    assert len(blocks) > 1 and torch.equal(torch.cat([b.weight for b in blocks]), linear.weight)
    assert torch.equal(torch.cat([b.bias for b in blocks]), linear.bias)
    x = torch.randn(1, 1, 64)
    for quantization, dtype in [("dynamic_int8", torch.float32), ("none", torch.bfloat16)]:
        copies = group_copies([("layer", source)], quantization, dtype, dtype, True)
        whole = linear_copy(linear, quantization, dtype, lambda t, to=dtype: t.detach().to(to))
        parts = torch.cat([c(x.to(dtype)) for c in copies], dim=-1)
        assert all(type(c) is type(whole) for c in copies)
        assert torch.equal(parts, whole(x.to(dtype))) if dtype == torch.bfloat16 else torch.allclose(
            parts, whole(x), atol=0.05 * whole(x).abs().max().item())


@pytest.mark.parametrize("quantization, dtype, fused_4bit", FORMS)
def test_the_ratio_and_the_parts_of_a_step_are_measured(target, quantization, dtype, fused_4bit):
    ratio = linear_ratio(target, quantization, dtype, fused_4bit=fused_4bit, repeats=1)
    step, other, linears = step_parts(target, PROMPT, eager_copy=True, repeats=1)
    assert math.isfinite(ratio) and ratio > 0 and step > 0 and linears > 0 and other >= 0
    c, r = cost_bound(target, quantization=quantization, dtype=dtype, fused_4bit=fused_4bit)(PROMPT)
    assert 0 < c and math.isfinite(r)


def test_a_form_that_is_not_a_copy_is_not_predicted(target):
    assert cost_bound(target, quantization="none", dtype="float32") is None  # the target itself
    fused = cost_bound(target, quantization="nf4")  # the fused 4-bit kernel does not take a tiny model's layers
    assert fused is not None and fused(PROMPT) is None  # no prediction: the copy is built and measured
    assert cost_bound(tiny_model("llama", dtype=torch.bfloat16), quantization="nf4") is None  # copies load from file


def test_an_eager_cached_lm_of_an_eager_model_is_the_same(target):
    eager, plain = CachedLM(target, eager=True), CachedLM(target)
    assert eager.compiled is None and torch.equal(eager.forward(PROMPT), plain.forward(PROMPT))


def test_a_copy_predicted_to_lose_is_never_built(target):
    """After the first candidate, a copy whose c (lowered by the margin) could not win even at alpha = 1 is entered
    with that c and its R, not built; one that could win is built and measured as before."""
    built = []

    def copy(name, seed):
        def build():
            built.append(name)
            return ModelDrafter(target if seed == 0 else tiny_model("llama", seed=seed, scale=20.0, vocab_size=32))
        return build

    # the first: the target itself (alpha 1, c about 1: about 1x); "slow" at c = 5 could reach 0.3x at most
    builders = {"first": copy("first", 0), "slow": copy("slow", 2), "fast": copy("fast", 3), "ngram": NGramDrafter}
    predictions = {"slow": lambda ids: (5.0, 2.5), "fast": lambda ids: (0.01, 0.02)}
    cal, kept = calibrate_in_turn(target, builders, PROMPT, keep=2, release=gc.collect, k=2, repeats=1,
                                  predictions=predictions, max_new_tokens=8)  # fmt: skip
    assert built == ["first", "fast"]  # "slow" never built; "fast" could win, so it is built and measured
    slow = next(r for r in cal.results if r.name == "slow")
    assert slow.linears == 2.5 and math.isnan(slow.alpha) and slow.c == pytest.approx(5.0)
    assert "slow" not in kept and "Not built" in cal.reason and "slow (its linears 2.50x" in cal.reason
    assert "slow (not built)" in cal.markdown()
    assert next(r for r in cal.results if r.name == "fast").linears is None


def test_paging_out_keeps_a_tensor_as_it_was(tmp_path):
    """Anonymous memory and a private mapping of a file alike: the values after page_out are the values before."""
    values = torch.randn(3 * mmap.PAGESIZE)
    before = values.clone()
    page_out(values)
    assert torch.equal(values, before)
    path = tmp_path / "weights.bin"
    before.numpy().tofile(path)
    mapped = torch.from_file(str(path), shared=False, size=before.numel(), dtype=torch.float32)
    assert torch.equal(mapped, before)
    page_out(mapped)
    assert torch.equal(mapped, before)
