"""The runtime study (specdec.runtime.study.runtime_study): pass costs by runtime profile, next to the memory bound."""

import pytest
import torch

from specdec import GREEDY, autoregressive_generate
from specdec.runtime.compiled import compile_model, compiled_forward
from specdec.runtime.inductor import graphs_built
from specdec.runtime.study import (
    ClockedRun,
    RuntimeProfile,
    interleaved,
    interleaved_runs,
    plain_step_share,
    runtime_study,
    throughput,
)
from specdec.runtime.tiny import tiny_model


@pytest.mark.xdist_group("inductor")  # the worker of tests/test_compiled.py
def test_the_runtime_study_starts_from_the_eager_model():
    """bench=runtime's eager profile times the eager forward even where the bench loaded the target on the compiled
    runtime (runtime=auto does for a real-sized target on an AVX-512 CPU): no graph is built while it runs."""
    model = tiny_model("llama", seed=0)
    compile_model(model, widths=(4,), capacity=64, dynamic_width=True)  # as loaded; nothing compiles before a pass
    loops = {"ar": lambda m, ids: autoregressive_generate(m, ids, sampling=GREEDY, max_new_tokens=4).tokens}
    graphs = graphs_built()
    result = runtime_study(model, [torch.arange(1, 13)[None]], {"eager": RuntimeProfile({"name": "eager"})}, loops,
                           max_width=2, repeats=1, n=4, eos=[])
    assert graphs_built() == graphs and compiled_forward(model) is None
    assert set(result["profiles"]["eager"]["pass_cost"]) == {1, 2}
    assert result["profiles"]["eager"]["ar_tokens_per_s"] > 0 and result["profiles"]["eager"]["outputs_equal_eager_target_only"]


def test_interleaved_rotates_who_runs_first():
    order = list(interleaved(["a", "b", "c"], ["p", "q"], repetitions=2))
    assert len(order) == 12
    firsts = [order[i][2] for i in range(0, 12, 3)]
    assert firsts == ["a", "b", "c", "a"]


def test_interleaved_runs_warm_up_then_clock_every_input_and_skip_a_failed_loop():
    class Out:
        def __init__(self, n):
            self.tokens, self.stats = torch.arange(n), None

    calls, finished = [], []

    def attempt(name, stage, fn, *args):
        calls.append((name, stage))
        return None if name == "broken" and stage == "run" else fn(*args)

    runs = interleaved_runs({"a": lambda ids, n, seed: Out(n), "broken": lambda ids, n, seed: Out(n)},
                            {"p": torch.ones(1, 3), "q": torch.ones(1, 5)}, n=4, repetitions=2, attempt=attempt,
                            finished=lambda name, runs: finished.append(name))
    assert calls[:2] == [("a", "warm-up"), ("broken", "warm-up")] and finished == ["a"]
    assert [len(runs["a"][key]) for key in ("p", "q")] == [2, 2] and runs["broken"] == {"p": [], "q": []}
    figures = throughput(runs["a"], {"p": "chat", "q": "code"})
    assert set(figures["by_category"]) == {"chat", "code"} and figures["tokens_per_second"]["n"] == 2


def test_forwards_per_token_counts_the_models_a_loop_called():
    """A bench clocks every contender's models; each contender's figures count only those it called (a contender
    with settings of its own runs a target of its own: the default's target reads 0 for it, and is left out)."""
    calls = {"target": 0, "target1": 5, "draft": 0, "draft1": 12}
    runs = {"p": [ClockedRun([1, 2, 3, 4], 1.0, None, {m: 0.1 * n for m, n in calls.items()}, calls)] * 2}
    figures = throughput(runs, {"p": "chat"})
    assert figures["forwards_per_token"] == {"target1": 1.25, "draft1": 3.0}
    assert figures["model_forward_share"] == pytest.approx(1.7)


def test_plain_step_share_pools_the_prompts_by_their_rounds():
    run = {"prompts": [{"rounds": 10, "plain_step_share": 0.5}, {"rounds": 30, "plain_step_share": 0.1}]}
    assert plain_step_share(run) == pytest.approx((5 + 3) / 40)
    assert plain_step_share({"prompts": [{"rounds": 0, "plain_step_share": None}]}) is None  # target-only


def test_forwards_ms_times_a_step_after_each_context_and_leaves_none_behind(monkeypatch):
    """bench=context's steps: one cached forward after each prefix, every round running each context once, each
    cache cropped back after its forward."""
    from specdec.runtime import probes

    model = tiny_model("llama", seed=0)
    prefixes = {64: torch.randint(0, 16, (1, 64)), 300: torch.randint(0, 16, (1, 300))}
    lengths, forward = [], probes.CachedLM.forward

    def counted(lm, ids, *args, **kwargs):
        lengths.append((lm.length, ids.shape[-1]))
        return forward(lm, ids, *args, **kwargs)

    monkeypatch.setattr(probes.CachedLM, "forward", counted)
    ms = probes.forwards_ms(model, prefixes, 1, repeats=3, warmup=1)
    assert set(ms) == {64, 300} and all(v > 0 for v in ms.values())
    steps = lengths[2:]  # after the two prefills: (cache length, tokens) of every timed forward, in order
    assert sorted(steps) == sorted([(64, 1), (300, 1)] * 4)  # warm-up and 3 rounds, each at its own context
