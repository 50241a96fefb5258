"""The benchmark's runs -> figures: throughput per contender and category, our Stats pooled."""

from __future__ import annotations

import math
import statistics
from collections import Counter

from specdec.runtime.study import ClockedRun

from ..run.prompts import Prompt


def spread(values: list[float]) -> dict:
    """Median, min, max and count of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def pooled_stats(stats: list[dict]) -> dict:
    """Our Stats summaries of several runs, totalled: counters, seconds, the cost model's sums, histograms."""

    def total(key: str) -> float:
        return sum(s[key] for s in stats)

    histogram: list[int] = []
    for s in stats:
        h = s.get("chosen_k_histogram") or []
        width = max(len(h), len(histogram))
        histogram = [a + b for a, b in zip(histogram + [0] * (width - len(histogram)), h + [0] * (width - len(h)))]
    rounds = total("tree_rounds")
    measured, predicted = total("measured_seconds"), total("predicted_seconds")
    return {
        "emitted": total("emitted"),
        "drafted": total("drafted"),
        "accepted": total("accepted"),
        "target_forwards": total("target_forwards"),
        "draft_forwards": total("draft_forwards"),
        "acceptance_rate": total("accepted") / total("drafted") if total("drafted") else None,
        "mean_accepted_length": total("emitted") / total("target_forwards"),  # tokens per target pass
        "alpha": total("overlap_sum") / total("overlap_count") if total("overlap_count") else None,
        "seconds": {
            key: total(f"seconds_{key}")
            for key in ("prefill", "draft", "verify", "total")
            if all(f"seconds_{key}" in s for s in stats)
        },
        "chosen_k_histogram": histogram,
        "draft_rounds": dict(sorted(sum((Counter(s.get("draft_rounds", {})) for s in stats), Counter()).items())),
        # k="auto": the cost model's expected rate over the rounds it predicted, and what they measured
        "predicted_tokens_per_second": total("predicted_tokens") / predicted if predicted else None,
        "measured_tokens_per_second": total("measured_tokens") / measured if measured else None,
        # token trees: nodes per pass and accepted depth per pass
        "mean_tree_nodes": total("tree_nodes_sum") / rounds if rounds else None,
        "mean_tree_depth": total("tree_depth_sum") / rounds if rounds else None,
        "mean_accepted_depth": total("accepted") / rounds if rounds else None,
    }


def contender_figures(per_prompt: dict[str, list[ClockedRun]], prompts: list[Prompt]) -> dict:
    """Throughput per repetition (prompts pooled), per category, per prompt; forwards; our stats pooled."""
    reps = len(next(iter(per_prompt.values())))
    runs = [r for rs in per_prompt.values() for r in rs]

    def pooled(ids: list[str]) -> list[float]:  # tokens/s of each repetition over the given prompts
        return [
            sum(len(per_prompt[i][r].tokens) for i in ids) / sum(per_prompt[i][r].seconds for i in ids)
            for r in range(reps)
        ]

    categories = sorted({p.category for p in prompts})
    figures = {
        "tokens_per_second": spread(pooled([p.id for p in prompts])),
        "by_category": {c: spread(pooled([p.id for p in prompts if p.category == c])) for c in categories},
        "by_prompt": {
            p.id: {"tokens": len(per_prompt[p.id][0].tokens), **spread(pooled([p.id]))} for p in prompts
        },
        "model_forward_share": sum(sum(r.model_seconds.values()) for r in runs)
        / sum(r.seconds for r in runs),
        "forwards_per_token": {
            m: sum(r.model_calls[m] for r in runs) / sum(len(r.tokens) for r in runs)
            for m in runs[0].model_calls
        },
    }
    stats = [r.stats for r in runs if r.stats]
    if stats:
        figures["stats"] = pooled_stats(stats)
    return figures


def decode_rate(figures: dict) -> float:
    """Tokens per second after the prefill, from our Stats pooled over every run."""
    seconds = figures["stats"]["seconds"]
    return figures["stats"]["emitted"] / (seconds["total"] - seconds["prefill"])
