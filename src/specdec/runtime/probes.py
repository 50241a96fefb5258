"""Probes of a loaded model on this machine: a cached forward's time, a pass per width bucket, the fastest torch
thread count. They sit above the cache (specdec.runtime.cached) and the compiled runtime, and time with
specdec.runtime.timing."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from transformers import PreTrainedModel

from .cached import CachedLM
from .compiled import compiled_forward, runs_compiled
from .timing import interleaved_medians

log = logging.getLogger(__name__)


def pass_tokens(prefix: torch.Tensor, n: int) -> torch.Tensor:
    """n tokens (1, n) to feed after prefix (1, L): its last n, or its first token repeated when L < n."""
    return prefix[:, -n:] if prefix.shape[-1] >= n else prefix[:, :1].repeat(1, n)


def timed_step(lm: CachedLM, tokens: torch.Tensor) -> tuple[Callable[[], object], Callable[[], None]]:
    """(run, undo): one cached forward of tokens (1, n) after what lm holds, and the crop back."""
    length = lm.length
    return partial(lm.forward, tokens), partial(lm.crop, length)


@torch.inference_mode()
def forward_ms(model: PreTrainedModel, prefix: torch.Tensor, n_tokens: int, repeats: int = 9, warmup: int = 1) -> float:
    """Median milliseconds of one cached forward of n_tokens after prefix (1, L), warm-up runs dropped.

    n_tokens = 1 is what Thm 3.8 calls a step; n_tokens = k + 1 is one verification pass.
    """
    return forwards_ms(model, {"step": prefix}, n_tokens, repeats, warmup)["step"]


def forwards_ms(model: PreTrainedModel, prefixes: dict, n_tokens: int = 1, repeats: int = 9,
                warmup: int = 1) -> dict:
    """forward_ms after each of several prefixes (key -> (1, L)), the forwards after all of them interleaved: a
    ratio between two contexts then compares the same minutes of the machine's load."""
    lms = {key: CachedLM(model) for key in prefixes}
    for key, lm in lms.items():
        lm.forward(prefixes[key], last_only=True)
    steps = {key: partial(lm.forward, pass_tokens(prefixes[key], n_tokens)) for key, lm in lms.items()}
    crops = {key: partial(lm.crop, lm.length) for key, lm in lms.items()}
    device = next(iter(prefixes.values())).device
    return {key: 1000 * s for key, s in interleaved_medians(steps, repeats, warmup, device, after=crops).items()}


@dataclass(frozen=True)
class ThreadChoice:
    """The torch CPU thread count with the cheapest probe, and every count's probe time."""

    threads: int
    probe_ms: dict[int, float]  # thread count -> median ms of a step, a pass over `width` tokens and a prompt pass
    width: int
    prompt_tokens: int

    def markdown(self) -> str:
        """One line: the thread count threads=auto chose and what each count measured."""
        probes = ", ".join(f"{n}: {ms:.1f}" for n, ms in self.probe_ms.items())
        return (
            f"Torch threads: threads=auto chose {self.threads} (median ms of one target step, one "
            f"{self.width}-token pass and one {self.prompt_tokens}-token prompt pass, by thread count: {probes}; "
            "interleaved, under this machine's load).\n"
        )


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
    jobs = {n: partial(probe_on_threads, n, model, prefix, width) for n in counts}
    previous = torch.get_num_threads()
    try:
        seconds = interleaved_medians(jobs, repeats, warmup=0, device=prefix.device)
    finally:
        torch.set_num_threads(previous)
    probe_ms = {n: 1000 * s for n, s in seconds.items()}
    best = min(counts, key=lambda n: (probe_ms[n], n))
    return ThreadChoice(best, probe_ms, width, prefix.shape[-1])


@torch.inference_mode()
def probe_on_threads(threads: int, model: PreTrainedModel, prefix: torch.Tensor, width: int) -> None:
    """On `threads` torch threads: a pass over prefix (1, L) into an empty cache, then a one-token step and a
    pass over width tokens after it (each cropped back)."""
    torch.set_num_threads(threads)
    lm = CachedLM(model)
    lm.forward(prefix, last_only=True)
    for tokens in (prefix[:, -1:], pass_tokens(prefix, width)):
        run, undo = timed_step(lm, tokens)
        run()
        undo()


def build_graphs(model: PreTrainedModel, rows: int = 1) -> None:
    """Compile (or load from inductor's disk cache) the model's graphs of `rows` rows at every width bucket now,
    one dummy pass each on a cache of its own, so that no timed pass pays a first compile (up to a minute with
    autotune). Eager models: nothing to do."""
    if not runs_compiled(model):
        return
    runtime = compiled_forward(model)
    lm = CachedLM(model)
    for width in (1, *runtime.widths):  # the first pass, into an empty cache, runs eager (it allocates the cache)
        lm.forward(torch.zeros(rows, width, dtype=torch.long, device=lm.device))


def time_buckets(model: PreTrainedModel, context: int = 32, repeats: int = 7) -> dict[int, float]:
    """Median ms of one pass at each width bucket after a `context`-token prefix (the buckets interleaved, `repeats`
    rounds), kept in the runtime's pass_ms so that a pass pads to the cheapest bucket that holds it: an autotuned
    GEMM of 2 rows can cost more than one of 4 (Gemma 3 on a 2-core AVX512 CPU). Build the graphs first
    (build_graphs). Eager models: {}."""
    if not runs_compiled(model):
        return {}
    runtime = compiled_forward(model)
    runtime.pass_ms = {}  # each width in its own bucket while timed
    lm = CachedLM(model)
    lm.forward(torch.zeros(1, context, dtype=torch.long, device=lm.device), last_only=True)
    passes = {width: partial(lm.forward, torch.zeros(1, width, dtype=torch.long, device=lm.device))
              for width in runtime.widths}
    crop = partial(lm.crop, lm.length)
    seconds = interleaved_medians(passes, repeats, warmup=0, device=lm.device, after=dict.fromkeys(passes, crop))
    runtime.pass_ms = {width: 1000 * s for width, s in seconds.items()}
    log.info("pass ms by bucket: %s", {w: round(ms, 1) for w, ms in runtime.pass_ms.items()})
    return runtime.pass_ms
