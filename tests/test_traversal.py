"""Traversal verification (specdec.TraversalVerification, Weng et al. 2025) as the loop's acceptance rule for
token trees: its exact output distribution is the target's (enumerated over the drafting and every accept or
reject), on a chain it is block verification outcome for outcome, samples of it pass the chi-square test in
the loop at temperatures 0.5, 1 and 1.5 with top-k and top-p, the test rejects a wrong update with shown power
(exact, and in sampled rounds of the rule),
greedy output equals the target's on the seven tiny architectures, and on the same drafted trees it accepts
as many tokens as the token-level tree rules or more, on average."""

from types import SimpleNamespace

import pytest
import torch
from goodness_of_fit import N_SAMPLES, PASS, REJECT, batch_counts, block_round, chi_square_pvalue, power
from test_tree import PROMPT, model_tree
from test_tree_accept import SAMPLINGS, TWO_LEVEL, argmax_path, first_tokens, gen

from specdec import (
    GREEDY,
    BlockVerification,
    ModelDrafter,
    ModelTreeDrafter,
    NGramTreeDrafter,
    Sampling,
    TraversalVerification,
    speculative_generate,
    tree_generate,
)
from specdec.exact import (
    Branching,
    drafted_trees,
    expected_accepted_traversal,
    expected_accepted_tree_rules,
    sequence_distribution,
    target_sequence_distribution,
    total_variation,
    toy_pair,
    toy_tree,
    traversal_outcomes,
    traversal_round,
    traversal_round_distribution,
)
from specdec.runtime.tiny import tiny_model
from specdec.sampling import probabilities
from specdec.verify.block import block_residual
from specdec.verify.traversal import after_failure
from specdec.verify.tree import DETERMINISTIC, DISTINCT, IID, residual

SHAPES = {
    "iid-3": [Branching(0, 3, IID)],
    "hybrid-1+2distinct": [Branching(1, 2, DISTINCT)],
    **TWO_LEVEL,
    "chain-3": [Branching(0, 1, IID)] * 3,
    "distinct-2/iid-1/top-1": [Branching(0, 2, DISTINCT), Branching(0, 1, IID), Branching(1)],
}
DEEP = {name: shape for name, shape in SHAPES.items() if len(shape) > 1}
REPEATING = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])  # as test_tree's: the n-gram trie finds matches
N_TOKENS = 3


def token_level_update(w, p_u, q_c, x):
    """WRONG on purpose: the token-level residual norm(max(0, p_u - q_c)) after a failed child, the weight kept."""
    return w, residual(p_u, q_c)


# Exact output distributions, enumerated.


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_traversal_emits_target_exactly(shape, sampling, seed):
    """Every drafted tree and every accept/reject enumerated: the first three emitted tokens (past the tree's
    depth, so the bonus and residual tokens count) follow the target exactly."""
    p_of, q_of = toy_pair(seed, 4, sampling)
    exact = traversal_round_distribution(p_of, q_of, shape, 3)
    assert (exact - target_sequence_distribution(p_of, 3)).abs().max() < 1e-9


def test_draft_equal_to_target_stays_exact():
    """p == q: the weights stay 1 and every update divides 0 by 0 in exact arithmetic; the state is kept."""
    p_of, _ = toy_pair(3, 5, Sampling(1.0))
    exact = traversal_round_distribution(p_of, p_of, SHAPES["iid-2/iid-2"], 2)
    assert torch.isfinite(exact).all()
    assert (exact - target_sequence_distribution(p_of, 2)).abs().max() < 1e-9


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
@pytest.mark.parametrize("shape", DEEP.values(), ids=DEEP.keys())
def test_the_test_catches_the_token_level_update(shape, sampling):
    """Updating a node with the token-level residual and its weight unchanged biases every tree deeper than one
    level; chi-square of N_SAMPLES rounds rejects it with probability >= 0.95 (exact power, not simulated)."""
    p_of, q_of = toy_pair(8, 4, sampling, noise=2.0)
    exact = target_sequence_distribution(p_of, 2)
    wrong = traversal_round_distribution(p_of, q_of, shape, 2, update=token_level_update)
    assert total_variation(wrong, exact) > 0.05
    assert power(exact, wrong, N_SAMPLES, PASS) >= 0.95


