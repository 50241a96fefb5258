"""The benchmark's runs -> figures: throughput per contender and category, our Stats pooled; their geometric mean."""

from __future__ import annotations

import math

from specdec.metrics import pooled_summaries
from specdec.runtime.study import ClockedRun, throughput

from ..run.prompts import Prompt


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def contender_figures(per_prompt: dict[str, list[ClockedRun]], prompts: list[Prompt]) -> dict:
    """specdec.runtime.study.throughput of the contender's runs, with our statistics pooled."""
    figures = throughput(per_prompt, {p.id: p.category for p in prompts})
    stats = [r.stats for rs in per_prompt.values() for r in rs if r.stats]
    if stats:
        figures["stats"] = pooled_summaries(stats)
    return figures


def decode_rate(figures: dict) -> float:
    """Tokens per second after the prefill, from our Stats pooled over every run."""
    seconds = figures["stats"]["seconds"]
    return figures["stats"]["emitted"] / (seconds["total"] - seconds["prefill"])
