"""The cost model on hand-set numbers: E(k) / C(k) maximised, warm-up, pass-time interpolation, plain steps that do not freeze it, and clear errors."""


import pytest
import torch
from fakes import BareDrafter, chain_round
from test_exactness import PROMPT

from specdec import (
    CostModel,
    ModelDrafter,
    NGramDrafter,
    TreeCostModel,
    speculative_generate,
)
from specdec.theory import best_draft_length, expected_tokens


def test_expected_tokens_is_the_sum_of_reach_probabilities():
    assert expected_tokens([]) == 1.0
    assert expected_tokens([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.8] * 4) == pytest.approx((1 - 0.8**5) / (1 - 0.8))  # Leviathan Eq. 1


def hand_set_model(acceptance, pass_seconds, draft_seconds, draft_cost="per_token"):
    """A CostModel fed recorded timings and acceptance, as if it had watched many rounds."""
    model = CostModel(k_max=len(acceptance), draft_cost=draft_cost, decay=1.0)
    for width, seconds in pass_seconds.items():
        model.record_pass(width, seconds)
    model.record_draft(1 if draft_cost == "per_token" else 5, draft_seconds)
    for _ in range(10_000):
        model.record_acceptance(acceptance)
    return model


@pytest.mark.parametrize(
    "acceptance, passes, draft",
    [
        ([0.9, 0.8, 0.7, 0.6, 0.5], {1: 1.0, 2: 1.1, 6: 1.5}, 0.1),
        ([0.3, 0.3, 0.3, 0.3], {1: 1.0, 5: 1.6}, 0.2),  # a poor, slow draft on a costly wide pass: k = 0
        ([0.95] * 8, {1: 1.0, 9: 1.2}, 0.02),
        ([0.6, 0.9, 0.9, 0.2], {1: 1.0, 2: 1.0, 3: 1.4, 5: 1.5}, 0.0),
    ],
)
def test_choice_maximises_expected_tokens_per_second(acceptance, passes, draft):
    model = hand_set_model(acceptance, passes, draft)
    a = model.acceptance()
    assert a == pytest.approx(acceptance, abs=1e-3)

    def rate(k):
        return sum(torch.tensor(a[:j]).prod().item() for j in range(k + 1)) / (model.pass_seconds(k + 1) + k * draft)

    best = max(range(len(a) + 1), key=rate)
    choice = model.choose(limit=100)
    assert choice.k == best
    assert choice.expected_tokens / choice.seconds == pytest.approx(rate(best))
    assert model.choose(limit=1).k == max((0, 1), key=rate)  # never past the budget


def test_hand_set_choices():
    """Worked numbers: T_pass(1) = 1, T_pass(w) = 1 + 0.1 (w - 1), a draft token 0.1, a_i = 0.8."""
    model = hand_set_model([0.8] * 8, {1: 1.0, 9: 1.8}, 0.1)
    assert model.pass_seconds(5) == pytest.approx(1.4)  # interpolated
    # E(k) / C(k) = (1 - 0.8^(k+1)) / 0.2 / (1 + 0.2 k): 1.5, 1.743, 1.845, 1.868, 1.845 at k = 1..5
    assert model.choose(8).k == 4
    assert best_draft_length([0.8] * 8, model.cost) == 4
    assert hand_set_model([0.1] * 8, {1: 1.0, 9: 1.8}, 0.1).choose(8).k == 0  # 1.1 / 1.2 < 1 / 1


def test_per_call_drafts_cost_the_same_for_any_length():
    model = hand_set_model([0.7] * 6, {1: 1.0, 7: 1.0}, 0.3, draft_cost="per_call")
    assert model.draft_seconds(1) == model.draft_seconds(6) == pytest.approx(0.3)
    assert model.choose(6).k == 6  # a free wide pass and a flat draft cost: the longest draft wins


