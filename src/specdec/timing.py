"""The one place where time is measured: wall clock with a CUDA synchronize on both ends."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from .cached import CachedLM


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued CUDA work, so that a clock reading covers it; a no-op on the CPU."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize(device)


@contextmanager
def stopwatch(
    totals: dict[str, float],
    key: str,
    device: torch.device | str | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[None]:
    """Add the seconds spent inside the block to totals[key] (clock: a fake one makes tests reproducible)."""
    synchronize(device)
    start = clock()
    try:
        yield
    finally:
        synchronize(device)
        totals[key] = totals.get(key, 0.0) + clock() - start


@torch.inference_mode()
def forward_ms(model: PreTrainedModel, prefix: torch.Tensor, n_tokens: int, repeats: int = 9, warmup: int = 1) -> float:
    """Median milliseconds of one cached forward of n_tokens after prefix (1, L), warm-up runs dropped.

    n_tokens = 1 is what Thm 3.8 calls a step; n_tokens = k + 1 is one verification pass.
    """
    lm = CachedLM(model)
    lm.forward(prefix, last_only=True)
    length = lm.length
    step = prefix[:, -n_tokens:] if prefix.shape[-1] >= n_tokens else prefix[:, :1].repeat(1, n_tokens)
    samples = []
    for _ in range(warmup + repeats):
        seconds: dict[str, float] = {}
        with stopwatch(seconds, "step", prefix.device):
            lm.forward(step)
        samples.append(seconds["step"])
        lm.crop(length)
    return 1000 * statistics.median(samples[warmup:])
