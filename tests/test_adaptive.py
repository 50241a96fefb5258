"""k="auto": the draft length chosen each round by the online cost model (specdec.choose.cost).

The rule sees only earlier rounds, so the output keeps the target's distribution (chi-square on a
5-token vocabulary, model and n-gram drafters) and equals the target's greedy output on every tiny
architecture. Timings come from injected clocks, so every test is deterministic; a clock with random
increments (its own seed, independent of the sampling) makes the chosen k vary from round to round.
"""

import random

import pytest
import torch
from fakes import BareDrafter, chain_round
from test_exactness import N_TOKENS, PROMPT, chi_square_pvalue
from test_greedy import hf_greedy

from specdec import (
    GREEDY,
    CostModel,
    ModelDrafter,
    NGramDrafter,
    Sampling,
    TreeCostModel,
    autoregressive_generate,
    speculative_generate,
)
from specdec.choose.cost import Choice
from specdec.exact import sequence_distribution, sequence_index
from specdec.runtime.tiny import ARCHITECTURES, perturbed_copy, tiny_model
from specdec.theory import best_draft_length, expected_tokens

N_SAMPLES = 600  # each sample is a whole generation; enough to reject the draft's distribution
NGRAM_PROMPT = torch.tensor([[0, 3, 1, 2, 3, 1, 2, 4, 3, 1]])


class RandomClock:
    """Each reading advances time by a uniform amount in [0, 1): varied, reproducible round costs."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.rng.random()
        return self.now


def counts_of(generate, seed: int) -> torch.Tensor:
    """Histogram of N_SAMPLES continuations over the vocab**N_TOKENS outcomes (5-token vocabulary)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(5**N_TOKENS, dtype=torch.float64)
    for _ in range(N_SAMPLES):
        counts[sequence_index(generate(g), 5)] += 1
    return counts


SAMPLINGS = [
    pytest.param(Sampling(0.5), id="T0.5"),
    pytest.param(Sampling(1.0), id="T1"),
    pytest.param(Sampling(1.5), id="T1.5"),
    pytest.param(Sampling(1.0, top_k=3), id="top_k3"),
    pytest.param(Sampling(1.0, top_p=0.8), id="top_p0.8"),
]


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_auto_with_model_drafter_matches_target_distribution(small_vocab_pair, sampling):
    """One cost model shared by all samples, so later samples run on estimates, not on the warm-up."""
    target, draft = small_vocab_pair
    drafter = ModelDrafter(draft)
    rule = CostModel(k_max=4, clock=RandomClock())
    chosen = []

    def generate(g):
        out = speculative_generate(target, drafter, PROMPT, k=rule, sampling=sampling, max_new_tokens=N_TOKENS,
                                   generator=g)
        chosen.extend(out.stats.chosen_k)
        return out.tokens

    counts = counts_of(generate, seed=1)
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) > 1e-3
    assert chi_square_pvalue(counts, sequence_distribution(draft, PROMPT, N_TOKENS, sampling)) < 1e-4
    assert {0, 1} <= set(chosen)  # plain steps and drafts were both exercised


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_auto_with_ngram_drafter_matches_target_distribution(small_vocab_pair, sampling):
    target, _ = small_vocab_pair
    rule = CostModel(k_max=4, draft_cost="per_call", clock=RandomClock())
    chosen = []

    def generate(g):
        out = speculative_generate(target, NGramDrafter(), NGRAM_PROMPT, k=rule, sampling=sampling,
                                   max_new_tokens=N_TOKENS, generator=g)
        chosen.extend(out.stats.chosen_k)
        return out.tokens

    counts = counts_of(generate, seed=2)
    assert chi_square_pvalue(counts, sequence_distribution(target, NGRAM_PROMPT, N_TOKENS, sampling)) > 1e-3
    assert {0, 1} <= set(chosen)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_target(request):
    return request.param, tiny_model(request.param, seed=0, scale=20.0)


@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_auto_greedy_equals_target_greedy(arch_target, kind):
    arch, target = arch_target
    prompt, n_new = torch.tensor([[0, 5, 3, 7, 5, 3]]), 30
    drafter = ModelDrafter(perturbed_copy(target, 0.15)) if kind == "model" else NGramDrafter()
    rule = CostModel(k_max=8, draft_cost=drafter.draft_cost, clock=RandomClock())  # k_max + 1 > window 6
    out = speculative_generate(target, drafter, prompt, k=rule, sampling=GREEDY, max_new_tokens=n_new)
    assert torch.equal(out.tokens, hf_greedy(target, prompt, n_new)), arch
    assert len(set(out.stats.chosen_k)) >= 3
    assert sum(out.stats.chosen_k_histogram) == out.stats.target_forwards


