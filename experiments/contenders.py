"""Decoding methods side by side: ours and Hugging Face's, each a contender with the same call shape.

A contender turns (setting, input_ids (1, L), max_new_tokens, seed) into the new tokens and, for our
loops, the Stats summary. Register a new method with one line in CONTENDERS:

    CONTENDERS["spec_model_k8"] = Contender(
        lambda s, ids, n, seed: speculative(lambda s: ModelDrafter(s.draft))(replace(s, k=8), ids, n, seed),
        needs_draft=True)

The interleaved schedule and the timer that every benchmark uses live here too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from transformers import GenerationConfig, PreTrainedModel

from specdec import (
    GREEDY,
    Drafter,
    Generation,
    ModelDrafter,
    NGramDrafter,
    Sampling,
    autoregressive_generate,
    speculative_generate,
)
from specdec.timing import stopwatch

HF_PROMPT_LOOKUP_TOKENS = 10  # Hugging Face's documented example value; prompt lookup has no built-in default
Item = TypeVar("Item")


@dataclass
class Setting:
    """What every contender gets: the models, k, sampling and the stop tokens (same for all contenders)."""

    target: PreTrainedModel
    draft: PreTrainedModel | None  # None when no contender that runs needs a draft model
    k: int = 4
    sampling: Sampling = GREEDY
    eos: int | list[int] | None = None
    max_ngram: int = 3  # our n-gram drafter: longest and shortest suffix matched
    min_ngram: int = 1


@dataclass
class Output:
    tokens: torch.Tensor  # (n,) new tokens
    stats: dict | None = None  # our Stats summary; None for Hugging Face's loops


@dataclass(frozen=True)
class Contender:
    generate: Callable[
        [Setting, torch.Tensor, int, int], Output
    ]  # (setting, ids (1, L), max_new_tokens, seed)
    needs_draft: bool = False


# ---------------------------------------------------------------------------- ours


def ours(s: Setting, seed: int, loop: Callable[..., Generation]) -> Output:
    """One of our loops, given the common arguments and a fresh generator seeded with seed."""
    generator = torch.Generator(device=s.target.device).manual_seed(seed)
    g = loop(sampling=s.sampling, eos_token_id=s.eos, generator=generator)
    return Output(g.tokens, g.stats.summary())


def target_only(s: Setting, ids: torch.Tensor, n: int, seed: int) -> Output:
    return ours(s, seed, lambda **kw: autoregressive_generate(s.target, ids, max_new_tokens=n, **kw))


def speculative(
    drafter_of: Callable[[Setting], Drafter],
) -> Callable[[Setting, torch.Tensor, int, int], Output]:
    """Our speculative loop with the drafter drafter_of(setting) and the setting's k."""

    def generate(s: Setting, ids: torch.Tensor, n: int, seed: int) -> Output:
        return ours(
            s,
            seed,
            lambda **kw: speculative_generate(s.target, drafter_of(s), ids, k=s.k, max_new_tokens=n, **kw),
        )

    return generate


# ---------------------------------------------------------------------------- Hugging Face


def hf_config(s: Setting, max_new_tokens: int) -> GenerationConfig:
    """A generation config that states everything, so model defaults cannot differ between contenders."""
    eos = s.eos[0] if isinstance(s.eos, list) and s.eos else s.eos
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        do_sample=not s.sampling.greedy,
        eos_token_id=s.eos if s.eos != [] else None,
        pad_token_id=eos if eos is not None else s.target.config.pad_token_id or 0,
    )
    if not s.sampling.greedy:
        config.update(
            temperature=s.sampling.temperature, top_k=s.sampling.top_k or None, top_p=s.sampling.top_p
        )
    else:
        config.update(temperature=None, top_k=None, top_p=None)
    return config


def fix_assistant_k(draft: PreTrainedModel, k: int | None) -> None:
    """HF reads the schedule from the assistant's own generation config.

    k: constant k, no confidence early stop. None: HF's defaults (20 tokens, stopped early by a
    confidence threshold that adapts during generation).
    """
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant" if k else None
    draft.generation_config.assistant_confidence_threshold = 0.0 if k else None


