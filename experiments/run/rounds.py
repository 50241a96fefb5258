"""The rounds of a run's speculative method, read back from its rows: metrics with stable names and histograms
(specdec.metrics.round_statistics), and the summary's Markdown.
"""

from __future__ import annotations

import math
from dataclasses import fields

import pandas as pd

from specdec.metrics import Stats, round_statistics

STATS = {field.name for field in fields(Stats)} - {"seconds", "extras"}  # a row holds these by name


def flatten(lists: pd.Series) -> list[int]:
    """The per-round lists of every prompt, one after another."""
    return [value for values in lists for value in values]


def listed_shares(metrics: dict[str, float], prefix: str, unit: str = "") -> str:
    """The shares of one prefix as a sentence's list, largest first ("dynamic_int8 60%, nf4 8%")."""
    found = {key.split("/", 1)[1]: v for key, v in metrics.items() if key.startswith(prefix + "/")}
    return ", ".join(f"{name}{unit} {100 * v:.0f}%" for name, v in sorted(found.items(), key=lambda x: -x[1]))


def round_metrics(rows: pd.DataFrame, longest: int) -> tuple[dict[str, float], dict[str, list[int]]]:
    """The speculative method's rounds over the run's rows (specdec.metrics.round_statistics)."""
    spec = rows[rows["method"] == "speculative"]
    return round_statistics([Stats(**{name: row[name] for name in STATS if name in row})
                             for row in spec.to_dict("records")], longest)  # fmt: skip


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