class ScriptedRule(CostModel):
    """Draft lengths from a script (then k_max): long runs of plain steps between drafts."""

    def __init__(self, script, k_max):
        super().__init__(k_max)
        self.script = list(script)

    def choose(self, limit, rows=1):
        return Choice(min(self.script.pop(0) if self.script else self.k_max, limit))


@pytest.mark.parametrize("arch", ["llama", "gemma2", "mistral", "qwen2"])
def test_draft_cache_catches_up_after_plain_steps(arch):
    """Plain steps do not call the drafter; its next proposal feeds the whole unseen tail (longer than the
    sliding window of 6) in one forward, and the output still equals the target's greedy output."""
    target = tiny_model(arch, seed=0, scale=20.0)
    prompt = torch.tensor([[0, 5, 3, 7, 5, 3]])
    drafter = ModelDrafter(perturbed_copy(target, 0.15))
    rule = ScriptedRule([0] * 9 + [3, 0, 0, 5] + [0] * 8 + [1, 2], k_max=4)
    out = speculative_generate(target, drafter, prompt, k=rule, sampling=GREEDY, max_new_tokens=40)
    assert torch.equal(out.tokens, hf_greedy(target, prompt, 40)), arch
    assert out.stats.chosen_k[:10] == [0] * 9 + [3]
    assert out.stats.draft_forwards == sum(out.stats.chosen_k)


class LoggedCostModel(CostModel):
    """A cost model that logs every choice and every observation, in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log = []

    def choose(self, limit, rows=1):
        choice = super().choose(limit)
        self.log.append(("choose", limit, choice.k))
        return choice

    def observe(self, round):
        self.log.append(("observe", round.choice.k, round.verified.size, round.overlaps[0].clone(), dict(round.seconds)))
        super().observe(round)


def test_choice_depends_only_on_earlier_rounds(small_vocab_pair, monkeypatch):
    """Each round chooses k before its target pass, and replaying the earlier observations alone gives
    the same choices: this round's p cannot have influenced its k."""
    from specdec.draft.proposal import RowProposals

    target, draft = small_vocab_pair
    rule = LoggedCostModel(k_max=4, clock=RandomClock(3))
    score = RowProposals.score

    def logged_score(self, *args, **kwargs):
        rule.log.append(("verify",))
        return score(self, *args, **kwargs)

    monkeypatch.setattr(RowProposals, "score", logged_score)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        speculative_generate(target, ModelDrafter(draft), PROMPT, k=rule, max_new_tokens=24, generator=g)
    assert [event[0] for event in rule.log] == ["choose", "verify", "observe"] * (len(rule.log) // 3)

    replay = CostModel(k_max=4)
    for event in rule.log:
        if event[0] == "choose":
            assert replay.choose(event[1]).k == event[2]
        elif event[0] == "observe":
            replay.observe(chain_round(*event[1:]))
    assert len({e[2] for e in rule.log if e[0] == "choose"}) >= 3


class SlowDrafter(ModelDrafter):
    """A model drafter whose every draft token takes 50 time units of the fake clock; counts its calls."""

    def __init__(self, model, clock):
        super().__init__(model)
        self.clock = clock
        self.calls = 0

    def propose(self, sequences, k, sampling, vocab_size, generator):
        self.calls += 1
        self.clock.now += 50.0 * k
        return super().propose(sequences, k, sampling, vocab_size, generator)


def test_expensive_draft_falls_back_to_plain_steps():
    """After the warm-up round, drafting never pays: every round is a plain step, the drafter is not
    called again, and the output is the target's own greedy output."""
    target = tiny_model("llama", seed=0, scale=20.0)
    clock = RandomClock(4)
    drafter = SlowDrafter(target, clock)  # the target itself: every draft token would be accepted
    prompt = torch.tensor([[0, 5, 3, 7, 5, 3]])
    out = speculative_generate(target, drafter, prompt, k=CostModel(k_max=4, clock=clock), sampling=GREEDY,
                               max_new_tokens=40)
    assert out.stats.chosen_k[:2] == [0, 4]  # warm-up: a plain step, then the longest draft
    assert set(out.stats.chosen_k[2:]) == {0}
    assert drafter.calls == 1
    reference = autoregressive_generate(target, prompt, sampling=GREEDY, max_new_tokens=40).tokens
    assert torch.equal(out.tokens, reference)


# the rule on hand-set numbers ----------------------------------------------------------------------------


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


# clear errors -------------------------------------------------------------------------------------------


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
