"""Measured times as the cost models read them: recent medians by kind (RecentTimes) and pass times read off a
line through the measured widths (interpolated).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping, Sequence


class RecentTimes:
    """Recent timings of one kind (a pass width, or a drafter's unit), each with the round it was measured in.

    The estimate is the median of the last `window` samples measured within `max_age` rounds of `now`; when none
    is that recent, the newest sample alone (what the machine did when this was last tried)."""

    def __init__(self, window: int, max_age: int):
        self.max_age = max_age
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)  # (round, seconds)

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, round: int, seconds: float) -> None:
        self.samples.append((round, seconds))

    def newest(self) -> int:
        """The round of the newest sample."""
        return self.samples[-1][0]

    def median(self, now: int) -> float:
        recent = [s for r, s in self.samples if r >= now - self.max_age]
        return statistics.median(recent) if recent else self.samples[-1][1]


def linear_fit(widths: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of seconds against width (needs two distinct widths)."""
    mean_w = sum(widths) / len(widths)
    mean_s = sum(seconds) / len(seconds)
    var = sum((w - mean_w) ** 2 for w in widths)
    slope = sum((w - mean_w) * (s - mean_s) for w, s in zip(widths, seconds)) / var
    return mean_s - slope * mean_w, slope


def interpolated(medians: Mapping[int, float], width: int) -> float:
    """T_pass(width) from measured medians by width: the one measured, else a least-squares line through them,
    never below T_pass(1) (or the cheapest measured when width 1 was not)."""
    if width in medians:
        return medians[width]
    widths = sorted(medians)
    values = [medians[w] for w in widths]
    if len(widths) == 1:
        return values[0]
    floor = values[0] if widths[0] == 1 else min(values)
    intercept, slope = linear_fit(widths, values)
    return max(floor, intercept + slope * width)
