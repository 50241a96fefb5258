"""k="auto": the draft length chosen each round by the online cost model (specdec.choose.cost).

The rule sees only earlier rounds, so the output keeps the target's distribution (chi-square on a
5-token vocabulary, model and n-gram drafters) and equals the target's greedy output on every tiny
architecture. Timings come from injected clocks, so every test is deterministic; a clock with random
increments (its own seed, independent of the sampling) makes the chosen k vary from round to round.
"""


import pytest
import torch
from fakes import RandomClock, chain_round, log_target_passes
from goodness_of_fit import in_make_test
from test_exactness import N_TOKENS, PROMPT, chi_square_pvalue
from test_greedy import hf_greedy

from specdec import (
    GREEDY,
    CostModel,
    ModelDrafter,
    NGramDrafter,
    Sampling,
    autoregressive_generate,
    speculative_generate,
)
from specdec.choose.cost import Choice
from specdec.exact import sequence_distribution, sequence_index
from specdec.runtime.tiny import perturbed_copy, tiny_model

N_SAMPLES = 600  # each sample is a whole generation; enough to reject the draft's distribution
NGRAM_PROMPT = torch.tensor([[0, 3, 1, 2, 3, 1, 2, 4, 3, 1]])


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


# make test: one sampling per drafter (top-k and top-p at a fixed k in test_exactness.py; top-p here with n-grams)
@pytest.mark.parametrize("sampling", in_make_test(SAMPLINGS, ("T1",)))
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


@pytest.mark.parametrize("sampling", in_make_test(SAMPLINGS, ("top_p0.8",)))
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


class ScriptedRule(CostModel):
    """Draft lengths from a script (then k_max): long runs of plain steps between drafts."""

    def __init__(self, script, k_max):
        super().__init__(k_max)
        self.script = list(script)

    def choose(self, limit, rows=1, tokens=None):
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

    def choose(self, limit, rows=1, tokens=None):
        choice = super().choose(limit)
        self.log.append(("choose", limit, choice.k))
        return choice

    def observe(self, round):
        self.log.append(("observe", round.choice.k, round.verified.size, round.overlaps[0].clone(), dict(round.seconds)))
        super().observe(round)


def test_choice_depends_only_on_earlier_rounds(small_vocab_pair, monkeypatch):
    """Each round chooses k before its target pass, and replaying the earlier observations alone gives
    the same choices: this round's p cannot have influenced its k."""
    target, draft = small_vocab_pair
    rule = LoggedCostModel(k_max=4, clock=RandomClock(3))
    log_target_passes(monkeypatch, rule.log)
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


# clear errors -------------------------------------------------------------------------------------------


