"""Which draft, and how long, chosen again every round (specdec.choose.online): exact, greedy-equal, and quick to follow
a change of machine load.

Timings come from injected clocks. The load test uses a clock that the drafters themselves advance: a target
pass costs one time unit whatever its width, and a drafter adds its own cost per drafted token, which a
simulated burst of load multiplies for one of them.
"""

import pytest
import torch
from goodness_of_fit import in_make_test
from test_adaptive import NGRAM_PROMPT, SAMPLINGS, RandomClock, counts_of
from test_exactness import N_TOKENS, PROMPT, chi_square_pvalue
from test_greedy import hf_greedy

from specdec import (
    GREEDY,
    DraftSwitch,
    ModelDrafter,
    NGramDrafter,
    OnlineDraftChoice,
    OnlineThreadChoice,
    speculative_generate,
)
from specdec.exact import sequence_distribution
from specdec.runtime.tiny import perturbed_copy, tiny_model


def candidates(target, draft):
    return {"model": ModelDrafter(draft), "copy": ModelDrafter(perturbed_copy(target, 0.3)), "ngram": NGramDrafter()}


@pytest.mark.parametrize("sampling", in_make_test(SAMPLINGS, ("T1",)))
def test_online_choice_matches_target_distribution(small_vocab_pair, sampling):
    """One rule shared by all samples, a clock with random increments: drafts, lengths and plain steps all vary
    from round to round, and the output still has the target's distribution (and not the draft's)."""
    target, draft = small_vocab_pair
    switch = DraftSwitch(candidates(target, draft))
    rule = OnlineDraftChoice(switch, k_max=4, clock=RandomClock(5), probe_every=2, probe_most=4)
    chosen = []

    def generate(g):
        out = speculative_generate(target, switch, NGRAM_PROMPT, k=rule, sampling=sampling, max_new_tokens=N_TOKENS,
                                   generator=g)  # fmt: skip
        assert len(out.stats.chosen_draft) == len(out.stats.chosen_k)
        chosen.extend(out.stats.chosen_draft)
        return out.tokens

    counts = counts_of(generate, seed=3)
    assert chi_square_pvalue(counts, sequence_distribution(target, NGRAM_PROMPT, N_TOKENS, sampling)) > 1e-3
    assert chi_square_pvalue(counts, sequence_distribution(draft, NGRAM_PROMPT, N_TOKENS, sampling)) < 1e-4
    assert {"", "model", "copy", "ngram"} <= set(chosen)  # every candidate drafted, and plain steps were taken


class LoadClock:
    """A round reads the clock four times (draft phase start and end, verify phase start and end): the fourth
    reading adds the target pass's 1 time unit; drafters add their own cost to `now`."""

    def __init__(self):
        self.now = 0.0
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        self.now += 1.0 if self.readings % 4 == 0 else 0.0
        return self.now


class TimedDrafter(ModelDrafter):
    """A draft model whose tokens cost `unit` time units each, `loaded` times that while `busy(now)` holds."""

    def __init__(self, model, clock, unit, loaded=1.0, busy=lambda now: False):
        super().__init__(model)
        self.clock, self.unit, self.loaded, self.busy = clock, unit, loaded, busy

    def propose(self, sequence, k, sampling, vocab_size, generator):
        self.clock.now += k * self.unit * (self.loaded if self.busy(self.clock.now) else 1.0)
        return super().propose(sequence, k, sampling, vocab_size, generator)


def test_a_change_of_load_changes_the_draft_within_a_few_rounds():
    """Two drafts as good as the target (greedy, the target itself): `fast` (0.05 per token) wins on a quiet
    machine; a burst of load makes it 60 times slower (3 per token, slower than a target pass), and the rule
    moves to `steady` (0.3 per token) within a few rounds, then back to `fast` after the burst (by its probes)."""
    target = tiny_model("llama", seed=0, scale=20.0, n_layers=1)
    clock = LoadClock()
    start, end = 100.0, 220.0
    busy = lambda now: start <= now < end
    switch = DraftSwitch({"fast": TimedDrafter(target, clock, 0.05, 60.0, busy), "steady": TimedDrafter(target, clock, 0.3)})
    rule = OnlineDraftChoice(switch, k_max=4, clock=clock, probe_every=8, probe_most=16)
    rounds = []  # (time at the round's start, draft)
    choose = rule.choose

    def logged(limit, rows=1, tokens=None):
        choice = choose(limit, rows, tokens)
        rounds.append((clock.now, choice.draft))
        return choice

    rule.choose = logged
    prompt = torch.tensor([[0, 5, 3, 7, 5, 3]])
    expected = hf_greedy(target, prompt, 240)
    for _ in range(6):  # one rule across the prompts of a run, as experiments.run keeps it
        out = speculative_generate(target, switch, prompt, k=rule, sampling=GREEDY, max_new_tokens=240)
        assert torch.equal(out.tokens, expected)
    assert clock.now > end + 60
    quiet = [d for t, d in rounds if 20 <= t < start]
    loaded = [d for t, d in rounds if start <= t < end]
    after = [d for t, d in rounds if t >= end]
    assert quiet.count("fast") >= 0.8 * len(quiet)
    first_steady = next(i for i, d in enumerate(loaded) if d == "steady")
    assert first_steady <= 5, loaded[:10]  # the load moved the choice within a few rounds
    assert loaded[first_steady:].count("steady") >= 0.8 * len(loaded[first_steady:])
    back = next(i for i, d in enumerate(after) if d == "fast")
    assert back <= 16 + 3, after[:20]  # the next probe of `fast` finds it quick again
    assert after[back:].count("fast") >= 0.8 * len(after[back:])