def test_pass_time_interpolation_never_below_a_step():
    model = CostModel(k_max=8)
    model.record_pass(1, 1.0)
    assert model.pass_seconds(5) == 1.0  # one width measured: constant
    for seconds in (2.0, 9.0, 2.0):  # the median resists the outlier
        model.record_pass(5, seconds)
    assert model.pass_seconds(5) == 2.0
    assert model.pass_seconds(3) == pytest.approx(1.5)
    assert model.pass_seconds(9) == pytest.approx(3.0)  # extrapolated
    model = CostModel(k_max=8)
    model.record_pass(1, 1.0)
    model.record_pass(3, 0.9)  # noise: wider measured faster than a step
    model.record_pass(9, 0.8)
    assert model.pass_seconds(5) >= 1.0


def test_warm_up_then_formula():
    model = CostModel(k_max=5)
    assert model.choose(10).k == 0  # first: a plain step
    model.observe(chain_round(0, 0, torch.zeros(0), {"verify": 1.0}))
    assert model.choose(10).k == 5  # then the longest draft
    assert model.choose(2).k == 2  # within the budget
    model.observe(chain_round(5, 5, torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0]), {"draft": 0.5, "verify": 1.2}))
    choice = model.choose(10)
    assert model.ready and choice.prediction is not None
    assert choice.k == best_draft_length(model.acceptance(), model.cost)


def test_a_round_that_compiled_a_graph_is_learned_without_its_times():
    """Warm-up repeats a step whose seconds timed a compile; a compiling draft round gives acceptance, no times."""
    model = CostModel(k_max=5)
    model.observe(chain_round(0, 0, torch.zeros(0), {"verify": 56.0}, timed=False))
    assert not model.pass_times and model.choose(10).k == 0  # the plain step again
    model.observe(chain_round(0, 0, torch.zeros(0), {"verify": 0.05}))
    model.observe(chain_round(5, 5, torch.tensor([1.0, 1.0, 0.0]), {"draft": 0.5, "verify": 48.0}, timed=False))
    assert set(model.pass_times) == {1} and not model.draft_times and not model.ready
    assert model.acceptance()[0] > model.prior  # its acceptance counted
    assert model.choose(10).k == 5  # the longest draft again, to time it


def test_plain_steps_do_not_freeze_the_rule():
    """A bad draft sends the rule to k = 0; its evidence then decays and drafting is tried again."""
    model = hand_set_model([0.05] * 4, {1: 1.0, 5: 1.2}, 0.05)
    model.decay = 0.9
    rounds = 0
    while model.choose(4).k == 0:
        model.observe(chain_round(0, 0, torch.zeros(0), {"verify": 1.0}))
        rounds += 1
        assert rounds < 1000
    assert rounds > 10  # not at once: the bad evidence is forgotten gradually


def test_stats_record_prediction_and_histogram(small_vocab_pair):
    target, draft = small_vocab_pair
    out = speculative_generate(target, ModelDrafter(draft), PROMPT, k="auto", k_max=3, max_new_tokens=40,
                               generator=torch.Generator().manual_seed(0))
    s = out.stats
    assert len(s.chosen_k) == s.target_forwards and s.chosen_k[0] == 0
    assert sum(s.chosen_k_histogram) == len(s.chosen_k)
    assert s.predicted_seconds > 0 and s.measured_seconds > 0 and s.measured_tokens > 0
    summary = s.summary()
    assert summary["predicted_tokens_per_second"] > 0 and summary["measured_tokens_per_second"] > 0


def test_auto_refuses_a_drafter_without_draft_cost(small_vocab_pair):
    target, _ = small_vocab_pair
    with pytest.raises(ValueError, match="draft_cost = 'per_token' on BareDrafter"):
        speculative_generate(target, BareDrafter(), PROMPT, k="auto")
    with pytest.raises(ValueError, match="draft_cost = 'per_token' on BareDrafter"):
        speculative_generate(target, BareDrafter(), PROMPT, k=CostModel())


