"""How every benchmark runs its contenders: the interleaved schedule, the wall-time timer and the clock
inside each model's forward. A Run is one contender on one input."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from specdec import Generation
from specdec.runtime.compiled import CompiledForward, compiled_forward
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


class ForwardClock:
    """Seconds and calls inside each model's forward, by hooks: what the models cost, for ours and HF's alike.

    Wall time minus this is the loop's own overhead (sampling, acceptance, cache bookkeeping, Python).
    A model on the compiled runtime runs its passes through CompiledForward, which calls the model's forward
    without its hooks (a hook traced into a graph would stop it compiling): those calls are timed there instead.
    """

    def __init__(self, models: dict[str, torch.nn.Module | None]):
        models = {name: m for name, m in models.items() if m is not None}
        self.seconds = dict.fromkeys(models, 0.0)
        self.calls = dict.fromkeys(models, 0)
        self.handles = []
        self.wrapped: list[tuple[CompiledForward, str, bool, Callable]] = []  # runtime, attribute, own, original
        for name, model in models.items():
            self.handles.append(model.register_forward_pre_hook(lambda *_: self._start()))
            self.handles.append(model.register_forward_hook(lambda *_, n=name: self._stop(n)))
            runtime = compiled_forward(model)
            if runtime is not None:
                self.time_runtime(name, runtime)

    def time_runtime(self, name: str, runtime: CompiledForward) -> None:
        """Time the runtime's compiled passes and its eager ones (passes wider than every bucket) as the model's."""
        for attr in ("compiled", "run"):
            inner = getattr(runtime, attr)

            def timed(*args, inner=inner):
                self._start()
                out = inner(*args)
                self._stop(name)
                return out

            self.wrapped.append((runtime, attr, attr in vars(runtime), inner))
            setattr(runtime, attr, timed)

    def _start(self) -> None:
        self.started = time.perf_counter()

    def _stop(self, name: str) -> None:
        self.seconds[name] += time.perf_counter() - self.started
        self.calls[name] += 1

    def measure(self, fn, ids: torch.Tensor, n: int, seed: int) -> Run:
        """timed, with the seconds and calls inside each model during the call."""
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.calls = dict.fromkeys(self.calls, 0)
        run = timed(fn, ids, n, seed)
        run.model_seconds, run.model_calls = dict(self.seconds), dict(self.calls)
        return run

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for runtime, attr, own, inner in reversed(self.wrapped):
            if own:
                setattr(runtime, attr, inner)
            else:
                delattr(runtime, attr)
        self.wrapped = []


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
