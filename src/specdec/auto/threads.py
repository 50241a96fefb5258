"""The torch thread count of a run: the one place in the library that sets it (a rule that chooses the count round by
round, specdec.choose.threads, sets it inside the loop)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..runtime.machine import cores
from ..runtime.probes import ThreadChoice, choose_threads
from .report import Report

AUTO = "auto"  # threads measured here and now


def use_threads(threads: int | str, target: PreTrainedModel | None = None, ids: torch.Tensor | None = None, *,
                device: str = "cpu", k: int | None = None, report: Report | None = None) -> ThreadChoice | None:
    """Set torch's thread count for the run: a count as given (None returned), or threads="auto" on the CPU: 1, 2, 4,
    ... up to the core count, whichever is fastest here and now (one target step, one verification pass of width
    k + 1 (5 for k=None, k=auto) and one prompt pass over ids (1, L)), returned with its probes; "auto" on another
    device sets nothing. Call it before the target compiles: dynamo guards a compiled graph on the thread count it
    was built at, and compiles it again (12-25 s) at any other."""
    if isinstance(threads, int):
        torch.set_num_threads(threads)
        return None
    if threads != AUTO or not device.startswith("cpu"):
        return None
    usable = cores()
    counts = [2**i for i in range(usable.bit_length()) if 2**i <= usable]
    choice = choose_threads(target, ids, counts, width=5 if k is None else k + 1)
    torch.set_num_threads(choice.threads)
    probes = ", ".join(f"{n}: {ms:.1f}" for n, ms in choice.probe_ms.items())
    (report or Report()).say("threads=auto: %d torch threads (median probe ms by count: %s)", choice.threads, probes)
    return choice
