"""The bench's contenders: each a configuration of experiments.run (its overrides on top of the bench's command
line) and that configuration's one method, built on a shared pair cache; the bench's own keys, checked before
anything loads; and the contenders that raise.

A contender can fail while it is built (its model does not load), in its warm-up or in a timed run (Hugging Face's
universal assisted generation rewriting the draft's output layer in place, say). It then stops running; its
figures are left out, the ratios and goals that needed it are "not measured", and bench.json's "failed" says why.
A ConfigError is never caught: a contender that cannot be configured fails the bench before anything loads.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from hydra import compose
from omegaconf import DictConfig

from specdec import Generation
from specdec.draft.switch import draft_kind, draft_kinds
from specdec.metrics import round_totals

from ..run.methods import Setup, setup_of
from ..run.pair import Pairs
from ..run.settings import ConfigError, check_choice, check_int

DEFAULT = "default"  # the default run's own configuration: always a contender
T = TypeVar("T")


@dataclass
class Output:
    tokens: torch.Tensor  # (n,) new tokens
    stats: dict | None = None  # our Stats summary; None for Hugging Face's loops


def output_of(g: Generation, ours: bool) -> Output:
    """A contender's output; our loops add their statistics (specdec.metrics.round_totals)."""
    return Output(g.tokens, round_totals(g.stats) if ours else None)


@dataclass
class Contender:
    """One configuration of experiments.run and its one method, built."""

    name: str
    overrides: list[str]
    setup: Setup
    method: str

    @property
    def owner(self) -> str:
        """Whose loop: ours, Hugging Face's (method=hf) or llama.cpp's (method=llamacpp)."""
        return self.method if self.method in ("hf", "llamacpp") else "ours"

    @property
    def drafts(self) -> str | None:
        """What drafts: a model, a trained head, a lookup (ngram), both (hybrid), or nothing (target only)."""
        if self.method == "hf":
            return "model" if self.setup.hf.assistant else "ngram" if self.setup.hf.prompt_lookup else None
        if self.method == "llamacpp":
            return "model" if self.setup.llamacpp.draft else "ngram" if self.setup.llamacpp.lookup else None
        if self.method == "autoregressive":
            return None
        return draft_kind(self.setup.drafter)

    @property
    def pass_width(self) -> int | None:
        """Tokens in each verification pass at most: k + 1 for a chain of fixed k, nodes + 1 for a tree."""
        plan = self.setup.plan
        if self.method != "speculative" or (not plan.trees and not isinstance(plan.k, int)):
            return None
        return self.setup.drafter.most_nodes + 1 if plan.trees else plan.k + 1

    def figures(self) -> dict:
        """What bench.json says of the contender besides its measurements."""
        lookup = self.setup.hf.prompt_lookup if self.method == "hf" else None
        return {"overrides": self.overrides, "method": self.method, "owner": self.owner, "drafts": self.drafts,
                "k": self.setup.plan.k, "prompt_lookup": lookup, "pass_width": self.pass_width,
                "draft_kinds": draft_kinds(self.setup.drafter) if self.owner == "ours" and self.drafts else [],
                "head": getattr(self.setup.drafter, "checkpoint", None)}  # fmt: skip

    def run(self, ids: torch.Tensor, n: int, seed: int, stop_at_eos: bool = True) -> Output:
        return output_of(self.setup.generate(self.method, ids, n, seed, stop_at_eos), self.owner == "ours")


def contenders_of(cfg: DictConfig, base: list[str], pairs: Pairs, only: list[str] | None = None,
                  failures: Failures | None = None) -> dict[str, Contender]:  # fmt: skip
    """The contenders of cfg.bench (and the default run's configuration), composed on top of base; only: these.
    failures: a contender that fails to build (its model does not load) is recorded there and left out; without it,
    or for the default run's configuration, the error is raised."""
    deltas = {DEFAULT: [], **{name: list(delta) for name, delta in cfg.bench.contenders.items()}}
    unknown = sorted(set(only or []) - set(deltas))
    if unknown:
        raise ConfigError(f"bench contenders {unknown} are not in bench.contenders; choices: {', '.join(deltas)}")
    built = {}
    for name, delta in deltas.items():
        if only is not None and name not in only:
            continue
        job = compose("bench", overrides=[*base, *delta])
        if job.method == "all":  # a contender runs its configuration's one method
            raise ConfigError(f"bench contender {name}: method=all runs several methods; name one (speculative, naive, ...)")
        setup = failures.attempt(name, "build", setup_of, job, pairs) if failures and name != DEFAULT else setup_of(job, pairs)
        if setup is not None:
            built[name] = Contender(name, delta, setup, str(job.method))
    return built


def check_bench(b: DictConfig) -> None:
    """The bench group's own keys, before anything loads (a ConfigError names the key and what it takes)."""
    names = [DEFAULT, *b.contenders]
    check_int(b.repetitions, "bench.repetitions", 1)
    check_int(b.pass_widths, "bench.pass_widths", 1)
    check_choice(b.reference, tuple(names), "bench.reference")
    study = b.get("batching")
    if study:
        for name in study.contenders:
            check_choice(name, tuple(names), "bench.batching.contenders")
        if not len(study.sizes):
            raise ConfigError("bench.batching.sizes is empty: give batch sizes >= 1, e.g. [1, 2, 4, 8]")
        for size in study.sizes:
            check_int(size, "bench.batching.sizes", 1)
        for key in ("baseline", "speculative"):
            check_choice(study[key], tuple(study.contenders), f"bench.batching.{key}")
    if b.load:
        check_int(b.load.processes, "bench.load.processes", 1)
        for name in b.load.contenders:
            check_choice(name, tuple(names), "bench.load.contenders")


class Failures:
    """The contenders that raised, by name: the stage (build, warm-up, run), the error and the traceback's end."""

    def __init__(self, log: Callable[[str], None] = lambda s: None) -> None:
        self.failed: dict[str, dict] = {}
        self.log = log

    def attempt(self, name: str, stage: str, fn: Callable[..., T], *args, **kwargs) -> T | None:
        """fn(*args, **kwargs), or None after recording the contender's failure (a failed contender is not run
        again: None at once)."""
        if name in self.failed:
            return None
        try:
            return fn(*args, **kwargs)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001  (any error of one contender: recorded, the bench goes on)
            error = " ".join(f"{type(e).__name__}: {e}".split())
            lines = "".join(traceback.format_exception(type(e), e, e.__traceback__)).splitlines()
            self.failed[name] = {"stage": stage, "error": error, "traceback": lines[-12:]}
            self.log(f"contender {name} failed in its {stage}: {error}")
            return None
