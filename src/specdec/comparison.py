"""Contenders compared: each one's throughput figures (tokens/s per category, our statistics pooled),
tokens/s per category and its geometric mean over categories, every contender against a baseline, a measured
speedup next to Thm 3.8, a chain against a tree of the same pass width, and the cost model's prediction
against what it measured.

A contender is a generation loop measured on a prompt set (specdec.runtime.study.interleaved_runs); its
figures are a dict, `contender_figures`'s, to which the caller adds what it knows of the contender (whose
loop it is, `owner`; what drafts, `drafts`; its `k`). This module compares; the caller decides which
contenders and what each ratio means.

Notation of Leviathan et al. (2023): alpha the acceptance rate of one draft token, c the cost of a draft step
in target steps, k (their gamma) the draft length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .metrics import pooled_summaries
from .prompts import Prompt
from .runtime.study import ClockedRun, throughput
from .theory import walltime_improvement


def geomean(values: list[float]) -> float:
    """The geometric mean (NaN for no values)."""
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def contender_figures(per_prompt: Mapping[str, list[ClockedRun]], prompts: list[Prompt]) -> dict:
    """specdec.runtime.study.throughput of a contender's runs (by prompt id, by repetition), with our
    statistics pooled (specdec.metrics.pooled_summaries; none for Hugging Face's loops)."""
    figures = throughput(per_prompt, {p.id: p.category for p in prompts})
    stats = [r.stats for rs in per_prompt.values() for r in rs if r.stats]
    if stats:
        figures["stats"] = pooled_summaries(stats)
    return figures


class ContenderFigures:
    """The contenders' tokens/s as ratios read them: overall or per category, geometric means over categories,
    the best of a group (highest geometric mean over categories). `c`: each contender's figures by name."""

    def __init__(self, contenders: dict):
        self.c = contenders
        self.categories = sorted(next(iter(contenders.values()))["by_category"]) if contenders else []

    def tps(self, name: str, category: str | None = None) -> float:
        """Median tokens/s, overall or in one category; NaN for a contender that did not run."""
        if name not in self.c:
            return float("nan")
        figures = self.c[name]["by_category"].get(category) if category else self.c[name]["tokens_per_second"]
        return figures["median"] if figures else float("nan")

    def over_categories(self, ours: str, other: str) -> list[float]:
        return [self.tps(ours, cat) / self.tps(other, cat) for cat in self.categories]

    def category_geomean(self, name: str) -> float:  # tokens/s, geometric mean over categories
        return geomean([self.tps(name, cat) for cat in self.categories])

    def best(self, names: list[str]) -> str | None:
        return max(names, key=self.category_geomean, default=None)

    def group(self, owner: str, *drafts: str) -> list[str]:
        """The contenders of one owner that draft with one of `drafts`."""
        return [n for n in self.c if self.c[n]["owner"] == owner and self.c[n]["drafts"] in drafts]


def vs_baseline(f: ContenderFigures, baseline: str) -> dict:
    """Every other contender per category over the baseline, their geometric mean and the worst category."""
    return {
        name: {"by_category": dict(zip(f.categories, f.over_categories(name, baseline))),
               "geomean": geomean(f.over_categories(name, baseline)),
               "min_category": min(f.over_categories(name, baseline))}
        for name in f.c
        if name != baseline
    }  # fmt: skip


def pairwise(contenders: dict, pairs: Mapping[str, list[str]]) -> dict[str, float]:
    """Named ratios of two contenders' median tokens/s (pooled over the prompts): the first over the second;
    pairs with a contender that did not run are left out."""
    return {key: contenders[a]["tokens_per_second"]["median"] / contenders[b]["tokens_per_second"]["median"]
            for key, (a, b) in pairs.items() if a in contenders and b in contenders}  # fmt: skip


def decode_rate(stats: dict) -> float:
    """Tokens/s after the prefill (pooled statistics): the rate the theory speaks of, prefills excluded."""
    return stats["emitted"] / (stats["seconds"]["total"] - stats["seconds"]["prefill"])


def theory_comparison(ours: dict, baseline: dict, costs: dict, k: int) -> dict[str, float]:
    """A chain of fixed k (ours) over target-only (baseline), whole and after the prefill, next to Thm 3.8 for
    its measured alpha, the measured c and k: one pass counted as one step, as the theorem does, and with the
    measured cost of a pass over k + 1 tokens. costs: specdec.runtime.study.pass_costs's; {} without alpha."""
    alpha = (ours.get("stats") or {}).get("alpha")
    if alpha is None:
        return {}
    speedup = ours["tokens_per_second"]["median"] / baseline["tokens_per_second"]["median"]
    theory = walltime_improvement(min(alpha, 1.0), costs["c"], k)  # Thm 3.8
    verify_ratio = costs["target_verify_ms_by_k"][k] / costs["target_step_ms"]
    refined = walltime_improvement(min(alpha, 1.0), costs["c"], k, verify_ratio)  # with the measured pass
    decode = decode_rate(ours["stats"]) / decode_rate(baseline["stats"])
    return {"spec_model_vs_ar": speedup, "alpha": alpha, "c": costs["c"], "theory_speedup": theory,
            "efficiency_vs_theory": speedup / theory, "spec_model_vs_ar_decode_only": decode,
            "efficiency_vs_theory_decode_only": decode / theory, "theory_speedup_with_verify_cost": refined,
            "efficiency_vs_theory_with_verify_cost": speedup / refined}  # fmt: skip


def pass_figures(name: str, figures: dict) -> dict:
    """One contender's target passes: tokens per pass, tokens/s, measured ms per pass, draft forwards per
    pass, tree nodes per pass."""
    st = figures["stats"]
    return {
        "contender": name,
        "tokens_per_pass": st["mean_accepted_length"],
        "tokens_per_second": figures["tokens_per_second"]["median"],
        "verify_ms_per_pass": 1000 * st["seconds"]["verify"] / st["target_forwards"]
        if "verify" in st["seconds"] else None,
        "draft_forwards_per_pass": st["draft_forwards"] / st["target_forwards"],
        "mean_tree_nodes": st.get("mean_tree_nodes"),
    }  # fmt: skip


def chain_vs_tree(contenders: dict, pairs: Mapping[str, tuple[str, str]]) -> dict:
    """For each named (chain, tree) pair of contenders that ran with the same pass width (their `pass_width`):
    their target passes side by side (pass_figures) and the tree's tokens per pass over the chain's."""
    c = contenders
    out = {}
    for drafter, (chain, tree) in pairs.items():
        if not (chain in c and tree in c and "stats" in c[chain] and "stats" in c[tree]):
            continue
        if c[chain]["pass_width"] is None or c[chain]["pass_width"] != c[tree]["pass_width"]:
            continue
        entry = {"pass_width": c[chain]["pass_width"], "chain": pass_figures(chain, c[chain]),
                 "tree": pass_figures(tree, c[tree])}  # fmt: skip
        per_pass = entry["tree"]["tokens_per_pass"] / entry["chain"]["tokens_per_pass"]
        entry["tree_over_chain_tokens_per_pass"] = per_pass
        out[drafter] = entry
    return out


def cost_model_check(contenders: dict) -> dict:
    """k="auto": the cost model's predicted tokens/s (over the rounds it predicted) vs what they measured, for
    each contender whose cost model predicted."""
    out = {}
    for name, figures in contenders.items():
        st = figures.get("stats") or {}
        predicted, measured = st.get("predicted_tokens_per_second"), st.get("measured_tokens_per_second")
        if predicted:
            out[name] = {
                "predicted_tokens_per_second": predicted,
                "measured_tokens_per_second": measured,
                "measured_over_predicted": measured / predicted if measured else None,
                "chosen_k_histogram": st["chosen_k_histogram"],
            }
    return out


def measured_c(figures: dict, target_step_ms: float) -> float:
    """A drafter's cost per draft token in target steps: its drafting seconds (a head's catch-up on the
    target's new features included) per draft forward, over one target step; NaN without draft forwards or a
    step time."""
    stats = figures["stats"]
    if not stats.get("draft_forwards") or not target_step_ms:
        return math.nan
    return stats["seconds"]["draft"] / stats["draft_forwards"] / (target_step_ms / 1000)
