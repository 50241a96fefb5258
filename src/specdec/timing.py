"""The one place where time is measured: wall clock with a CUDA synchronize on both ends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued CUDA work, so that a clock reading covers it; a no-op on the CPU."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize(device)


@contextmanager
def stopwatch(totals: dict[str, float], key: str, device: torch.device | str | None = None) -> Iterator[None]:
    """Add the seconds spent inside the block to totals[key]."""
    synchronize(device)
    start = time.perf_counter()
    try:
        yield
    finally:
        synchronize(device)
        totals[key] = totals.get(key, 0.0) + time.perf_counter() - start