def test_no_draft_pays_gives_plain_steps_with_bounded_probes():
    """Drafts slower than a target pass (4 and 6 units per token): the rule takes plain steps, probing each
    draft at most once per probe gap (doubling to probe_most)."""
    target = tiny_model("llama", seed=0, scale=20.0)
    clock = LoadClock()
    switch = DraftSwitch({"slow": TimedDrafter(perturbed_copy(target, 2.0), clock, 4.0),
                          "slower": TimedDrafter(perturbed_copy(target, 2.0), clock, 6.0)})
    rule = OnlineDraftChoice(switch, k_max=4, clock=clock, probe_every=4, probe_most=32)
    out = speculative_generate(target, switch, PROMPT, k=rule, sampling=GREEDY, max_new_tokens=240)
    drafts = out.stats.chosen_draft[10:]  # after the warm-up
    assert drafts.count("") >= 0.85 * len(drafts)
    for name in ("slow", "slower"):
        assert 0 < drafts.count(name) <= len(drafts) / 32 + 4  # probes: gaps 4, 8, 16, then every 32 rounds


def test_switch_and_rule_refuse_bad_input(small_vocab_pair):
    target, draft = small_vocab_pair
    switch = DraftSwitch(candidates(target, draft), default="copy")
    assert switch.selected == "copy"
    switch.use("ngram")
    switch.start([PROMPT])
    assert switch.selected == "copy"  # a new sequence starts with the default
    with pytest.raises(KeyError, match="no candidate 'nf4'"):
        switch.use("nf4")
    with pytest.raises(ValueError, match="at least one candidate"):
        DraftSwitch({})
    with pytest.raises(ValueError, match="probe_every <= probe_most"):
        OnlineDraftChoice(switch, probe_every=8, probe_most=4)
    other = OnlineDraftChoice(DraftSwitch(candidates(target, draft)))
    with pytest.raises(ValueError, match="another DraftSwitch"):
        speculative_generate(target, switch, PROMPT, k=other, max_new_tokens=4)
    out = speculative_generate(target, switch, PROMPT, k="auto", max_new_tokens=8)  # k="auto": an online choice
    assert len(out.stats.chosen_draft) == len(out.stats.chosen_k)


class ThreadedClock(LoadClock):
    """LoadClock whose target pass costs pass_cost[threads] units, the thread count being torch's (which the loop
    sets to the rule's choice each round); a burst of load (busy(now)) makes two threads slower than one, as on a
    2-core machine with a busy core."""

    def __init__(self, busy):
        super().__init__()
        self.busy = busy

    def __call__(self) -> float:
        self.readings += 1
        if self.readings % 4 == 0:
            quiet, loaded = {1: 1.6, 2: 1.0}, {1: 1.8, 2: 3.0}
            self.now += (loaded if self.busy(self.now) else quiet)[min(torch.get_num_threads(), 2)]
        return self.now


def test_thread_count_follows_the_load():
    """Two threads are faster on a quiet machine, one thread under a burst of load: the rule moves to one thread
    within a few rounds of the burst and back to two after it; output equal to the target's greedy output."""
    target = tiny_model("llama", seed=0, scale=20.0, n_layers=1)
    clock = ThreadedClock(lambda now: 75.0 <= now < 225.0)
    switch = DraftSwitch({"copy": TimedDrafter(target, clock, 0.2)})
    rules = {t: OnlineDraftChoice(switch, k_max=4, clock=clock) for t in (2, 1)}
    rule = OnlineThreadChoice(rules, probe_every=8, probe_most=16)
    prompt = torch.tensor([[0, 5, 3, 7, 5, 3]])
    expected, rounds = hf_greedy(target, prompt, 100), []
    while clock.now < 325:
        start = clock.now
        out = speculative_generate(target, switch, prompt, k=rule, sampling=GREEDY, max_new_tokens=100)
        assert torch.equal(out.tokens, expected)
        assert len(out.stats.chosen_threads) == len(out.stats.chosen_k)
        rounds.append((start, clock.now, out.stats.chosen_threads))
    quiet = [t for start, end, threads in rounds if end <= 75 for t in threads][10:]  # after the warm-ups
    loaded = [t for start, end, threads in rounds if start >= 75 and end <= 225 for t in threads]
    after = [t for start, end, threads in rounds if start >= 225 for t in threads][5:]  # the next probe of 2
    assert quiet and loaded and after
    assert quiet.count(2) >= 0.85 * len(quiet)
    assert loaded.count(1) >= 0.85 * len(loaded)
    assert after.count(2) >= 0.85 * len(after)
    first_loaded = next(threads for start, end, threads in rounds if end > 75)  # the generation the load began in
    assert 1 in first_loaded[:12]


