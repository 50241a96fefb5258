"""Token-tree acceptance rules: exact output distributions by enumeration, hand-built outcomes, greedy
paths, and a chi-square test of accept_tree that rejects a deliberately wrong rule."""

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare

from specdec.exact import (
    Branching,
    target_sequence_distribution,
    total_variation,
    toy_pair,
    tree_round,
    tree_round_distribution,
    wrong_iid_rule_with_original_q,
)
from specdec.sampling import GREEDY, Sampling, probabilities
from specdec.verify.tree import (
    DETERMINISTIC,
    DISTINCT,
    IID,
    accept_tree,
    children_of,
    ratio,
    residual,
    siblings,
)

SAMPLINGS = {
    "T1": Sampling(1.0),
    "T0.5-top_k2": Sampling(0.5, top_k=2),  # zeros in p and q, on different tokens
    "T1.5-top_p0.8": Sampling(1.5, top_p=0.8),
}
ONE_LEVEL = {
    "iid-1": [Branching(0, 1, IID)],
    "iid-2": [Branching(0, 2, IID)],
    "iid-3": [Branching(0, 3, IID)],
    "distinct-1": [Branching(0, 1, DISTINCT)],
    "distinct-2": [Branching(0, 2, DISTINCT)],
    "distinct-3": [Branching(0, 3, DISTINCT)],
    "top-1": [Branching(1)],
    "top-2": [Branching(2)],
    "top-3": [Branching(3)],
    "hybrid-1+2distinct": [Branching(1, 2, DISTINCT)],
    "hybrid-2+1iid": [Branching(2, 1, IID)],
}
TWO_LEVEL = {
    "iid-2/iid-2": [Branching(0, 2, IID), Branching(0, 2, IID)],
    "distinct-2/distinct-2": [Branching(0, 2, DISTINCT), Branching(0, 2, DISTINCT)],
    "top-2/iid-1": [Branching(2), Branching(0, 1, IID)],
    "hybrid/hybrid": [Branching(1, 2, DISTINCT), Branching(1, 1, IID)],
}
# found by scanning seeds: the wrong rule has TV 0.138 here
WRONG_CASE = {"seed": 8, "vocab": 4, "sampling": Sampling(1.0), "noise": 2.0}


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def tree(tokens, parents, q, modes):
    """What accept_tree reads, duck-typed like specdec.draft.tree.TreeDraft."""
    return SimpleNamespace(
        tokens=torch.tensor(tokens),
        parents=torch.tensor(parents),
        q=torch.as_tensor(q),
        modes=torch.tensor(modes),
    )


def one_hot(i, v=4):
    return torch.nn.functional.one_hot(torch.tensor(i), v).double()


# Exact output distributions (enumeration of the drafting and of every accept/reject).


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
@pytest.mark.parametrize("shape", ONE_LEVEL.values(), ids=ONE_LEVEL.keys())
def test_one_level_tree_emits_target_exactly(shape, sampling, seed):
    p_of, q_of = toy_pair(seed, 4, sampling)
    exact = tree_round_distribution(p_of, q_of, shape, 2)  # first emitted token and the one after it
    assert (exact - target_sequence_distribution(p_of, 2)).abs().max() < 1e-9


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
@pytest.mark.parametrize("shape", TWO_LEVEL.values(), ids=TWO_LEVEL.keys())
def test_two_level_tree_emits_target_exactly(shape, sampling, seed):
    p_of, q_of = toy_pair(seed, 4, sampling)
    exact = tree_round_distribution(p_of, q_of, shape, 2)  # the first two emitted tokens
    assert (exact - target_sequence_distribution(p_of, 2)).abs().max() < 1e-9


@pytest.mark.parametrize("shape", [ONE_LEVEL["iid-3"], ONE_LEVEL["distinct-3"], ONE_LEVEL["hybrid-2+1iid"]])
def test_draft_equal_to_target_has_no_residual_mass_and_stays_exact(shape):
    """p == q: every residual is empty; the rule falls back to p instead of dividing by zero."""
    p_of, _ = toy_pair(3, 5, Sampling(1.0))
    exact = tree_round_distribution(p_of, p_of, shape, 1)
    assert torch.isfinite(exact).all()
    assert (exact - target_sequence_distribution(p_of, 1)).abs().max() < 1e-9


def test_iid_rule_with_original_q_is_biased_on_distinct_and_top_b_children():
    p_of, q_of = toy_pair(**WRONG_CASE)
    target = target_sequence_distribution(p_of, 1)
    for shape in ([Branching(0, 2, DISTINCT)], [Branching(2)]):
        right = tree_round_distribution(p_of, q_of, shape, 1)
        wrong = tree_round_distribution(p_of, q_of, shape, 1, rule=wrong_iid_rule_with_original_q)
        assert total_variation(right, target) < 1e-9
        assert total_variation(wrong, target) > 0.01, shape
    assert total_variation(wrong, target) > 0.1  # top-2 children tried with the original q
    iid = [Branching(0, 2, IID)]  # the same rule is exact where it belongs
    assert (
        total_variation(
            tree_round_distribution(p_of, q_of, iid, 1, rule=wrong_iid_rule_with_original_q), target
        )
        < 1e-9
    )


