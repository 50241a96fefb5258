"""How every benchmark runs its contenders: the interleaved schedule, the wall-time timer and the clock
inside each model's forward (specdec.runtime.study.ForwardClock). A Run is one contender on one input."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from specdec import Generation
from specdec.runtime.study import ForwardClock
from specdec.runtime.timing import stopwatch

Item = TypeVar("Item")


@dataclass
class Output:
    tokens: torch.Tensor  # (n,) new tokens
    stats: dict | None = None  # our Stats summary; None for Hugging Face's loops


def output_of(g: Generation, ours: bool) -> Output:
    """A contender's output; our loops add their Stats summary, with the per-round lists as totals (chosen
    draft lengths for k="auto", drafting rounds per candidate of an online draft choice, tree sizes)."""
    if not ours:
        return Output(g.tokens)
    summary = g.stats.summary()
    summary.update(
        chosen_k_histogram=g.stats.chosen_k_histogram,
        draft_rounds=dict(Counter(d for d in g.stats.chosen_draft if d)),
        tree_rounds=len(g.stats.tree_nodes),
        tree_nodes_sum=sum(g.stats.tree_nodes),
        tree_depth_sum=sum(g.stats.tree_depths),
    )
    return Output(g.tokens, summary)


@dataclass
class Run:
    """One contender on one input: new tokens, wall seconds, our Stats, time and calls inside each model."""

    tokens: list[int]
    seconds: float
    stats: dict | None = None
    model_seconds: dict[str, float] = field(default_factory=dict)
    model_calls: dict[str, int] = field(default_factory=dict)


def timed(fn: Callable[[torch.Tensor, int, int], Output], ids: torch.Tensor, n: int, seed: int) -> Run:
    """Wall time of one call (CUDA synchronized by the stopwatch)."""
    wall: dict[str, float] = {}
    with stopwatch(wall, "run", ids.device):
        out = fn(ids, n, seed)
    return Run(out.tokens.tolist(), wall["run"], out.stats)


def clocked(clock: ForwardClock, fn, ids: torch.Tensor, n: int, seed: int) -> Run:
    """timed, with the seconds and calls inside each model (the clock's) during the call."""
    clock.reset()
    run = timed(fn, ids, n, seed)
    run.model_seconds, run.model_calls = dict(clock.seconds), dict(clock.calls)
    return run


def interleaved(
    names: Sequence[str], items: Sequence[Item], repetitions: int
) -> Iterator[tuple[int, Item, str]]:
    """(repetition, item, contender) in a round-robin order: no contender always runs first, so drift
    of the machine's speed hits all contenders alike."""
    for rep in range(repetitions):
        for j, item in enumerate(items):
            shift = (rep * len(items) + j) % len(names)
            for name in [*names[shift:], *names[:shift]]:
                yield rep, item, name
