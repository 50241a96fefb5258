"""Token trees with k="auto": depth and node budget chosen each round by specdec.choose.tree_cost.TreeCostModel.

The rule sees only earlier rounds (their times, the children tried and the last proposal's shape), and the
drafter's tree is cut by depth, then drafter order (prune_tree), so the output keeps the target's
distribution (chi-square against exact enumeration) and equals the target's greedy output on every tiny
architecture. The same chi-square test rejects a cut that keeps the draft's likeliest sibling instead of
the first one (it looks at the drawn tokens). Timings come from injected clocks (random increments from their own seed), so the chosen
shapes vary from round to round and every test is deterministic.
"""

import random

import pytest
import torch
from fakes import BareDrafter, tree_round
from goodness_of_fit import PASS, REJECT, chi_square_pvalue, sample_counts

from specdec import (
    GREEDY,
    CostModel,
    HybridTreeDrafter,
    ModelTreeDrafter,
    NGramTreeDrafter,
    Sampling,
    TreeDraft,
    autoregressive_generate,
    tree_generate,
)
from specdec.choose.cost import Choice
from specdec.choose.tree_cost import TreeCostModel, breadth_first, tree_depths, walk_trials
from specdec.draft.tree import prune_tree
from specdec.exact import sequence_distribution
from specdec.runtime.tiny import ARCHITECTURES, perturbed_copy, tiny_model
from specdec.verify.tree import DETERMINISTIC, DISTINCT, IID

PROMPT = torch.tensor([[0, 5, 3, 7, 5, 3]])
N_NEW = 30