@pytest.mark.exhaustive  # `make test-all`; test_thread_count_follows_the_load runs the thread choice in `make test`
def test_thread_choice_keeps_the_target_distribution(small_vocab_pair):
    """Thread counts that change from round to round (random clock, frequent probes): still the target's law."""
    target, draft = small_vocab_pair
    switch = DraftSwitch(candidates(target, draft))
    rules = {t: OnlineDraftChoice(switch, k_max=4, clock=RandomClock(t), probe_every=2, probe_most=4) for t in (1, 2)}
    rule = OnlineThreadChoice(rules, probe_every=2, probe_most=4)
    seen, choose = [], rule.choose

    def logged(limit, rows=1, tokens=None):
        choice = choose(limit, rows, tokens)
        seen.append(choice.threads)
        return choice

    rule.choose = logged
    sampling = SAMPLINGS[1].values[0]  # T = 1

    def generate(g):
        return speculative_generate(target, switch, NGRAM_PROMPT, k=rule, sampling=sampling, max_new_tokens=N_TOKENS,
                                    generator=g).tokens  # fmt: skip

    counts = counts_of(generate, seed=4)
    assert chi_square_pvalue(counts, sequence_distribution(target, NGRAM_PROMPT, N_TOKENS, sampling)) > 1e-3
    assert {1, 2} <= set(seen)
    with pytest.raises(ValueError, match="one DraftSwitch"):
        OnlineThreadChoice({1: rules[1], 2: OnlineDraftChoice(DraftSwitch(candidates(target, draft)))})


def test_lookup_replay_scores_hits_up_to_the_first_miss():
    """Hindsight on a lookup: the match order of the prefix, then 1.0 per proposed token that the text repeated and
    0.0 for the first that it did not; None while the text so far cannot tell; nothing to propose without a match."""
    lookup = NGramDrafter(max_ngram=3)
    prefix = torch.tensor([5, 6, 7, 8, 5, 6, 7])  # "5 6 7" occurred before, followed by "8 5 6 7"
    assert lookup.replay(prefix, [8, 5, 9], k=4) == (3, [1.0, 1.0, 0.0])
    assert lookup.replay(prefix, [9, 8], k=4) == (3, [0.0])
    assert lookup.replay(prefix, [8], k=4) is None  # the second proposed token is not written yet
    assert lookup.replay(prefix, [8, 5], k=2) == (3, [1.0, 1.0])  # k tokens, all hit
    assert lookup.replay(torch.tensor([5, 6, 9, 6]), [1], k=4) == (1, [0.0])  # only "6" occurred before
    assert lookup.replay(torch.tensor([1, 2, 3]), [4], k=4) == (0, [])
    assert lookup.context([prefix[None], torch.tensor([[5, 6, 9, 6]])]) == 1  # the shortest order over rows


def test_hindsight_learns_lookup_per_context_and_drafts_with_it_where_the_text_repeats():
    """Lookup's acceptance is learned from the text written, whichever draft ran: where the text copies its prompt,
    lookup (free) beats a draft model (0.3 a token, alpha 0.8) in the match order of that text; where the text has
    no match, lookup is idle; the prompt itself teaches nothing."""
    target = tiny_model("llama", seed=0, vocab_size=128)
    switch = DraftSwitch({"model": ModelDrafter(target), "ngram": NGramDrafter()})
    rule = OnlineDraftChoice(switch, k_max=4, prior={"model": 0.8})
    rule.seed({1: 1.0, 5: 1.2}, {"model": 0.3, "ngram": 0.001})
    words = torch.randint(0, 60, (1, 39), generator=torch.Generator().manual_seed(0))
    prompt = torch.cat([words, torch.tensor([[61]])], dim=1)  # its last token occurs nowhere before it
    assert rule.hindsight([prompt]) == []  # rows the switch has not started: nothing to look back on
    switch.start([prompt])
    assert rule.choose(10, tokens=[prompt]).draft == "model" and rule.idle == {"ngram"}
    assert rule.contexts["ngram"] == {}  # no evidence from the prompt
    copying = torch.cat([prompt, prompt[:, :30]], dim=1)  # the text copies 30 tokens of its prompt
    choice = rule.choose(10, tokens=[copying])
    assert choice.draft == "ngram" and choice.k == 4
    third = rule.contexts["ngram"][3]
    assert third.acceptance()[0] > 0.9
    assert switch.replayed == [copying.shape[1] - 3]  # the last positions wait for the tokens that decide them
    records, first = third.first_count, third.acceptance()[0]
    fresh = torch.cat([copying, torch.arange(100, 110)[None]], dim=1)  # tokens never seen: no match after the first
    assert rule.choose(10, tokens=[fresh]).draft == "model" and rule.idle == {"ngram"}
    assert third.first_count == records + 4  # the 3 waiting positions, then the miss at "100"; none after it
    assert third.acceptance()[0] < first
    assert switch.replayed == [fresh.shape[1]]
    switch.start([prompt, prompt[:, :5]])
    switch.select([1])
    assert switch.replayed == [5]  # the rows that go on keep their own place in the text


