"""Trees cut to a chosen depth and node budget: the cost model's choice on hand-set numbers, pruning keeps a valid subtree, clear errors, and the power of the chi-square test against a cut that looks at the tokens."""

import random

import pytest
import torch
from fakes import BareDrafter
from goodness_of_fit import PASS, REJECT, chi_square_pvalue, sample_counts
from test_tree_auto import N_TOKENS, PROMPT, REPEATING

from specdec import (
    CostModel,
    ModelTreeDrafter,
    NGramTreeDrafter,
    Sampling,
    TreeDraft,
    tree_generate,
)
from specdec.choose.cost import Choice
from specdec.choose.tree_cost import TreeCostModel, walk_trials
from specdec.draft.tree import breadth_first, prune_tree, tree_depths
from specdec.exact import sequence_distribution
from specdec.runtime.tiny import tiny_model
from specdec.verify.tree import DETERMINISTIC, DISTINCT, IID


def test_walk_trials_follow_accept_tree_order():
    parents = [-1, -1, -1, 0, 0, 3]  # root: 0, 1, 2; node 0: 3, 4; node 3: 5
    assert walk_trials(parents, []) == [(1, 0, False), (1, 1, False), (1, 2, False)]
    assert walk_trials(parents, [1]) == [(1, 0, False), (1, 1, True)]  # node 1 is a leaf: nothing more tried
    assert walk_trials(parents, [0, 4]) == [(1, 0, True), (2, 0, False), (2, 1, True)]
    assert walk_trials(parents, [0, 3, 5]) == [(1, 0, True), (2, 0, True), (3, 0, True)]


def hand_set_tree_model(c, passes, draft_seconds, k_max=3, draft_cost="per_token"):
    """A TreeCostModel fed timings and trials as if it had watched many rounds: c[(depth, rank)] = rate."""
    model = TreeCostModel(k_max=k_max, draft_cost=draft_cost, decay=1.0)
    for width, seconds in passes.items():
        model.record_pass(width, seconds)
    model.record_draft(1, draft_seconds)
    trials = []
    for (depth, rank), rate in c.items():
        hits = round(rate * 10_000)
        trials += [(depth, rank, True)] * hits + [(depth, rank, False)] * (10_000 - hits)
    model.record_trials(trials)
    return model


def test_tree_choice_maximises_expected_tokens_per_second():
    c = {(1, 0): 0.5, (1, 1): 0.4, (1, 2): 0.1, (2, 0): 0.8, (2, 1): 0.3, (3, 0): 0.7}
    model = hand_set_tree_model(c, {1: 1.0, 2: 1.05, 9: 1.8}, 0.05)
    model.shape = [-1, -1, -1, 0, 0, 1, 3]  # the last proposal: three root children, two under 0, one under 1
    assert model.child_acceptance(1, 1) == pytest.approx(0.4, abs=1e-3)
    parents = model.template()
    assert parents == [-1, -1, -1, 0, 0, 1, 3]  # already k_max = 3 deep: no extension
    depths, order = tree_depths(parents), breadth_first(tree_depths(parents))
    assert order == [0, 1, 2, 3, 4, 5, 6]

    def v(node):  # probability that the node is accepted, by hand
        rank = [0, 1, 2, 0, 1, 0, 0][node]
        depth = depths[node]
        miss = 1.0
        for r in range(rank):
            miss *= 1 - c[depth, r]
        up = 1.0 if parents[node] < 0 else v(parents[node])
        return up * miss * c[depth, rank]

    def rate(n):
        d = max((depths[i] for i in order[:n]), default=0)
        return (1 + sum(v(i) for i in order[:n])) / (model.pass_seconds(n + 1) + 0.05 * d)

    best = max(range(8), key=lambda n: (rate(n), -n))
    choice = model.choose(limit=10)
    assert choice.nodes == best and choice.k == max((depths[i] for i in order[:best]), default=0)
    assert choice.expected_tokens / choice.seconds == pytest.approx(rate(best), rel=1e-3)
    model.max_nodes = 2
    limited = model.choose(limit=1)  # never past the budget or the pass limit
    assert limited.k <= 1 and limited.nodes <= 2
    assert limited.nodes == max(range(3), key=lambda n: (rate(n), -n))


def test_tree_model_chooses_plain_steps_when_nothing_is_accepted():
    c = {(1, 0): 0.02, (1, 1): 0.02, (2, 0): 0.02}
    model = hand_set_tree_model(c, {1: 1.0, 4: 1.5}, 0.1, k_max=2)
    model.shape = [-1, -1, 0]
    assert model.choose(10) == model.choose(10)
    assert model.choose(10).k == 0 and model.choose(10).nodes == 0


def test_template_extends_the_last_shape_by_a_chain():
    model = TreeCostModel(k_max=5)
    assert model.template() == [-1, 0, 1, 2, 3]  # before any proposal: a chain of k_max
    model.shape = [-1, -1, 1]
    assert model.template() == [-1, -1, 1, 2, 3, 4]


def random_tree(rng: random.Random, n: int, vocab: int = 16) -> TreeDraft:
    parents = [rng.randrange(-1, i) for i in range(n)]
    modes = []
    for i in range(n):
        siblings_before = [modes[j] for j in range(i) if parents[j] == parents[i]]
        modes.append(siblings_before[-1] if siblings_before else rng.choice([DETERMINISTIC, IID, DISTINCT]))
    q = torch.rand(n, vocab)
    return TreeDraft(torch.randint(vocab, (n,)), torch.tensor(parents), q / q.sum(-1, keepdim=True),
                     torch.tensor(modes), forwards=3)


