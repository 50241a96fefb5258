"""Draft calibration: the choice follows the predicted speedup of injected timings; slow drafts are named."""

import gc
import logging
import math
import weakref
from dataclasses import replace

import pytest
import torch

from specdec import (
    GREEDY,
    DraftSwitch,
    NGramTreeDrafter,
    OnlineDraftChoice,
    TokenLevel,
    TreeRules,
    autoregressive_generate,
    speculative_generate,
)
from specdec.auto.calibration import (
    Calibration,
    CandidateResult,
    Timings,
    alpha_from_tokens_per_pass,
    calibrate,
    calibrate_in_turn,
    kept_names,
    measure_alpha,
    measure_timings,
)
from specdec.auto.setup import online_rule, prepare, run_rule
from specdec.auto.threads import use_threads
from specdec.choose.cost import CostModel
from specdec.draft.model import ModelDrafter
from specdec.draft.ngram import NGramDrafter
from specdec.runtime.models import bfloat16_copy
from specdec.runtime.probes import ThreadChoice, choose_threads
from specdec.runtime.tiny import tiny_model
from specdec.theory import expected_tokens_per_pass, walltime_improvement

PROMPT = torch.tensor([[1, 2, 3, 4, 5, 1, 2, 3]])


class Unprobed:
    """A draft model candidate that fails the test if anything asks it for a draft."""

    draft_cost = "per_token"
    vocab_size = None

    def start(self, prompt):
        raise AssertionError("this candidate cannot win and must not be probed")


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, scale=20.0, vocab_size=32)


def timings(step: float = 100.0, **draft_ms: float) -> Timings:
    """A target whose pass over w tokens costs step * (1 + 0.1 (w - 1)) ms; draft units as given."""
    return Timings({w: step * (1 + 0.1 * (w - 1)) for w in (1, 3, 5, 9)}, dict(draft_ms))


def test_alpha_inverts_eq_1():
    for alpha, k in [(0.1, 1), (0.5, 4), (0.93, 8)]:
        assert alpha_from_tokens_per_pass(expected_tokens_per_pass(alpha, k), k) == pytest.approx(alpha, abs=1e-9)
    assert alpha_from_tokens_per_pass(1.0, 4) == pytest.approx(0.0, abs=1e-9)
    assert alpha_from_tokens_per_pass(5.0, 4) == pytest.approx(1.0, abs=1e-9)


def test_pass_cost_is_interpolated_and_never_below_one_step():
    t = timings()
    assert t.pass_cost(5) == pytest.approx(1.4)
    assert t.pass_cost(7) == pytest.approx(1.6)  # between measured widths 5 and 9
    noisy = Timings({1: 100.0, 3: 90.0, 5: 95.0, 9: 120.0}, {})
    assert noisy.pass_cost(3) == 1.0


def test_calibration_picks_the_best_predicted_speedup(target):
    drafters = {"nf4": NGramDrafter(), "bfloat16": NGramDrafter(), "dynamic_int8": NGramDrafter()}
    for d in drafters.values():
        d.draft_cost = "per_token"  # instance attribute: priced like a draft model
    t = timings(nf4=30.0, bfloat16=60.0, dynamic_int8=20.0)
    alphas = {"nf4": 0.8, "bfloat16": 0.95, "dynamic_int8": 0.6}
    cal = calibrate(target, drafters, PROMPT, k=4, timings=t, alphas=alphas)
    expected = {n: walltime_improvement(alphas[n], t.draft_ms[n] / 100, 4, t.pass_cost(5)) for n in alphas}
    assert cal.chosen == max(expected, key=expected.get) == "nf4"
    assert [r.name for r in cal.results] == sorted(expected, key=lambda n: -expected[n])
    for r in cal.results:
        assert r.speedup == pytest.approx(expected[r.name])
        assert r.c == pytest.approx(t.draft_ms[r.name] / 100)
        assert r.best_speedup >= r.speedup
    assert cal.reason.startswith("nf4: predicted")
    assert "cannot gain" not in cal.reason  # every c is below 1
    # cheaper drafting (smaller c) flips the choice
    faster = timings(nf4=30.0, bfloat16=60.0, dynamic_int8=2.0)
    assert calibrate(target, drafters, PROMPT, k=4, timings=faster, alphas=alphas).chosen == "dynamic_int8"