class RandomClock:
    """Each reading advances time by a uniform amount in [0, 1): varied, reproducible round costs."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.rng.random()
        return self.now


def hf_greedy(model, ids, n):
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, ids.shape[-1] :]


# ---------------------------------------------------------------- greedy equality


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_case(request):
    target = tiny_model(request.param, seed=0, scale=20.0)
    return request.param, target, perturbed_copy(target, 0.15), hf_greedy(target, PROMPT, N_NEW)


AUTO_DRAFTERS = {
    "ngram": lambda d: NGramTreeDrafter(matches=3, depth=8, nodes=12),
    "model_top": lambda d: ModelTreeDrafter(d, branches=(3, 2), depth=6, nodes=14, children="top"),
    "model_iid": lambda d: ModelTreeDrafter(d, branches=(2, 2), depth=6, children="iid"),
}


@pytest.mark.parametrize("name", AUTO_DRAFTERS)
def test_auto_tree_greedy_equals_target_greedy(arch_case, name):
    arch, target, draft, reference = arch_case
    drafter = AUTO_DRAFTERS[name](draft)
    rule = TreeCostModel(k_max=8, draft_cost=drafter.draft_cost, clock=RandomClock())  # depth 8 > window 6
    out = tree_generate(target, drafter, PROMPT, sampling=GREEDY, max_new_tokens=N_NEW, k=rule)
    assert torch.equal(out.tokens, reference), (arch, name)
    s = out.stats
    assert s.emitted == N_NEW and len(s.chosen_k) == s.target_forwards == len(s.tree_nodes)
    assert len(set(s.chosen_k)) >= 3  # the depth really varies
    assert all(depth <= k for depth, k in zip(s.tree_depths, s.chosen_k))
    assert max(s.tree_nodes) > 0  # trees were verified
    if name != "ngram":  # the n-gram trie finds nothing worth accepting in some random models' outputs
        assert s.accepted > 0


def test_auto_string_builds_a_fresh_model(arch_case):
    arch, target, draft, reference = arch_case
    out = tree_generate(target, ModelTreeDrafter(draft, branches=(2,), depth=4), PROMPT, sampling=GREEDY,
                        max_new_tokens=N_NEW, k="auto", k_max=4)
    assert torch.equal(out.tokens, reference), arch
    assert out.stats.chosen_k[:2] == [0, 4]  # warm-up: a plain step, then the deepest tree
    assert max(out.stats.chosen_k) <= 4


# ---------------------------------------------------------------- exactness at sequence level

N_TOKENS = 3
REPEATING = torch.tensor([[0, 3, 1, 2, 3, 1, 2, 4, 3, 1]])  # n-gram matches exist
N_PASS = 500  # as tests/test_tree.py: a right rule passes at any count


def model_tree(children, branches=(3,), hybrid=None):
    options = {"branches": branches, "depth": 2, "nodes": 8, "children": children}
    return lambda draft: ModelTreeDrafter(draft, **options) if hybrid is None else HybridTreeDrafter(
        draft, hybrid, **options)


AUTO_EXACT_CASES = [
    pytest.param(model_tree("iid", (3, 2)), Sampling(1.0), id="iid-T1"),
    pytest.param(model_tree("distinct", (3, 2)), Sampling(1.0), id="distinct-T1"),
    pytest.param(model_tree("distinct"), Sampling(0.5, top_k=3), id="distinct-T0.5-topk"),
    pytest.param(
        lambda d: model_tree("distinct", hybrid=NGramTreeDrafter(matches=2, depth=2, nodes=4))(d),
        Sampling(1.5, top_p=0.9),
        id="hybrid-T1.5-topp",
    ),
]


@pytest.mark.parametrize("make, sampling", AUTO_EXACT_CASES)
def test_auto_tree_matches_target_distribution(small_vocab_pair, make, sampling):
    """One cost model shared by all samples, so later samples run on estimates, not on the warm-up; its
    random clock makes it cut the tree to different depths and node budgets."""
    target, draft = small_vocab_pair
    drafter = make(draft)
    rule = TreeCostModel(k_max=2, clock=RandomClock(7))
    shapes = set()

    def generate(g):
        out = tree_generate(target, drafter, REPEATING, sampling=sampling, max_new_tokens=N_TOKENS,
                            generator=g, k=rule)
        shapes.update(zip(out.stats.chosen_k, out.stats.tree_nodes))
        return out.tokens

    counts = sample_counts(generate, 5, N_TOKENS, seed=5, n=N_PASS)
    assert chi_square_pvalue(counts, sequence_distribution(target, REPEATING, N_TOKENS, sampling)) > PASS
    assert {0, 1} <= {k for k, _ in shapes}  # plain steps and trees were both exercised
    assert len(shapes) >= 3  # trees cut to several (depth, node budget) shapes


def test_auto_tree_records_alpha_and_prediction(small_vocab_pair):
    target, draft = small_vocab_pair
    drafter = ModelTreeDrafter(draft, branches=(2,), depth=3, children="distinct")
    out = tree_generate(target, drafter, REPEATING, sampling=Sampling(1.0), max_new_tokens=40, k="auto", k_max=3,
                        generator=torch.Generator().manual_seed(0))
    s = out.stats
    assert 0.0 < s.alpha < 1.0  # beta at the first sampled child of each visited node
    assert s.predicted_seconds > 0 and s.measured_seconds > 0 and s.measured_tokens > 0
    assert sum(s.chosen_k_histogram) == s.target_forwards
    summary = s.summary()
    assert summary["predicted_tokens_per_second"] > 0 and summary["measured_tokens_per_second"] > 0


# ---------------------------------------------------------------- past only


class LoggedTreeCostModel(TreeCostModel):
    """A tree cost model that logs every choice and every observation, in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log = []

    def choose(self, limit, rows=1):
        choice = super().choose(limit)
        self.log.append(("choose", limit, choice))
        return choice

    def observe(self, round):
        self.log.append(("observe", round.choice, round.proposed.rows[0].parents.tolist(),
                         round.verified.rows[0].parents.tolist(), list(round.path[0]), dict(round.seconds)))
        super().observe(round)


