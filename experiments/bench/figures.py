"""The benchmark's runs -> figures: throughput per contender and category, our Stats pooled."""

from __future__ import annotations

import math
import statistics

from specdec.metrics import pooled_summaries
from specdec.runtime.study import ClockedRun

from ..run.prompts import Prompt


def spread(values: list[float]) -> dict:
    """Median, min, max and count of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


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
        figures["stats"] = pooled_summaries(stats)
    return figures


def decode_rate(figures: dict) -> float:
    """Tokens per second after the prefill, from our Stats pooled over every run."""
    seconds = figures["stats"]["seconds"]
    return figures["stats"]["emitted"] / (seconds["total"] - seconds["prefill"])
