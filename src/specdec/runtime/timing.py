"""The one place where time is measured: wall clock with a CUDA synchronize on both ends."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import torch
from transformers import PreTrainedModel

from .cached import CachedLM


def synchronize(device: torch.device | str | None) -> None:
    """Wait for the device's queued CUDA work, so that a clock reading covers it; a no-op on the CPU and for
    device None (a reading that need not be exact on an asynchronous device)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def stopwatch(
    totals: dict[str, float],
    key: str,
    device: torch.device | str | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[None]:
    """Add the seconds spent inside the block to totals[key], synchronizing `device` on both ends (None: no
    synchronization). clock: a fake one makes tests reproducible."""
    synchronize(device)
    start = clock()
    try:
        yield
    finally:
        synchronize(device)
        totals[key] = totals.get(key, 0.0) + clock() - start


K = TypeVar("K", bound=Hashable)


def interleaved_samples(
    jobs: Mapping[K, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    device: torch.device | str | None = None,
    after: Mapping[K, Callable[[], object]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[K, list[float]]:
    """Seconds of each job over `repeats` rounds, every round running each job once in turn, so that all of them see
    the same machine load; the first `warmup` rounds run and are dropped. after[key] runs untimed after each call
    of that job (crop a cache back). The one timing loop: every interleaved measurement goes through it."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    samples: dict[K, list[float]] = {key: [] for key in jobs}
    for round_ in range(warmup + repeats):
        for key, job in jobs.items():
            seconds: dict[str, float] = {}
            with stopwatch(seconds, "job", device, clock):
                job()
            if after is not None and key in after:
                after[key]()
            if round_ >= warmup:
                samples[key].append(seconds["job"])
    return samples


def interleaved_medians(
    jobs: Mapping[K, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    device: torch.device | str | None = None,
    after: Mapping[K, Callable[[], object]] | None = None,
) -> dict[K, float]:
    """Median seconds of each job, timed by interleaved_samples."""
    samples = interleaved_samples(jobs, repeats, warmup, device, after)
    return {key: statistics.median(values) for key, values in samples.items()}


@torch.inference_mode()
def forward_ms(model: PreTrainedModel, prefix: torch.Tensor, n_tokens: int, repeats: int = 9, warmup: int = 1) -> float:
    """Median milliseconds of one cached forward of n_tokens after prefix (1, L), warm-up runs dropped.

    n_tokens = 1 is what Thm 3.8 calls a step; n_tokens = k + 1 is one verification pass.
    """
    lm = CachedLM(model)
    lm.forward(prefix, last_only=True)
    length = lm.length
    step = pass_tokens(prefix, n_tokens)
    samples = []
    for _ in range(warmup + repeats):
        seconds: dict[str, float] = {}
        with stopwatch(seconds, "step", prefix.device):
            lm.forward(step)
        samples.append(seconds["step"])
        lm.crop(length)
    return 1000 * statistics.median(samples[warmup:])


def pass_tokens(prefix: torch.Tensor, n: int) -> torch.Tensor:
    """n tokens (1, n) to feed after prefix (1, L): its last n, or its first token repeated when L < n."""
    return prefix[:, -n:] if prefix.shape[-1] >= n else prefix[:, :1].repeat(1, n)


def timed_step(lm: CachedLM, tokens: torch.Tensor) -> tuple[Callable[[], object], Callable[[], None]]:
    """(run, undo): one cached forward of tokens (1, n) after what lm holds, and the crop back."""
    length = lm.length
    return partial(lm.forward, tokens), partial(lm.crop, length)


@dataclass(frozen=True)
class ThreadChoice:
    """The torch CPU thread count with the cheapest probe, and every count's probe time."""

    threads: int
    probe_ms: dict[int, float]  # thread count -> median ms of a step, a pass over `width` tokens and a prompt pass
    width: int
    prompt_tokens: int


@torch.inference_mode()
def choose_threads(
    model: PreTrainedModel, prefix: torch.Tensor, counts: Sequence[int], width: int = 5, repeats: int = 3
) -> ThreadChoice:
    """Time the kinds of work a generation does with each torch thread count, interleaved so that all see
    the same machine load; return the fastest (the count is left as it was: the caller sets it). The probe: one one-token step and one pass over
    width tokens after prefix (1, L), and one pass over the whole prefix (a prompt, or scoring an output).

    A one-token step is memory-bound and gains little from threads; wide passes (and a bf16 draft's steps on
    CPUs without bf16 kernels) are compute-bound and gain on a quiet CPU. On a busy CPU more threads
    oversubscribe the cores and everything slows down. Ties go to fewer threads.
    """
    if not counts or min(counts) < 1:
        raise ValueError(f"thread counts must be >= 1, got {list(counts)}")
    samples: dict[int, list[float]] = {n: [] for n in counts}
    previous = torch.get_num_threads()
    try:
        for _ in range(repeats):
            for n in counts:
                torch.set_num_threads(n)
                samples[n].append(probe_ms(model, prefix, width))
    finally:
        torch.set_num_threads(previous)
    probe = {n: statistics.median(v) for n, v in samples.items()}
    best = min(counts, key=lambda n: (probe[n], n))
    return ThreadChoice(best, probe, width, prefix.shape[-1])


@torch.inference_mode()
def probe_ms(model: PreTrainedModel, prefix: torch.Tensor, width: int) -> float:
    """Milliseconds of a pass over prefix (1, L) into an empty cache, then of a one-token step and of a pass
    over width tokens after it (each cropped back)."""
    lm = CachedLM(model)
    seconds: dict[str, float] = {}
    with stopwatch(seconds, "probe", prefix.device):
        lm.forward(prefix, last_only=True)
    for tokens in (prefix[:, -1:], pass_tokens(prefix, width)):
        run, undo = timed_step(lm, tokens)
        with stopwatch(seconds, "probe", prefix.device):
            run()
        undo()
    return 1000 * seconds["probe"]