def test_non_fused_nf4_slower_than_the_target_is_not_chosen(target):
    """Without AVX512-BF16 (or with specdec.runtime.models.force_unfused_4bit) the nf4 copy costs more than a target
    step: even with the best alpha it loses to a cheaper draft, and the summary says it cannot gain."""
    drafters = {"nf4": Unprobed(), "bfloat16": ModelDrafter(bfloat16_copy(target)), "ngram": NGramDrafter()}
    t = timings(nf4=250.0, bfloat16=50.0, ngram=0.2)
    cal = calibrate(target, drafters, PROMPT, k=4, timings=t)  # alphas measured (tiny model), nf4 skipped
    nf4 = next(r for r in cal.results if r.name == "nf4")
    assert cal.chosen != "nf4"
    assert nf4.c == pytest.approx(2.5) and nf4.slower_than_target and math.isnan(nf4.alpha)
    assert nf4.speedup < 1.0  # an upper bound (alpha = 1) and still a slowdown
    assert "Slower than the target (c > 1): nf4; speculative decoding cannot gain with that draft" in cal.reason
    assert "Not probed" in cal.reason
    assert all(0.0 <= r.alpha <= 1.0 for r in cal.results if r.name != "nf4")


def test_every_candidate_slower_than_the_target_is_reported(target):
    drafters = {"int8": Unprobed(), "nf4": Unprobed()}
    cal = calibrate(target, drafters, PROMPT, k=2, timings=timings(int8=150.0, nf4=300.0), alphas={"int8": 0.9,
                    "nf4": 0.7})  # fmt: skip
    assert cal.chosen == "int8"
    assert "No candidate is predicted to beat the target alone" in cal.reason
    assert "Slower than the target (c > 1): int8, nf4; speculative decoding cannot gain with those drafts" in cal.reason


def test_k_none_uses_each_candidates_best_k(target):
    drafters = {"ngram": NGramDrafter()}
    cal = calibrate(target, drafters, PROMPT, k=None, k_max=8, timings=timings(ngram=1.0), alphas={"ngram": 0.9})
    r = cal.choice
    assert r.k == r.best_k and r.speedup == r.best_speedup
    assert all(
        walltime_improvement(0.9, 0.01, j, timings().pass_cost(j + 1), "per_call") <= r.speedup + 1e-12
        for j in range(1, 9)
    )


def test_no_candidate_is_refused():
    with pytest.raises(ValueError, match="at least one candidate"):
        calibrate(tiny_model("llama"), {}, PROMPT)


def test_choose_threads_times_every_count_and_leaves_the_count_as_it_was():
    tiny = tiny_model("llama", seed=0)
    previous = torch.get_num_threads()
    try:
        choice = choose_threads(tiny, torch.tensor([[1, 2, 3, 4, 5, 6]]), [1, 2], width=3, repeats=2)
        assert set(choice.probe_ms) == {1, 2} and all(ms > 0 for ms in choice.probe_ms.values())
        assert choice.threads == min([1, 2], key=lambda n: (choice.probe_ms[n], n))
        assert torch.get_num_threads() == previous  # it measures; specdec.auto.threads sets the count
        assert (choice.width, choice.prompt_tokens) == (3, 6)
    finally:
        torch.set_num_threads(previous)
    for bad in ([], [0, 1]):
        with pytest.raises(ValueError, match="thread counts"):
            choose_threads(tiny, torch.tensor([[1, 2]]), bad)


def test_threads_auto_is_measured_only_on_the_cpu_and_a_count_is_set_as_given(caplog):
    tiny = tiny_model("llama", seed=0)
    previous = torch.get_num_threads()
    try:
        assert use_threads(1, tiny) is None and torch.get_num_threads() == 1  # no measurement, no prompt
        assert use_threads("auto", tiny, None, device="cuda") is None
        with caplog.at_level(logging.INFO, logger="specdec.auto.report"):
            choice = use_threads("auto", tiny, PROMPT, k=3)
        assert torch.get_num_threads() == choice.threads and choice.width == 4 and choice.prompt_tokens == 8
        assert f"threads=auto: {choice.threads} torch threads" in caplog.text
    finally:
        torch.set_num_threads(previous)


def test_a_draft_models_alpha_is_not_pulled_down_by_the_last_short_rounds():
    """The draft is the target itself: every token is accepted, so alpha is 1 whatever the budget; tokens per
    pass would say less, since the last rounds draft fewer than probe_k tokens to stay within the budget."""
    tiny = tiny_model("llama", seed=0, scale=20.0)
    ids = torch.tensor([[1, 2, 3]])
    assert measure_alpha(tiny, ModelDrafter(tiny), ids, probe_k=4, max_new_tokens=7) == pytest.approx(1.0)
    out = speculative_generate(tiny, ModelDrafter(tiny), ids, k=4, max_new_tokens=7)
    per_pass = (out.stats.accepted + out.stats.target_forwards) / out.stats.target_forwards
    assert alpha_from_tokens_per_pass(per_pass, 4) < 0.95