def chain_tree(p_of, q_of, xs):
    """The chain x_1..x_k as a tree with its p (k+1, V) and q rows."""
    prefixes = [tuple(xs[:i]) for i in range(len(xs) + 1)]
    tree = SimpleNamespace(tokens=torch.tensor(xs), parents=torch.arange(-1, len(xs) - 1),
                           q=torch.stack([q_of(s) for s in prefixes[:-1]]), modes=torch.full((len(xs),), IID))  # fmt: skip
    return torch.stack([p_of(s) for s in prefixes]), tree


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_on_a_chain_it_is_block_verification(sampling):
    """For every chain of 3 tokens, the probability of each (accepted prefix, next token) equals block
    verification's, computed from Sun et al.'s definition (tests/goodness_of_fit.block_round)."""
    p_of, q_of = toy_pair(4, 3, sampling, noise=1.5)
    block = block_round(block_residual)
    for xs in [(a, b, c) for a in range(3) for b in range(3) for c in range(3)]:
        p, tree = chain_tree(p_of, q_of, list(xs))
        if float(torch.stack([q_of(xs[:i])[x] for i, x in enumerate(xs)]).prod()) == 0:
            continue  # a chain the draft cannot draft
        ours = {}
        for path, mass in traversal_outcomes(p, tree):
            for y in range(3):
                ours[xs[: len(path)] + (y,)] = ours.get(xs[: len(path)] + (y,), 0.0) + float(mass[y])
        theirs = {}
        for emitted, prob in block(lambda n, xs=xs: p_of(xs[:n]), lambda n, xs=xs: q_of(xs[:n]), xs):
            theirs[emitted] = theirs.get(emitted, 0.0) + prob
        for key in set(ours) | set(theirs):
            assert abs(ours.get(key, 0.0) - theirs.get(key, 0.0)) < 1e-9, (xs, key)


EXPECTATION_CASES = {  # (shape, sampling): every drafted tree enumerated (at most 768 trees of 4 tokens)
    "hybrid/hybrid-T1": (TWO_LEVEL["hybrid/hybrid"], Sampling(1.0)),
    "top-2/iid-1-T1": (TWO_LEVEL["top-2/iid-1"], Sampling(1.0)),
    "chain-3-T1": (SHAPES["chain-3"], Sampling(1.0)),
    "distinct-2/iid-1/top-1-T1": (SHAPES["distinct-2/iid-1/top-1"], Sampling(1.0)),
    "iid-2/iid-2-T0.5-top_k2": (TWO_LEVEL["iid-2/iid-2"], Sampling(0.5, top_k=2)),
    "distinct-2/distinct-2-T1.5-top_p0.8": (TWO_LEVEL["distinct-2/distinct-2"], Sampling(1.5, top_p=0.8)),
}


# make test: every shape but the hybrid tree (its 768 trees take seconds per noise), whose rounds pass chi-square in
# the loop below; the mixed-mode shape distinct-2/iid-1/top-1 stays
@pytest.mark.parametrize("shape, sampling, noise", [
    pytest.param(shape, sampling, noise, id=f"{name}-{noise}",
                 marks=pytest.mark.exhaustive if name == "hybrid/hybrid-T1" else ())
    for name, (shape, sampling) in EXPECTATION_CASES.items() for noise in (0.5, 2.0)])  # fmt: skip
def test_accepts_at_least_as_many_tokens_as_token_level_over_the_drafting(shape, sampling, noise):
    """Expected accepted tokens of one round, every drafted tree and every accept/reject enumerated, both rules
    on the same trees: traversal >= token level. (On one drawn tree it can accept fewer, as block verification
    can on one drawn chain; the expectation over the drafting is what it raises.)"""
    for seed in range(2):
        p_of, q_of = toy_pair(seed, 4, sampling, noise=noise)
        trees = drafted_trees(p_of, q_of, shape)
        assert abs(sum(w for w, _, _ in trees) - 1) < 1e-9  # every tree the draft can draft
        traversal = sum(w * expected_accepted_traversal(p, tree) for w, p, tree in trees)
        token = sum(w * expected_accepted_tree_rules(p, tree) for w, p, tree in trees)
        assert traversal >= token - 1e-9


def test_deterministic_children_accept_exactly_what_the_token_level_rules_accept():
    g = gen(3)
    for seed in range(20):
        p_of, q_of = toy_pair(seed, 6, Sampling(1.0))
        p, tree = toy_tree(p_of, q_of, [Branching(2), Branching(2), Branching(1)], g)
        assert abs(expected_accepted_traversal(p, tree) - expected_accepted_tree_rules(p, tree)) < 1e-9


# The rule itself: samples of toy rounds, then the loop with tiny models.


# make test: distinct children here; hybrid ones in the loop (test_traversal_in_the_loop_passes_chi_square)
@pytest.mark.parametrize("shape", [pytest.param(TWO_LEVEL["hybrid/hybrid"], id="hybrid", marks=pytest.mark.exhaustive),
                                   pytest.param(TWO_LEVEL["distinct-2/distinct-2"], id="distinct")])
def test_toy_rounds_pass_chi_square_and_the_wrong_update_does_not(shape):
    p_of, q_of = toy_pair(8, 4, Sampling(1.0), noise=2.0)
    target = target_sequence_distribution(p_of, 2)
    right = first_tokens(p_of, q_of, shape, 2000, 2, rule=None, seed=1, round_=traversal_round)
    wrong = first_tokens(p_of, q_of, shape, 2000, 2, rule=token_level_update, seed=1, round_=traversal_round)
    assert chi_square_pvalue(right, target) > PASS
    assert chi_square_pvalue(wrong, target) < REJECT


