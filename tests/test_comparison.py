"""Contenders compared (specdec.comparison): geometric means over categories, ratios to a baseline, Thm 3.8
next to a measured speedup, chain against tree, the cost model's prediction, a drafter's measured c."""

import math

import pytest

from specdec.comparison import (
    ContenderFigures,
    chain_vs_tree,
    contender_figures,
    cost_model_check,
    geomean,
    measured_c,
    pairwise,
    theory_comparison,
    vs_baseline,
)
from specdec.metrics import Stats, round_totals
from specdec.prompts import Prompt
from specdec.runtime.study import ClockedRun
from specdec.theory import walltime_improvement


def figures(tps: dict[str, float], owner: str = "ours", drafts: str | None = "model", **more) -> dict:
    """A contender's figures with the given median tokens/s per category (overall: their mean)."""
    return {"owner": owner, "drafts": drafts, "tokens_per_second": {"median": sum(tps.values()) / len(tps)},
            "by_category": {cat: {"median": v} for cat, v in tps.items()}, **more}  # fmt: skip


def test_geomean():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert math.isnan(geomean([]))


def test_contender_figures_read_per_category_and_group_and_pick_the_best():
    f = ContenderFigures({"ar": figures({"chat": 10.0, "code": 10.0}, drafts=None),
                          "a": figures({"chat": 20.0, "code": 5.0}),
                          "b": figures({"chat": 12.0, "code": 12.0}, drafts="ngram"),
                          "hf": figures({"chat": 11.0, "code": 9.0}, owner="hf")})  # fmt: skip
    assert f.categories == ["chat", "code"]
    assert f.over_categories("a", "ar") == [2.0, 0.5]
    assert f.category_geomean("a") == pytest.approx(10.0)
    assert f.best(["a", "b"]) == "b" and f.best([]) is None
    assert f.group("ours", "model", "ngram") == ["a", "b"] and f.group("hf", "model") == ["hf"]
    assert math.isnan(f.tps("missing")) and f.tps("b", "code") == 12.0
    against = vs_baseline(f, "ar")
    assert set(against) == {"a", "b", "hf"}
    assert against["a"] == {"by_category": {"chat": 2.0, "code": 0.5}, "geomean": pytest.approx(1.0),
                            "min_category": 0.5}  # fmt: skip
    ratios = pairwise(f.c, {"a_vs_hf": ["a", "hf"], "gone": ["a", "missing"]})
    assert ratios == {"a_vs_hf": pytest.approx(12.5 / 10.0)}


def test_contender_figures_pool_our_statistics_over_prompts_and_repetitions():
    stats = round_totals(Stats(emitted=4, drafted=4, accepted=2, target_forwards=2, overlap_sum=1.5,
                               overlap_count=2, seconds={"total": 1.0}))  # fmt: skip
    runs = {"p": [ClockedRun([1, 2, 3, 4], 1.0, stats)] * 2, "q": [ClockedRun([5, 6], 0.5, stats)] * 2}
    out = contender_figures(runs, [Prompt("p", "chat", "x"), Prompt("q", "code", "y")])
    assert out["tokens_per_second"]["median"] == pytest.approx(6 / 1.5)
    assert set(out["by_category"]) == {"chat", "code"}
    assert out["stats"]["emitted"] == 16 and out["stats"]["alpha"] == pytest.approx(0.75)
    assert "stats" not in contender_figures({"p": [ClockedRun([1], 1.0)]}, [Prompt("p", "chat", "x")])


def test_theory_comparison_is_thm_3_8_at_the_measured_alpha_c_and_pass_cost():
    seconds = {"total": 2.0, "prefill": 0.5}
    ours = {"tokens_per_second": {"median": 30.0}, "stats": {"alpha": 0.8, "emitted": 60, "seconds": seconds}}
    ar = {"tokens_per_second": {"median": 20.0}, "stats": {"emitted": 30, "seconds": seconds}}
    costs = {"c": 0.1, "target_step_ms": 10.0, "target_verify_ms_by_k": {4: 12.0}}
    out = theory_comparison(ours, ar, costs, 4)
    theory = walltime_improvement(0.8, 0.1, 4)
    assert out["spec_model_vs_ar"] == 1.5 and out["theory_speedup"] == pytest.approx(theory)
    assert out["efficiency_vs_theory"] == pytest.approx(1.5 / theory)
    assert out["spec_model_vs_ar_decode_only"] == pytest.approx(2.0)  # 60 vs 30 tokens in the same 1.5 s
    assert out["theory_speedup_with_verify_cost"] == pytest.approx(walltime_improvement(0.8, 0.1, 4, 1.2))
    assert theory_comparison({**ours, "stats": {}}, ar, costs, 4) == {}


def test_chain_vs_tree_pairs_only_the_same_pass_width():
    def passes(width, emitted, forwards):
        stats = {"mean_accepted_length": emitted / forwards, "target_forwards": forwards, "draft_forwards": 8,
                 "seconds": {"verify": 0.2}, "mean_tree_nodes": None}  # fmt: skip
        return {"pass_width": width, "tokens_per_second": {"median": 10.0}, "stats": stats}

    contenders = {"chain": passes(5, 20, 10), "tree": passes(5, 30, 10), "wide": passes(9, 40, 10)}
    out = chain_vs_tree(contenders, {"same": ("chain", "tree"), "other": ("chain", "wide"), "gone": ("x", "tree")})
    assert set(out) == {"same"}
    assert out["same"]["tree_over_chain_tokens_per_pass"] == pytest.approx(1.5)
    assert out["same"]["chain"]["verify_ms_per_pass"] == pytest.approx(20.0)
    assert out["same"]["tree"]["draft_forwards_per_pass"] == pytest.approx(0.8)


def test_cost_model_check_and_measured_c():
    stats = {"predicted_tokens_per_second": 20.0, "measured_tokens_per_second": 15.0, "chosen_k_histogram": [1, 2],
             "draft_forwards": 100, "seconds": {"draft": 0.6}}  # fmt: skip
    out = cost_model_check({"auto": {"stats": stats}, "ar": {}})
    assert set(out) == {"auto"} and out["auto"]["measured_over_predicted"] == pytest.approx(0.75)
    assert measured_c({"stats": stats}, 60.0) == pytest.approx(0.6 / 100 / 0.060)
    assert math.isnan(measured_c({"stats": {**stats, "draft_forwards": 0}}, 60.0))
