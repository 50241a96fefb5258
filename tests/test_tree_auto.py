"""Token trees with k="auto": depth and node budget chosen each round by specdec.choose.tree_cost.TreeCostModel.

The rule sees only earlier rounds (their times, the children tried and the last proposal's shape), and the
drafter's tree is cut by depth, then drafter order (prune_tree), so the output keeps the target's
distribution (chi-square against exact enumeration) and equals the target's greedy output on every tiny
architecture. The same chi-square test rejects a cut that keeps the draft's likeliest sibling instead of
the first one (it looks at the drawn tokens). Timings come from injected clocks (random increments from their own seed), so the chosen
shapes vary from round to round and every test is deterministic.
"""


import pytest
import torch
from fakes import GREEDY_PROMPT, RandomClock, hf_greedy, log_target_passes, tree_round
from goodness_of_fit import PASS, chi_square_pvalue, sample_counts

from specdec import (
    GREEDY,
    HybridTreeDrafter,
    ModelTreeDrafter,
    NGramTreeDrafter,
    Sampling,
    autoregressive_generate,
    tree_generate,
)
from specdec.choose.tree_cost import TreeCostModel
from specdec.exact import sequence_distribution
from specdec.runtime.tiny import ARCHITECTURES, perturbed_copy, tiny_model

PROMPT = GREEDY_PROMPT
N_NEW = 30


# ---------------------------------------------------------------- greedy equality


# make test: llama here; every architecture's model tree with k chosen every round in test_greedy_matrix.py
@pytest.mark.parametrize("arch_case", [pytest.param(a, marks=() if a == "llama" else pytest.mark.exhaustive)
                                       for a in ARCHITECTURES], indirect=True)
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
    pytest.param(model_tree("distinct", (3, 2)), Sampling(1.0), id="distinct-T1",
                 marks=pytest.mark.exhaustive),  # make test: distinct children in hybrid-T1.5-topp and test_shared_cache.py
    pytest.param(model_tree("distinct"), Sampling(0.5, top_k=3), id="distinct-T0.5-topk",
                 marks=pytest.mark.exhaustive),  # make test: top-k in test_exactness.py's loop
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

    def choose(self, limit, rows=1, tokens=None):
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
    target, draft = small_vocab_pair
    rule = LoggedTreeCostModel(k_max=4, clock=RandomClock(3))
    log_target_passes(monkeypatch, rule.log)
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


# ---------------------------------------------------------------- pruning keeps a valid tree


# ---------------------------------------------------------------- clear errors


# ---------------------------------------------------------------- power: a cut that looks at the tokens


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
