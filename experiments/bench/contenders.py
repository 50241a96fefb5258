"""The bench's contenders: each a configuration of experiments.run (its overrides on top of the bench's command
line) and that configuration's one method, built on a shared pair cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hydra import compose
from omegaconf import DictConfig

from ..run.methods import Setup, setup_of
from ..run.pair import Pairs
from ..run.settings import ConfigError, check_renamed
from .failures import Failures
from .heads import draft_kind, draft_kinds
from .schedule import Output, output_of

DEFAULT = "default"  # the default run's own configuration: always a contender


@dataclass
class Contender:
    """One configuration of experiments.run and its one method, built."""

    name: str
    overrides: list[str]
    setup: Setup
    method: str

    @property
    def owner(self) -> str:
        """Whose loop: ours, or Hugging Face's (method=hf)."""
        return "hf" if self.method == "hf" else "ours"

    @property
    def drafts(self) -> str | None:
        """What drafts: a model, a trained head, a lookup (ngram), both (hybrid), or nothing (target only)."""
        if self.method == "hf":
            return "model" if self.setup.hf.assistant else "ngram" if self.setup.hf.prompt_lookup else None
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


def method_of(cfg: DictConfig, name: str) -> str:
    """A contender's one method: its configuration's method, which must be a single one."""
    if cfg.method == "all":
        raise ConfigError(f"bench contender {name}: method=all runs several methods; name one (speculative, naive, ...)")
    return str(cfg.method)


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
        check_renamed(delta)
        job = compose("bench", overrides=[*base, *delta])
        method = method_of(job, name)
        setup = failures.attempt(name, "build", setup_of, job, pairs) if failures and name != DEFAULT else setup_of(job, pairs)
        if setup is not None:
            built[name] = Contender(name, delta, setup, method)
    return built