def hf(assisted_k: Callable[[Setting], int | None] | None = None, **options):
    """HF generate; with assisted_k, assisted generation with the draft and that k (None: HF's defaults)."""

    def generate(s: Setting, ids: torch.Tensor, n: int, seed: int) -> Output:
        torch.manual_seed(seed)
        config = hf_config(s, n)
        config.update(**{key: value(s) if callable(value) else value for key, value in options.items()})
        assistant = None
        if assisted_k is not None:
            assistant = s.draft
            fix_assistant_k(assistant, assisted_k(s))
        with torch.inference_mode():
            out = s.target.generate(
                ids, attention_mask=torch.ones_like(ids), assistant_model=assistant, generation_config=config
            )
        return Output(out[0, ids.shape[-1] :])

    return generate


CONTENDERS: dict[str, Contender] = {
    "ar": Contender(target_only),
    "hf_plain": Contender(hf()),
    "spec_model": Contender(speculative(lambda s: ModelDrafter(s.draft)), needs_draft=True),
    "hf_assisted": Contender(hf(assisted_k=lambda s: s.k), needs_draft=True),
    "hf_assisted_default": Contender(hf(assisted_k=lambda s: None), needs_draft=True),
    "spec_ngram": Contender(
        speculative(lambda s: NGramDrafter(max_ngram=s.max_ngram, min_ngram=s.min_ngram))
    ),
    "hf_lookup": Contender(hf(prompt_lookup_num_tokens=lambda s: s.k)),
    "hf_lookup_default": Contender(hf(prompt_lookup_num_tokens=HF_PROMPT_LOOKUP_TOKENS)),
}
OURS = ("ar", "spec_model", "spec_ngram")  # contenders that return our Stats


def bind(name: str, setting: Setting) -> Callable[[torch.Tensor, int, int], Output]:
    """The contender as fn(ids, max_new_tokens, seed)."""
    contender = CONTENDERS[name]
    if contender.needs_draft and setting.draft is None:
        raise ValueError(f"contender {name!r} needs a draft model; the setting has none")
    return lambda ids, n, seed: contender.generate(setting, ids, n, seed)


# ---------------------------------------------------------------------------- schedule and timer


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
    """

    def __init__(self, models: dict[str, torch.nn.Module | None]):
        models = {name: m for name, m in models.items() if m is not None}
        self.seconds = dict.fromkeys(models, 0.0)
        self.calls = dict.fromkeys(models, 0)
        self.handles = []
        for name, model in models.items():
            self.handles.append(model.register_forward_pre_hook(lambda *_: self._start()))
            self.handles.append(model.register_forward_hook(lambda *_, n=name: self._stop(n)))

    def _start(self) -> None:
        self.started = time.perf_counter()

    def _stop(self, name: str) -> None:
        self.seconds[name] += time.perf_counter() - self.started
        self.calls[name] += 1

    def measure(self, fn, ids: torch.Tensor, n: int, seed: int) -> Run:
        """contenders.timed, with the seconds and calls inside each model during the call."""
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.calls = dict.fromkeys(self.calls, 0)
        run = timed(fn, ids, n, seed)
        run.model_seconds, run.model_calls = dict(self.seconds), dict(self.calls)
        return run

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


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


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (length mismatch counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_identical(outputs: dict[str, dict[str, list[int]]], reference: str = "ar") -> dict:
    """Greedy decoding is deterministic and lossless: every contender must emit the reference's tokens."""
    mismatches = []
    for name, per_input in outputs.items():
        for key, tokens in per_input.items():
            at = first_difference(tokens, outputs[reference][key])
            if at is not None:
                mismatches.append({"contender": name, "prompt": key, "first_difference": at})
    return {"identical": not mismatches, "reference": reference, "mismatches": mismatches}
