"""A token tree's pass: masks from positions, and the cache kept to one path equals a recomputation."""

import pytest
import torch
from test_tree import hand_tree

from specdec.draft.tree import ancestry
from specdec.runtime.cached import CachedLM
from specdec.runtime.tiny import tiny_model


def test_mask_on_a_hand_built_tree():
    """Root children 0 and 1; node 2 under 0; node 3 under 2; three cached tokens, then the root."""
    tree = hand_tree([4, 5, 6, 7], [-1, -1, 0, 2])
    assert tree.depths() == [1, 1, 2, 3]
    lm = CachedLM(tiny_model("llama"))
    lm.forward(torch.tensor([[1, 2, 3]]))
    positions = torch.tensor([[3, 4, 4, 5, 6]])  # the root, then each node at the root's position + its depth
    seen = lm.masks(positions, node_ancestry(tree))[0, 0]
    expected = torch.tensor(
        [  # keys: 3 cached | root | nodes 0 1 2 3
            [1, 1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 1, 0, 0],
            [1, 1, 1, 1, 1, 0, 1, 0],
            [1, 1, 1, 1, 1, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(seen, expected)
    # a sliding window of 6 (mistral): seven cached tokens at 0..6, the root at 7, nodes at 8, 8, 9, 10
    lm = CachedLM(tiny_model("mistral"))
    lm.forward(torch.arange(1, 8)[None])
    windowed = lm.masks(positions + 4, node_ancestry(tree))[0, 0]
    key_positions = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 9, 10])
    wide = torch.cat([torch.ones(5, 4, dtype=torch.bool), expected], dim=1)
    assert torch.equal(windowed, wide & ((positions[0] + 4)[:, None] - key_positions[None, :] < 6))
    assert not windowed[4, :5].any() and windowed[4, 5:8].all()  # node 3 (position 10) sees 5..10 on its path


@pytest.mark.parametrize("arch,chain", [("llama", True), ("mistral", False), ("gemma3", False)])
def test_a_chains_mask_in_one_comparison_is_the_masks_built_from_positions(arch, chain):
    """chain_mask (one row's chain: every step and pass) is masks()' answer, over a window wider than the slots in
    use; a model with a sliding window or eager attention's additive mask takes masks() (None)."""
    from specdec.runtime.passes import causal_ancestry

    lm = CachedLM(tiny_model(arch))
    lm.forward(torch.tensor([[1, 2, 3]]))
    for width, keys in [(1, 4), (3, 8), (5, 64)]:
        fast = lm.chain_mask(width, keys)
        assert (fast is not None) == chain
        if chain:
            positions = torch.arange(3, 3 + width)[None]
            assert torch.equal(fast, lm.masks(positions, causal_ancestry(1, width, lm.device), keys=keys))


def node_ancestry(tree):
    """(1, 1 + n, 1 + n): the root, then the tree's nodes, as the target's pass sees them."""
    return ancestry([-1] + [p + 1 for p in tree.parents.tolist()])[None]


def tree_pass(lm, sequence, tree):
    """One pass over the uncached tail of sequence (1, L) and the tree's nodes, each node at the tail's last
    position plus its depth and seeing its ancestors: the logits (tail + n, V)."""
    cached, m = lm.length, sequence.shape[-1] - lm.length
    parents = list(range(-1, m - 1)) + [p + m if p >= 0 else m - 1 for p in tree.parents.tolist()]
    positions = list(range(cached, cached + m)) + [cached + m - 1 + d for d in tree.depths()]
    tokens = torch.cat([sequence[:, cached:], tree.tokens[None]], dim=-1)
    return lm.forward(tokens, torch.tensor([positions]), ancestry(parents)[None])[0]


COMPACT_ARCHS = ["llama", "gemma2", "mistral", "qwen2", "gpt_neox"]


SEQUENCE = torch.tensor([[0, 5, 3, 7, 5, 3, 9, 2, 4, 1]])  # longer than the sliding window (6)


def scratch_logits(model, ids):
    with torch.inference_mode():
        return model(ids).logits[0]  # (L, V)


@pytest.mark.parametrize("arch", COMPACT_ARCHS)
def test_tree_pass_and_compaction_equal_recomputation(arch):
    model = tiny_model(arch, seed=0, scale=4.0)
    lm = CachedLM(model)
    lm.forward(SEQUENCE[:, :7], last_only=True)  # prefill; the sequence's last 3 tokens are the unseen tail
    tree = hand_tree([11, 12, 13, 14, 15, 16, 17], [-1, 0, 1, -1, 3, 1, 5])
    logits = tree_pass(lm, SEQUENCE, tree)  # (3 + 7, V)
    for path in ([3, 4], [0, 1, 5, 6]):
        reference = scratch_logits(model, torch.cat([SEQUENCE, tree.tokens[path][None]], dim=-1))
        torch.testing.assert_close(logits[:3], reference[7:10], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logits[3 + torch.tensor(path)], reference[10:], atol=1e-4, rtol=1e-4)
    path = [0, 1, 5, 6]
    lm.keep(tree.size, [path])
    assert lm.length == SEQUENCE.shape[-1] + len(path)
    after = torch.cat([SEQUENCE, tree.tokens[path][None], torch.tensor([[8, 6]])], dim=-1)
    torch.testing.assert_close(lm.advance([after])[0], scratch_logits(model, after)[-2:], atol=1e-4, rtol=1e-4)
    # a second tree after the compacted path, then a crop-free continuation
    second = hand_tree([2, 3, 4], [-1, -1, 1])
    logits = tree_pass(lm, torch.cat([after, torch.tensor([[7]])], dim=-1), second)
    lm.keep(second.size, [[1, 2]])
    final = torch.cat([after, torch.tensor([[7, 3, 4, 5]])], dim=-1)
    torch.testing.assert_close(logits[-2:], scratch_logits(model, final)[-3:-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lm.advance([final])[0], scratch_logits(model, final)[-1:], atol=1e-4, rtol=1e-4)


def test_eager_attention_takes_the_float_mask():
    model = tiny_model("llama", seed=0, scale=4.0)
    model.set_attn_implementation("eager")
    lm = CachedLM(model)
    lm.forward(SEQUENCE[:, :7], last_only=True)
    tree = hand_tree([11, 12, 13], [-1, -1, 1])
    logits = tree_pass(lm, SEQUENCE, tree)
    reference = scratch_logits(model, torch.cat([SEQUENCE, torch.tensor([[12, 13]])], dim=-1))
    torch.testing.assert_close(logits[[2, 4, 5]], reference[[9, 10, 11]], atol=1e-4, rtol=1e-4)