# accept_tree itself: chi-square against p, with power shown by the wrong rule.


def first_tokens(p_of, q_of, shape, n_rounds, n_tokens, rule=siblings, seed=0, round_=tree_round):
    """Histogram counts (V^n,) of the first n tokens of n_rounds rounds of round_ (tree_round with the sibling
    rule `rule`, or exact.traversal_round with `rule` as its update); missing tokens drawn from p."""
    g = gen(seed)
    vocab = p_of(()).numel()
    counts = torch.zeros(vocab**n_tokens)
    for _ in range(n_rounds):
        out = round_(p_of, q_of, shape, g, rule).tolist()
        while len(out) < n_tokens:  # the next round, drawn from the target
            out.append(int(torch.multinomial(p_of(tuple(out)), 1, generator=g)))
        index = 0
        for t in out[:n_tokens]:
            index = index * vocab + t
        counts[index] += 1
    return counts


def chi_square_pvalue(counts, probs):
    support = probs > 0
    assert counts[~support].sum() == 0, "a token with zero target probability was emitted"
    return chisquare(counts[support].numpy(), (probs[support] * counts.sum()).numpy()).pvalue


# make test: hybrid siblings here; distinct ones by the right rule below and in test_tree_auto.py's loop
@pytest.mark.parametrize("shape", [pytest.param(TWO_LEVEL["hybrid/hybrid"], id="hybrid"),
                                   pytest.param(TWO_LEVEL["distinct-2/distinct-2"], id="distinct",
                                                marks=pytest.mark.exhaustive)])
def test_accept_tree_first_two_tokens_pass_chi_square(shape):
    p_of, q_of = toy_pair(1, 4, Sampling(0.8, top_p=0.95))
    counts = first_tokens(p_of, q_of, shape, 2000, 2)
    assert chi_square_pvalue(counts, target_sequence_distribution(p_of, 2)) > 1e-3


@pytest.mark.parametrize("shape", [[Branching(0, 2, DISTINCT)], [Branching(2)]], ids=["distinct", "top-2"])
def test_chi_square_accepts_right_rule_and_rejects_wrong_rule(shape):
    p_of, q_of = toy_pair(**WRONG_CASE)
    target = target_sequence_distribution(p_of, 1)
    right = first_tokens(p_of, q_of, shape, 2000, 1)
    wrong = first_tokens(p_of, q_of, shape, 2000, 1, rule=wrong_iid_rule_with_original_q)
    assert chi_square_pvalue(right, target) > 1e-3
    assert chi_square_pvalue(wrong, target) < 1e-6


# Greedy: the path follows the target's argmax as far as the tree allows.


def argmax_path(p, parents, tokens):
    """Reference: from the root, step into the child equal to argmax p as long as there is one."""
    children = children_of(parents)
    path, node = [], -1
    while True:
        best = int(p[node + 1].argmax())
        match = [c for c in children.get(node, []) if tokens[c] == best]
        if not match:
            return path, best
        node = match[0]
        path.append(node)


def test_greedy_hand_built_tree_follows_argmax():
    # root -> {0: tok 1, 1: tok 2}; node 1 -> {2: tok 0, 3: tok 3}; node 3 -> {4: tok 1}
    parents, tokens = [-1, -1, 1, 1, 3], [1, 2, 0, 3, 1]
    argmaxes = [2, 0, 3, 0, 1, 2]  # p[0] after the root, p[1+i] after node i
    p = torch.stack([one_hot(a) for a in argmaxes])  # (n+1, V)
    t = tree(tokens, parents, p[1:].clone(), [DETERMINISTIC] * 2 + [DISTINCT] * 2 + [IID])
    for seed in range(5):
        path, next_token = accept_tree(p, t, gen(seed))
        assert path == [1, 3, 4] and next_token.tolist() == [2]


@pytest.mark.parametrize("mode", [DETERMINISTIC, IID, DISTINCT])
def test_greedy_random_tries_give_longest_argmax_path(mode):
    g = gen(1)
    vocab = 5
    for _ in range(200):
        n = int(torch.randint(1, 12, (), generator=g))
        parents, tokens = [], []
        for i in range(n):  # a trie: siblings carry distinct tokens
            parent = int(torch.randint(-1, i, (), generator=g))
            used = {tokens[c] for c, pa in enumerate(parents) if pa == parent}
            free = [t for t in range(vocab) if t not in used]
            if not free:
                parent, free = i - 1, list(range(vocab))
            parents.append(parent)
            tokens.append(free[int(torch.randint(len(free), (), generator=g))])
        p = probabilities(torch.randn(n + 1, vocab, generator=g), GREEDY).double()  # (n+1, V) one-hot
        q = probabilities(torch.randn(n, vocab, generator=g), Sampling(1.0)).double()
        path, next_token = accept_tree(p, tree(tokens, parents, q, [mode] * n), g)
        assert (path, int(next_token)) == argmax_path(p, parents, tokens)