def traversal_counts(target, drafter, sampling, seed, n=N_SAMPLES):
    acceptance = TraversalVerification()

    def generate(g, n):
        return tree_generate(target, drafter, REPEATING.expand(n, -1), sampling=sampling,
                             max_new_tokens=N_TOKENS, generator=g, acceptance=acceptance).tokens  # fmt: skip

    return batch_counts(generate, 5, N_TOKENS, seed=seed, n=n)


LOOP_CASES = [
    pytest.param(model_tree("iid", (2, 2)), Sampling(1.0), id="iid-T1", marks=pytest.mark.exhaustive),
    pytest.param(model_tree("distinct", hybrid=NGramTreeDrafter(matches=2, depth=2, nodes=4)), Sampling(1.0),
                 id="hybrid-T1"),
    pytest.param(model_tree("iid", (2, 2)), Sampling(0.5), id="iid-T0.5", marks=pytest.mark.exhaustive),
    pytest.param(model_tree("distinct", (3, 2)), Sampling(1.5), id="distinct-T1.5", marks=pytest.mark.exhaustive),
    pytest.param(model_tree("distinct"), Sampling(1.0, top_k=3), id="distinct-topk", marks=pytest.mark.exhaustive),
    pytest.param(model_tree("iid"), Sampling(1.0, top_p=0.8), id="iid-topp", marks=pytest.mark.exhaustive),
    pytest.param(model_tree("top", (3, 2)), Sampling(1.5, top_k=4, top_p=0.9), id="top-T1.5-topk-topp",
                 marks=pytest.mark.exhaustive),
]


@pytest.mark.parametrize("make, sampling", LOOP_CASES)
def test_traversal_in_the_loop_passes_chi_square(small_vocab_pair, make, sampling):
    """tree_generate with TraversalVerification: N_SAMPLES continuations fit the target's distribution, not the
    draft's (one case in `make test`, the others in `make test-all`)."""
    target, draft = small_vocab_pair
    counts = traversal_counts(target, make(draft), sampling, seed=11)
    assert chi_square_pvalue(counts, sequence_distribution(target, REPEATING, N_TOKENS, sampling)) > PASS
    assert chi_square_pvalue(counts, sequence_distribution(draft, REPEATING, N_TOKENS, sampling)) < REJECT


# Greedy.


@pytest.mark.parametrize("mode", [DETERMINISTIC, IID, DISTINCT])
def test_greedy_random_trees_give_the_longest_argmax_path(mode):
    """One-hot p and q: every weight is 0 or 1; the accepted path is the token-level rules' (argmax) path."""
    g = gen(2)
    vocab = 5
    for _ in range(200):
        n = int(torch.randint(1, 12, (), generator=g))
        parents = [int(torch.randint(-1, i, (), generator=g)) for i in range(n)]
        tokens = torch.randint(vocab, (n,), generator=g).tolist()
        p = probabilities(torch.randn(n + 1, vocab, generator=g), GREEDY).double()  # (n+1, V) one-hot
        q = torch.nn.functional.one_hot(torch.tensor(tokens), vocab).double()  # greedy drafts
        tree = SimpleNamespace(tokens=torch.tensor(tokens), parents=torch.tensor(parents), q=q,
                               modes=torch.full((n,), mode))  # fmt: skip
        if mode == DISTINCT and any(  # siblings drawn without replacement carry distinct tokens
            tokens[a] == tokens[b] for a in range(n) for b in range(a) if parents[a] == parents[b]
        ):
            continue
        path, next_token = TraversalVerification().accept(p, tree, g)
        assert (path, int(next_token)) == argmax_path(p, parents, tokens)


# Clear errors.


def test_rules_for_the_other_shape_are_refused():
    target = tiny_model("llama")
    with pytest.raises(ValueError, match="BlockVerification verifies chains.*TraversalVerification"):
        tree_generate(target, ModelTreeDrafter(target, depth=2), PROMPT, acceptance=BlockVerification())
    with pytest.raises(ValueError, match="TraversalVerification verifies token trees"):
        speculative_generate(target, ModelDrafter(target), PROMPT, acceptance=TraversalVerification())


def test_mixed_sibling_modes_are_refused():
    tree = SimpleNamespace(tokens=torch.tensor([0, 1]), parents=torch.tensor([-1, -1]),
                           q=torch.full((2, 4), 0.25), modes=torch.tensor([IID, DETERMINISTIC]))  # fmt: skip
    with pytest.raises(ValueError, match="deterministic children first"):
        TraversalVerification().accept(torch.full((3, 4), 0.25), tree, gen())


def test_after_failure_matches_block_verification_at_one_node():
    """The update's numbers on a hand-worked node: w = 0.5, p_u = (0.6, 0.4, 0), q_c = (0.1, 0.3, 0.6):
    w p_u - q_c = (0.2, -0.1, -0.6), s = 0.2, w' = 0.2 / (0.2 + 0.5) = 2/7, p_u' = (1, 0, 0)."""
    w, p_u = after_failure(0.5, torch.tensor([0.6, 0.4, 0.0]), torch.tensor([0.1, 0.3, 0.6]), 2)
    assert abs(w - 2 / 7) < 1e-7
    torch.testing.assert_close(p_u, torch.tensor([1.0, 0.0, 0.0]))