def test_bad_k_values(small_vocab_pair):
    target, draft = small_vocab_pair
    drafter = ModelDrafter(draft)
    with pytest.raises(ValueError, match="'auto' or a rule"):
        speculative_generate(target, drafter, PROMPT, k="fast")
    with pytest.raises(TypeError, match="needs a CostModel"):
        speculative_generate(target, drafter, PROMPT, k=TreeCostModel())
    with pytest.raises(ValueError, match="k_max"):
        speculative_generate(target, drafter, PROMPT, k="auto", k_max=0)
    with pytest.raises(ValueError, match="k \\(draft tokens"):
        speculative_generate(target, drafter, PROMPT, k=0)
    with pytest.raises(ValueError, match="CostModel\\(draft_cost='per_call'\\)"):
        speculative_generate(target, NGramDrafter(), PROMPT, k=CostModel(draft_cost="per_token"))


def test_auto_on_a_compiled_target_drafts_no_longer_than_its_graphs_hold():
    """A chain of k needs a pass of k + 1 tokens: on the compiled runtime with graphs of widths 1, 2, 4, k='auto'
    chooses k <= 3 (a wider pass would run eager); eager targets and trees keep k_max."""
    from specdec import NGramDrafter
    from specdec.choose.rules import rule_for
    from specdec.runtime.compiled import compile_model, eager_model
    from specdec.runtime.tiny import tiny_model

    target, drafter = tiny_model("llama", seed=0), NGramDrafter()
    assert rule_for("auto", drafter, target=target).k_max == 8
    compile_model(target, widths=(1, 2, 4), capacity=64)
    try:
        assert rule_for("auto", drafter, target=target).k_max == 3
        assert rule_for("auto", drafter, k_max=2, target=target).k_max == 2
        assert rule_for("auto", drafter, trees=True, target=target).k_max == 8
    finally:
        eager_model(target)
    assert rule_for("auto", drafter, target=target).k_max == 8


def test_a_rule_that_switches_threads_is_refused_on_a_compiled_target():
    """Dynamo guards a compiled graph on the thread count it was built at: an OnlineThreadChoice would compile the
    target's graphs again in timed rounds. On an eager target it is taken as given."""
    from specdec import DraftSwitch, NGramDrafter, OnlineDraftChoice, OnlineThreadChoice
    from specdec.choose.rules import rule_for
    from specdec.runtime.compiled import compile_model, eager_model
    from specdec.runtime.tiny import tiny_model

    target = tiny_model("llama", seed=0)
    switch = DraftSwitch({"a": NGramDrafter(), "b": NGramDrafter(max_ngram=2)}, default="a")
    rule = OnlineThreadChoice({1: OnlineDraftChoice(switch, 4), 2: OnlineDraftChoice(switch, 4)})
    assert rule_for(rule, switch, target=target) is rule
    compile_model(target, widths=(1, 2, 4), capacity=64)  # graphs compile at first use: none here
    try:
        with pytest.raises(ValueError, match="thread count"):
            rule_for(rule, switch, target=target)
        assert rule_for(rule.rules[1], switch, target=target) is rule.rules[1]
    finally:
        eager_model(target)


def test_a_learning_prior_is_the_runs_mean_first_acceptance():
    """prior_weight: evidence that decays falls back to the run's mean beta_1 (the prior counting as prior_weight
    rounds), not to the optimistic prior: a lookup that kept failing is not tried again every few rounds."""
    fixed, learning = CostModel(4, "per_call"), CostModel(4, "per_call", prior_weight=2.0)
    for model in (fixed, learning):
        for _ in range(6):
            model.record_acceptance([0.0])
        for _ in range(60):  # rounds in which it did not draft: its evidence decays
            model.record_acceptance()
    assert learning.current_prior() == pytest.approx(0.9 * 2 / 8)
    assert learning.acceptance()[0] == pytest.approx(0.225, abs=0.01)
    assert fixed.acceptance()[0] == pytest.approx(0.9, abs=0.01) and fixed.current_prior() == 0.9
    learning.record_acceptance([1.0, 1.0])
    assert learning.current_prior() == pytest.approx((1.8 + 1.0) / 9)
    with pytest.raises(ValueError, match="prior_weight"):
        CostModel(4, prior_weight=0.0)