def test_unsteady_timings_are_said(target):
    """Repeats that differ by more than half their median (a burst of load) make the reason say the choice is weak."""
    drafters = {"int8": ModelDrafter(target)}
    steady = calibrate(target, drafters, PROMPT, k=4, timings=timings(int8=30.0), alphas={"int8": 0.8})
    burst = calibrate(target, drafters, PROMPT, k=4, timings=replace(timings(int8=30.0), spread=0.8), alphas={"int8": 0.8})
    assert "unsteady" not in steady.reason and "differed by 80% of its median" in burst.reason
    measured = measure_timings(target, drafters, PROMPT, repeats=3)
    assert measured.spread >= 0 and measured.unsteady == (measured.spread > 0.5)


def test_k_auto_chooses_draft_and_threads_online_from_the_calibration(target):
    """k=auto over a calibrated pair's kept candidates: one rule for the run, seeded with the calibration (its
    alphas as priors, its timings as first samples); with two thread counts probed, one rule per count. Prompt
    lookup's acceptance depends on the prompt, not the pair: it keeps the cost model's optimistic prior."""
    from specdec import OnlineThreadChoice

    drafters = {"int8": ModelDrafter(target), "ngram": NGramDrafter()}
    cal = calibrate(target, drafters, PROMPT, k=None, timings=timings(int8=30.0, ngram=1.0),
                    alphas={"int8": 0.8, "ngram": 0.3})  # fmt: skip
    switch = DraftSwitch(drafters, default=cal.chosen)
    threads = ThreadChoice(2, {1: 300.0, 2: 250.0}, 5, 17)
    rule = online_rule(switch, cal, threads, k_max=8, target=target)
    assert isinstance(rule, OnlineThreadChoice) and set(rule.rules) == {1, 2}
    assert rule.rules[2].ready and not rule.rules[1].ready  # the count the calibration ran at starts measured
    assert rule.rules[2].models["int8"].prior == 0.8 and rule.rules[1].models["int8"].prior == 0.8
    assert rule.rules[2].models["ngram"].prior == CostModel(4, "per_call").prior > 0.3
    assert rule.rules[2].models["int8"].draft_seconds(1) == pytest.approx(0.030)
    single = online_rule(switch, cal, None, k_max=8, target=target)
    assert isinstance(single, OnlineDraftChoice) and single.switch is switch
    assert single.k_max == 8  # an eager target: no bound from compiled graphs
    assert run_rule(target, switch, k=4, calibration=cal, threads=threads) is None  # a fixed k: the calibrated default
    assert isinstance(run_rule(target, switch, k=None, calibration=cal, threads=threads), OnlineThreadChoice)
    assert switch.selected == cal.chosen


def test_a_compiled_target_keeps_its_thread_count(target, monkeypatch):
    """A compiled target's graphs hold for the thread count they were built at: k=auto chooses the draft and k
    online, not the count (a round at another count would compile every graph again, 12-25 s each)."""
    from types import SimpleNamespace

    from specdec.runtime.compiled import RUNTIMES

    drafters = {"int8": ModelDrafter(target), "ngram": NGramDrafter()}
    cal = calibrate(target, drafters, PROMPT, k=None, timings=timings(int8=30.0, ngram=1.0),
                    alphas={"int8": 0.8, "ngram": 0.3})  # fmt: skip
    switch, threads = DraftSwitch(drafters, default=cal.chosen), ThreadChoice(2, {1: 300.0, 2: 250.0}, 5, 17)
    monkeypatch.setitem(RUNTIMES, target, SimpleNamespace(eager=False, widths=(1, 2, 4)))  # as compile_model leaves it
    rule = online_rule(switch, cal, threads, k_max=8, target=target)
    assert isinstance(rule, OnlineDraftChoice) and rule.k_max == 3


def test_timings_time_a_lookup_candidate_through_the_drafter_protocol():
    """A lookup candidate is timed by its own propose call (one row), next to a draft model's step."""
    target = tiny_model("llama", seed=0)
    timings = measure_timings(target, {"copy": ModelDrafter(target), "ngram": NGramDrafter()}, PROMPT, k_max=4,
                              repeats=1)  # fmt: skip
    assert set(timings.draft_ms) == {"copy", "ngram"} and all(ms > 0 for ms in timings.draft_ms.values())