@pytest.mark.parametrize("seed", range(30))
def test_prune_keeps_a_subtree_with_sibling_prefixes(seed):
    rng = random.Random(seed)
    tree = random_tree(rng, rng.randrange(1, 20))
    depth, nodes = rng.randrange(0, 6), rng.randrange(0, 22)
    pruned = prune_tree(tree, depth, nodes)
    depths, parents = tree.depths(), tree.parents.tolist()
    eligible = [i for i in breadth_first(depths) if depths[i] <= depth]
    kept = sorted(eligible[:nodes])
    assert pruned.size == min(nodes, len(eligible))
    assert pruned.forwards == tree.forwards
    new_parents = pruned.parents.tolist()
    assert all(-1 <= p < i for i, p in enumerate(new_parents))  # parents before children
    for new, old in enumerate(kept):
        assert pruned.tokens[new] == tree.tokens[old] and pruned.modes[new] == tree.modes[old]
        assert torch.equal(pruned.q[new], tree.q[old])  # each kept node keeps its own q row
        assert new_parents[new] == (kept.index(parents[old]) if parents[old] >= 0 else -1)  # ancestors kept
        earlier_siblings = [j for j in range(old) if parents[j] == parents[old]]
        assert all(j in kept for j in earlier_siblings)  # a prefix of siblings, in draw order
    assert max(pruned.depths(), default=0) <= depth


def test_prune_of_a_model_tree_is_the_breadth_first_prefix():
    target = tiny_model("llama", seed=0, scale=4.0)
    tree = ModelTreeDrafter(target, branches=(3, 2), depth=4, nodes=12, children="distinct").propose_row(
        PROMPT, 4, Sampling(1.0), 32, torch.Generator().manual_seed(0))
    assert tree.depths()[:9] == [1, 1, 1, 2, 2, 2, 2, 2, 2]
    pruned = prune_tree(tree, 2, 5)  # three root children, then the first two children of node 0
    assert pruned.parents.tolist() == [-1, -1, -1, 0, 0]
    assert torch.equal(pruned.tokens, tree.tokens[:5]) and torch.equal(pruned.q, tree.q[:5])
    assert prune_tree(tree, 4, 64) is tree  # nothing to cut


def test_auto_refuses_a_tree_drafter_without_draft_cost():
    target = tiny_model("llama")
    with pytest.raises(ValueError, match="draft_cost = 'per_token' on BareDrafter"):
        tree_generate(target, BareDrafter(), PROMPT, k="auto")
    with pytest.raises(ValueError, match="draft_cost = 'per_token' on BareDrafter"):
        tree_generate(target, BareDrafter(), PROMPT, k=TreeCostModel())


def test_bad_k_values_for_trees():
    target = tiny_model("llama")
    ngram = NGramTreeDrafter()
    with pytest.raises(ValueError, match="k_max"):
        tree_generate(target, ngram, PROMPT, k="auto", k_max=0)
    with pytest.raises(ValueError, match="'auto', None or a rule"):
        tree_generate(target, ngram, PROMPT, k="fast")
    with pytest.raises(ValueError, match="tree depth per round"):
        tree_generate(target, ngram, PROMPT, k=0)
    with pytest.raises(TypeError, match="needs a TreeCostModel"):
        tree_generate(target, ngram, PROMPT, k=CostModel(draft_cost="per_call"))
    with pytest.raises(ValueError, match="CostModel\\(draft_cost='per_call'\\)"):
        tree_generate(target, ngram, PROMPT, k=TreeCostModel(draft_cost="per_token"))


class OneChildRule(TreeCostModel):
    """Every round: depth 1, one node (the cut keeps one of the root's i.i.d. children)."""

    def choose(self, limit, rows=1, tokens=None):
        return Choice(min(1, limit), 1)


def likeliest_child(tree, depth, nodes):
    """A wrong cut: keep the root child the draft finds most likely, which looks at the drawn tokens."""
    roots = (tree.parents == -1).nonzero().flatten()
    if roots.numel() == 0:  # a plain step
        return tree
    best = roots[tree.q[roots, tree.tokens[roots]].argmax()]
    return TreeDraft(tree.tokens[best][None], torch.tensor([-1]), tree.q[best][None], tree.modes[best][None])


@pytest.mark.parametrize("wrong", [pytest.param(False, marks=pytest.mark.exhaustive), True],
                         ids=["first-child", "likeliest-child"])  # make test: the wrong cut is caught
def test_chi_square_rejects_a_cut_that_looks_at_the_tokens(small_vocab_pair, monkeypatch, wrong):
    """Keeping the first of three i.i.d. children is exact; keeping the likeliest one is not (it is no
    longer a draw from q), and the same chi-square test rejects it."""
    from specdec import decoding

    if wrong:
        monkeypatch.setattr(decoding, "prune_tree", likeliest_child)
    target, draft = small_vocab_pair
    sampling = Sampling(1.0)
    drafter = ModelTreeDrafter(draft, branches=(3,), depth=1, nodes=3, children="iid")

    def generate(g):
        return tree_generate(target, drafter, REPEATING, sampling=sampling, max_new_tokens=N_TOKENS, generator=g,
                             k=OneChildRule(k_max=1)).tokens

    pvalue = chi_square_pvalue(sample_counts(generate, 5, N_TOKENS, seed=9),
                               sequence_distribution(target, REPEATING, N_TOKENS, sampling))
    assert pvalue < REJECT if wrong else pvalue > PASS
