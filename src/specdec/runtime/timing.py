"""The one place where time is measured: wall clock with a CUDA synchronize on both ends."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

import torch


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