def test_a_thread_probe_does_not_repeat_a_lookup_that_has_no_match_now():
    """A count not yet measured is probed with the best count's last round; when that round drafted with lookup
    and the text now has no match, the probe is a plain step (a 1-token pass), not a lookup that proposes nothing
    timed as a wider pass."""
    target = tiny_model("llama", seed=0, vocab_size=128)
    prompt = torch.tensor([[3, 4, 5, 6, 7]])  # no token occurs twice: lookup has no match

    def probe(last_round):
        switch = DraftSwitch({"model": ModelDrafter(target), "ngram": NGramDrafter()})
        rules = {t: OnlineDraftChoice(switch, k_max=4) for t in (2, 1)}
        rules[2].seed({1: 1.0, 5: 1.2}, {"model": 0.3, "ngram": 0.001})  # count 2 measured, count 1 not
        rule = OnlineThreadChoice(rules, probe_every=1, probe_most=4)
        switch.start([prompt])
        rule.last_round = last_round
        choice = rule.choose(10, tokens=[prompt])
        return choice.threads, choice.k, choice.draft, rule.probe_width[1]

    assert probe((4, "ngram")) == (1, 0, "", 1)
    assert probe((4, "model")) == (1, 4, "model", 5)  # a draft that can propose: the round repeated


def test_round_statistics_share_the_rounds_among_the_drafts_and_thread_counts_chosen():
    """specdec.metrics.round_statistics over two generations' rounds: means, shares ("" is a plain step) and
    histograms up to k_max."""
    from specdec.metrics import Stats, round_statistics

    first = Stats(target_forwards=3, accepted_per_round=[1, 2, 0], chosen_k=[2, 3, 0], chosen_draft=["a", "b", ""],
                  chosen_threads=[1, 2, 2], predicted_tokens=2.5, predicted_seconds=0.1, measured_tokens=3,
                  measured_seconds=0.2)  # fmt: skip
    second = Stats(target_forwards=2, accepted_per_round=[4, 1], chosen_k=[4, 4], chosen_draft=["a", "a"],
                   chosen_threads=[1, 1])  # fmt: skip
    metrics, histograms = round_statistics([first, second], longest=5)
    assert metrics["rounds"] == 5 and metrics["accepted_depth_mean"] == pytest.approx(1.6)
    assert metrics["plain_step_share"] == pytest.approx(0.2) and metrics["chosen_k_mean"] == pytest.approx(2.6)
    assert (metrics["draft_share/a"], metrics["draft_share/b"]) == (pytest.approx(0.6), pytest.approx(0.2))
    assert metrics["threads_share/2"] == pytest.approx(0.4) and "tree_nodes_mean" not in metrics
    assert metrics["predicted_over_measured"] == pytest.approx(25 / 15)
    assert histograms == {"accepted_depth": [1, 2, 1, 0, 1, 0], "chosen_k": [1, 0, 1, 1, 2, 0]}
    assert round_statistics([]) == ({}, {})


def test_a_switch_drafts_with_its_candidates_kinds():
    from specdec import DraftSwitch, NGramDrafter
    from specdec.draft.head import DraftHead
    from specdec.draft.head_drafter import HeadDrafter
    from specdec.draft.switch import draft_kind, draft_kinds
    from specdec.runtime.tiny import tiny_model

    head, lookup = HeadDrafter(DraftHead(tiny_model("llama", seed=0))), NGramDrafter()
    assert draft_kind(head) == "head" and draft_kind(lookup) == "ngram"
    assert draft_kinds(DraftSwitch({"head": head, "ngram": lookup})) == ["head", "ngram"]
    assert draft_kinds(DraftSwitch({"a": lookup, "b": NGramDrafter()})) == ["ngram"]