def test_choice_depends_only_on_earlier_rounds(small_vocab_pair, monkeypatch):
    """Each round chooses its depth and node budget before its target pass, and replaying the earlier
    observations alone gives the same choices: this round's p cannot have influenced its tree."""
    from specdec.draft.proposal import RowProposals

    target, draft = small_vocab_pair
    rule = LoggedTreeCostModel(k_max=4, clock=RandomClock(3))
    score = RowProposals.score

    def logged_score(self, *args, **kwargs):
        rule.log.append(("verify",))
        return score(self, *args, **kwargs)

    monkeypatch.setattr(RowProposals, "score", logged_score)
    g = torch.Generator().manual_seed(0)
    drafter = ModelTreeDrafter(draft, branches=(2, 2), depth=4, children="iid")
    for _ in range(5):
        tree_generate(target, drafter, REPEATING, k=rule, max_new_tokens=24, generator=g)
    kinds = [event[0] for event in rule.log]
    for i, kind in enumerate(kinds):  # choose, (verify unless a plain step), observe
        if kind == "verify":
            assert kinds[i - 1] == "choose" and kinds[i + 1] == "observe"
        if kind == "choose":
            assert kinds[i + 1] in ("verify", "observe")

    replay = TreeCostModel(k_max=4)
    for event in rule.log:
        if event[0] == "choose":
            assert replay.choose(event[1]) == event[2]
        elif event[0] == "observe":
            replay.observe(tree_round(*event[1:]))
    choices = {(e[2].k, e[2].nodes) for e in rule.log if e[0] == "choose"}
    assert len({k for k, _ in choices}) >= 3 and len(choices) >= 4


def test_expensive_pass_falls_back_to_plain_steps(monkeypatch):
    """Every tree node costs 50 time units of the fake clock in the pass: after the warm-up no tree pays,
    every round is a plain step, the drafter is not called again, and the output is the target's own."""
    from specdec.draft.proposal import RowProposals

    target = tiny_model("llama", seed=0, scale=20.0)
    clock = RandomClock(4)
    score = RowProposals.score

    def slow_score(self, *args, **kwargs):
        clock.now += 50.0 * self.size
        return score(self, *args, **kwargs)

    monkeypatch.setattr(RowProposals, "score", slow_score)

    class CountingDrafter(ModelTreeDrafter):
        calls = 0

        def propose(self, *args):
            CountingDrafter.calls += 1
            return super().propose(*args)

    drafter = CountingDrafter(target, branches=(2,), depth=4, children="top")  # the target: all accepted
    out = tree_generate(target, drafter, PROMPT, sampling=GREEDY, max_new_tokens=40,
                        k=TreeCostModel(k_max=4, clock=clock))
    assert out.stats.chosen_k[:2] == [0, 4]
    assert set(out.stats.chosen_k[2:]) == {0} and set(out.stats.tree_nodes[2:]) == {0}
    assert CountingDrafter.calls == 1
    reference = autoregressive_generate(target, PROMPT, sampling=GREEDY, max_new_tokens=40).tokens
    assert torch.equal(out.tokens, reference)


# ---------------------------------------------------------------- the rule on hand-set numbers


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


# ---------------------------------------------------------------- pruning keeps a valid tree


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


# ---------------------------------------------------------------- clear errors


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


# ---------------------------------------------------------------- power: a cut that looks at the tokens


class OneChildRule(TreeCostModel):
    """Every round: depth 1, one node (the cut keeps one of the root's i.i.d. children)."""

    def choose(self, limit, rows=1):
        return Choice(min(1, limit), 1)


def likeliest_child(tree, depth, nodes):
    """A wrong cut: keep the root child the draft finds most likely, which looks at the drawn tokens."""
    roots = (tree.parents == -1).nonzero().flatten()
    if roots.numel() == 0:  # a plain step
        return tree
    best = roots[tree.q[roots, tree.tokens[roots]].argmax()]
    return TreeDraft(tree.tokens[best][None], torch.tensor([-1]), tree.q[best][None], tree.modes[best][None])


@pytest.mark.parametrize("wrong", [False, True], ids=["first-child", "likeliest-child"])
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


def test_fixed_depth_and_default_record_the_depth():
    """k=int caps each round's depth; the default (k=None) records the depth the drafter chose."""
    target = tiny_model("llama", seed=0, scale=20.0)
    drafter = ModelTreeDrafter(perturbed_copy(target, 0.15), branches=(2,), depth=5)
    reference = hf_greedy(target, PROMPT, N_NEW)
    fixed = tree_generate(target, drafter, PROMPT, sampling=GREEDY, max_new_tokens=N_NEW, k=2)
    assert torch.equal(fixed.tokens, reference)
    assert max(fixed.stats.tree_depths) == 2 and fixed.stats.chosen_k == fixed.stats.tree_depths
    default = tree_generate(target, drafter, PROMPT, sampling=GREEDY, max_new_tokens=N_NEW)
    assert torch.equal(default.tokens, reference)
    assert default.stats.chosen_k == default.stats.tree_depths and max(default.stats.chosen_k) == 5