# Hand-built cases with known acceptance probabilities and residuals.


def test_deterministic_rule_accepts_with_target_probability_and_zeroes_on_rejection():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    a, targets = siblings(p, [0, 3, 1], torch.zeros(3, 4, dtype=torch.float64), [DETERMINISTIC] * 3)
    assert torch.allclose(a, torch.tensor([0.5, 0.0, 0.6], dtype=torch.float64))  # 0.3 / (1 - 0.5)
    assert torch.allclose(targets[-1], one_hot(2))


def test_iid_rule_uses_the_same_q_for_every_child():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    q = torch.full((2, 4), 0.25, dtype=torch.float64)
    a, targets = siblings(p, [2, 2], q, [IID, IID])  # a duplicate, both with p = 0
    assert a.tolist() == [0.0, 0.0]
    assert torch.allclose(targets[1], torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64))
    assert torch.allclose(targets[2], torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64))
    for seed in range(20):
        path, next_token = accept_tree(
            p[None].expand(3, -1), tree([2, 2], [-1, -1], q, [IID, IID]), gen(seed)
        )
        assert path == [] and int(next_token) in (0, 1)


def test_distinct_rule_renormalises_q_without_rejected_children():
    p = torch.tensor([0.0, 0.3, 0.7, 0.0], dtype=torch.float64)
    q = torch.tensor([0.6, 0.2, 0.2, 0.0], dtype=torch.float64).expand(2, -1)
    a, targets = siblings(p, [0, 1], q, [DISTINCT, DISTINCT])
    # child 0: p = 0, rejected; residual (p - q)+ = [0, .1, .5, 0] / .6; q_2 = q without 0 = [0, .5, .5, 0]
    assert torch.allclose(a, torch.tensor([0.0, (1 / 6) / 0.5], dtype=torch.float64))
    assert torch.allclose(targets[1], torch.tensor([0, 1 / 6, 5 / 6, 0], dtype=torch.float64))
    assert torch.allclose(targets[2], one_hot(2))
    wrong, _ = wrong_iid_rule_with_original_q(p, [0, 1], q, [DISTINCT, DISTINCT])
    assert torch.allclose(wrong[1], torch.tensor((1 / 6) / 0.2, dtype=torch.float64))  # would accept 5/6


def test_stored_q_i_rows_give_the_same_distinct_rule():
    p = torch.tensor([0.1, 0.3, 0.4, 0.2], dtype=torch.float64)
    q = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    q_rows = torch.stack([q, torch.tensor([0.0, 0.5, 2 / 6, 1 / 6], dtype=torch.float64)])  # q, then q_2
    for a, b in zip(
        siblings(p, [0, 2], q.expand(2, -1), [DISTINCT] * 2), siblings(p, [0, 2], q_rows, [DISTINCT] * 2)
    ):
        assert torch.allclose(a, b)


def test_hybrid_siblings_try_sampled_children_on_the_deterministic_residual():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    q = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64).expand(2, -1)
    a, targets = siblings(p, [0, 0], q, [DETERMINISTIC, IID])
    assert a.tolist() == [0.5, 0.0]  # after rejecting 0 the target is [0, 1, 0, 0]: p(0) = 0 now
    assert torch.allclose(targets[-1], one_hot(1))


def test_degenerate_ratio_and_residual_are_finite():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    assert float(ratio(p, one_hot(1).float(), 0)) == 1.0  # q(x) = 0, p(x) > 0: no division by zero
    assert float(ratio(p, one_hot(1).float(), 2)) == 0.0  # q(x) = 0, p(x) = 0
    assert torch.equal(residual(p, p), p)  # p == q: nothing to correct, fall back to p


def test_sibling_modes_are_checked():
    p = torch.full((4,), 0.25)
    q = torch.full((2, 4), 0.25)
    with pytest.raises(ValueError, match="deterministic children first"):
        siblings(p, [0, 1], q, [IID, DETERMINISTIC])
    with pytest.raises(ValueError, match="one mode"):
        siblings(p, [0, 1], q, [IID, DISTINCT])


def test_empty_tree_is_a_plain_target_step_and_generator_is_not_reseeded():
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    empty = tree([], [], torch.zeros(0, 4), [])
    assert accept_tree(p, empty, gen()) == ([], torch.tensor([2]))
    g = gen(0)
    p = torch.full((2, 4), 0.25)
    t = tree([1], [-1], torch.tensor([[0.7, 0.1, 0.1, 0.1]]), [IID])
    draws = [accept_tree(p, t, g) for _ in range(40)]
    assert len({(tuple(path), int(x)) for path, x in draws}) > 1  # one stream, advancing


def test_children_of_keeps_sibling_order():
    assert children_of([-1, -1, 0, 1, 0]) == {-1: [0, 1], 0: [2, 4], 1: [3]}
