"""The rounds of a run's speculative method: accepted depth, chosen k, drafts and thread counts chosen online, tree
sizes; as metrics with stable names, histograms (counts per integer value) and the summary's Markdown.
"""

from __future__ import annotations

import math

import pandas as pd


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def flatten(lists: pd.Series) -> list[int]:
    """The per-round lists of every prompt, one after another."""
    return [value for values in lists for value in values]


def counts(values: list[int], longest: int = 0) -> list[int]:
    """counts[v]: how many of the values equal v, for v = 0..max(longest, max(values))."""
    top = max([longest, *values])
    return [sum(1 for v in values if v == i) for i in range(top + 1)]


def mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else math.nan


def shares(prefix: str, values: list) -> dict[str, float]:
    """{prefix/value: share of the rounds} for each value seen but "" (a round that drafted nothing)."""
    return {f"{prefix}/{v}": values.count(v) / len(values) for v in sorted(set(values)) if v != ""}


def listed_shares(metrics: dict[str, float], prefix: str, unit: str = "") -> str:
    """The shares of one prefix as a sentence's list, largest first ("dynamic_int8 60%, nf4 8%")."""
    found = {key.split("/", 1)[1]: v for key, v in metrics.items() if key.startswith(prefix + "/")}
    return ", ".join(f"{name}{unit} {100 * v:.0f}%" for name, v in sorted(found.items(), key=lambda x: -x[1]))


def round_metrics(rows: pd.DataFrame, longest: int) -> tuple[dict[str, float], dict[str, list[int]]]:
    """The speculative method's rounds: their number, chosen k, tree size and accepted depth (means and
    histograms, longest = k_max or the tree depth), and the cost model's predicted against measured rate."""
    spec = rows[rows["method"] == "speculative"]
    if spec.empty:
        return {}, {}
    accepted = flatten(spec["accepted_per_round"])
    metrics = {"rounds": float(spec["target_forwards"].sum()), "accepted_depth_mean": mean(accepted)}
    histograms = {"accepted_depth": counts(accepted, longest)}
    chosen = flatten(spec["chosen_k"])
    if chosen:  # the draft length (a tree: its depth) of every round, 0: a plain target step
        metrics["chosen_k_mean"] = mean(chosen)
        metrics["plain_step_share"] = mean([k == 0 for k in chosen])  # rounds that drafted nothing
        histograms["chosen_k"] = counts(chosen, longest)
    # k=auto over candidates: the share of rounds each one drafted ("": none), and each torch thread count ran
    metrics.update(shares("draft_share", flatten(spec["chosen_draft"]) if "chosen_draft" in spec else []))
    metrics.update(shares("threads_share", flatten(spec["chosen_threads"]) if "chosen_threads" in spec else []))
    nodes = flatten(spec["tree_nodes"])
    if nodes:  # trees: nodes verified and depth proposed per pass
        metrics["tree_nodes_mean"] = mean(nodes)
        metrics["tree_depth_mean"] = mean(flatten(spec["tree_depths"]))
    if spec["predicted_seconds"].sum() > 0:  # rounds the cost model predicted (k=auto after warm-up)
        metrics["predicted_tokens_per_second"] = ratio(
            spec["predicted_tokens"].sum(), spec["predicted_seconds"].sum()
        )
        metrics["measured_tokens_per_second"] = ratio(
            spec["measured_tokens"].sum(), spec["measured_seconds"].sum()
        )
        metrics["predicted_over_measured"] = ratio(
            metrics["predicted_tokens_per_second"], metrics["measured_tokens_per_second"]
        )
    return metrics, histograms


def rounds_markdown(metrics: dict[str, float], histograms: dict[str, list[int]]) -> str:
    """What the speculative rounds did, in sentences (empty when the method did not run)."""
    if "rounds" not in metrics:
        return ""

    def listed(name: str) -> str:
        return ", ".join(f"{value}: {n}" for value, n in enumerate(histograms[name]))

    passes = (
        f"Speculative rounds (target passes): {metrics['rounds']:.0f}, "
        f"{metrics['tokens_per_pass/speculative']:.2f} tokens per target pass "
        f"(target-only: {metrics.get('tokens_per_pass/autoregressive', math.nan):.2f})."
    )
    depth = (
        f"Accepted depth (draft tokens accepted per round): mean {metrics['accepted_depth_mean']:.2f}; "
        f"rounds by depth {listed('accepted_depth')}."
    )
    lines = [passes, depth]
    if "chosen_k" in histograms:
        lines.append(f"Chosen k: mean {metrics['chosen_k_mean']:.2f}; rounds by k {listed('chosen_k')}.")
        lines.append(
            f"Plain target steps (no draft): {100 * metrics['plain_step_share']:.0f}% of the rounds (the last "
            "round of a budget, where no draft token fits, included)."
        )
    threads, drafts = listed_shares(metrics, "threads_share", " threads"), listed_shares(metrics, "draft_share")
    if threads:
        lines.append(f"Torch thread count chosen each round (threads=auto): {threads} of the rounds.")
    if drafts:
        lines.append(
            f"Draft chosen each round (k=auto over the calibrated candidates, specdec.choose.online): {drafts} of "
            "the rounds (figures/decisions.png: the choices over the run)."
        )
    if "tree_nodes_mean" in metrics:
        lines.append(
            f"Tree size: {metrics['tree_nodes_mean']:.2f} nodes per pass, "
            f"depth {metrics['tree_depth_mean']:.2f}."
        )
    if "predicted_tokens_per_second" in metrics:
        lines.append(
            f"Cost model over the rounds it predicted: {metrics['predicted_tokens_per_second']:.1f} tokens/s "
            f"predicted, {metrics['measured_tokens_per_second']:.1f} measured "
            f"(ratio {metrics['predicted_over_measured']:.2f})."
        )
    return "\n".join(lines) + "\n\n"