def test_candidates_are_built_one_at_a_time_and_dropped_once_out_of_the_best(target):
    """calibrate_in_turn holds the best `keep` candidates so far and the one being measured, never all of them: a
    candidate that falls out of the best is freed before the next is built; the kept ones come back best first."""
    built, alive_at_build = [], []

    def copy(seed):
        def build():
            alive_at_build.append(sum(ref() is not None for ref in built))
            drafter = ModelDrafter(tiny_model("llama", seed=seed, scale=20.0, vocab_size=32))
            built.append(weakref.ref(drafter))
            return drafter
        return build

    builders = {f"copy{seed}": copy(seed) for seed in (1, 2, 3, 4)} | {"ngram": NGramDrafter}
    cal, kept = calibrate_in_turn(target, builders, PROMPT, keep=1, release=gc.collect, k=2, repeats=1,
                                  max_new_tokens=8)  # fmt: skip
    assert alive_at_build[0] == 0 and max(alive_at_build) <= 2  # the best so far (and a model, if ngram leads)
    assert {r.name for r in cal.results} == set(builders) and cal.chosen == next(iter(kept))
    assert list(kept) == [r.name for r in cal.results if r.name in kept] and len(kept) <= 2
    models = [d for d in kept.values() if isinstance(d, ModelDrafter)]
    assert len(models) == 1 and [ref() for ref in built if ref() is not None] == models  # the others are freed


def test_kept_candidates_are_the_best_but_none_that_cannot_gain_after_the_first():
    def result(name, c, speedup, cost="per_token"):
        return CandidateResult(name, cost, 10 * c, c, 0.9, 4, 1.0, speedup, 4, speedup)

    results = [result("slow", 1.3, 0.9), result("ngram", 0.01, 1.1, "per_call"), result("int8", 0.5, 1.5),
               result("nf4", 0.7, 1.2), result("even", 0.6, 1.0)]  # fmt: skip
    has_model = lambda name: name != "ngram"
    assert kept_names(results, 3, has_model) == ["int8", "nf4", "ngram"]
    assert kept_names(results, 2, has_model) == ["int8", "nf4"]
    assert kept_names(results, 5, has_model) == ["int8", "nf4", "ngram"]  # "even" gains nothing: not kept
    assert kept_names(results[:2], 3, has_model) == ["ngram", "slow"]  # the only model, slow as it is, for naive
    assert kept_names([result("slow", 1.3, 0.9)], 3, has_model) == ["slow"]  # the best stays, whatever its c
    bound = CandidateResult("bound", "per_token", 5.0, 0.5, math.nan, 4, 1.0, 1.3, 4, 1.3)  # not probed: even at
    # alpha = 1 it could not beat the best, so its copy is not kept for the run
    assert kept_names([*results, bound], 3, has_model) == ["int8", "nf4", "ngram"]
    assert kept_names([result("slow", 1.3, 0.9), bound], 3, has_model) == ["bound"]  # the best, probed or not


def test_prepare_keeps_the_calibrated_candidates_and_says_why(target):
    """One call from a target and its candidates to what decode needs: the candidates calibrated on the prompt and
    kept behind a DraftSwitch, k=auto's online rule seeded with the calibration, the acceptance rule for the
    temperature (its tree form for a tree drafter), and a report of what was measured and chosen."""
    copy = tiny_model("llama", seed=1, scale=20.0, vocab_size=32)
    candidates = {"copy": ModelDrafter(copy), "ngram": NGramDrafter()}
    prepared = prepare(target, candidates, PROMPT, k=None, max_new_tokens=8)
    assert isinstance(prepared.drafter, DraftSwitch) and set(prepared.drafter.candidates) == {"copy", "ngram"}
    assert isinstance(prepared.rule, OnlineDraftChoice) and isinstance(prepared.acceptance, TokenLevel)
    assert prepared.drafts.model is copy and prepared.threads is None
    assert prepared.report.lines == [f"calibration: {prepared.drafts.calibration.reason}"]
    out = speculative_generate(target, prepared.batch_drafter, PROMPT, k=prepared.rule, sampling=GREEDY,
                               max_new_tokens=8, acceptance=prepared.acceptance)
    assert torch.equal(out.tokens, autoregressive_generate(target, PROMPT, sampling=GREEDY, max_new_tokens=8).tokens)
    tree = prepare(target, NGramDrafter(), PROMPT, k=2, tree=NGramTreeDrafter(), batch_size=2)
    assert isinstance(tree.acceptance, TreeRules) and tree.rule is None and tree.drafts.calibration is None


def test_the_thread_choice_says_what_each_count_measured():
    line = ThreadChoice(2, {1: 271.0, 2: 250.5}, 5, 17).markdown()
    assert "chose 2" in line and "1: 271.0, 2: 250.5" in line and "17-token prompt" in line


def test_calibration_md_lists_every_candidate():
    unprobed = CandidateResult("nf4", "per_token", 250.0, 2.5, float("nan"), 4, 1.3, 0.3, 1, 0.4)
    probed = CandidateResult("ngram", "per_call", 0.2, 0.002, 0.5, 4, 1.3, 1.4, 3, 1.5)
    table = Calibration(100.0, (probed, unprobed), "ngram", "ngram: predicted 1.40x.").markdown()
    assert "| nf4 | 250.0 | 2.50 | - |" in table and "Chosen draft: ngram: predicted 1.40x." in table

