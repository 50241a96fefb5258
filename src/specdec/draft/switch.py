"""Several candidate drafts behind one drafter: the rule of the round (specdec.choose.online) selects who
proposes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..sampling import Sampling
from .base import Drafter, share_cache
from .head_drafter import HeadDrafter
from .model import HybridTreeDrafter
from .ngram import NGramDrafter, NGramTreeDrafter
from .proposal import RowProposals


class DraftSwitch:
    """Several candidate drafters behind one: every candidate follows the sequences (start, rollback, rows leaving,
    the target's cache), the one in use proposes. `default` is in use at the start of each run of sequences (a
    rule that chooses online names a candidate per round, which the loop puts in use with `use`; a fixed k
    drafts with the default throughout)."""

    def __init__(self, candidates: Mapping[str, Drafter], default: str | None = None):
        if not candidates:
            raise ValueError("DraftSwitch needs at least one candidate drafter")
        self.candidates = dict(candidates)
        self.replayed: list[int] = []  # per row, the tokens a rule has looked back on (specdec.choose.online)
        self.default = next(iter(self.candidates)) if default is None else default
        self.use(self.default)
        widths = [d.vocab_size for d in self.candidates.values() if d.vocab_size]
        self.vocab_size = min(widths) if widths else None

    @property
    def draft_cost(self) -> str:
        return self.candidates[self.selected].draft_cost

    @property
    def model(self) -> object:
        """The selected candidate's draft model (None for a model-free drafter)."""
        return getattr(self.candidates[self.selected], "model", None)

    def use(self, name: str) -> None:
        """Put candidate `name` in use: it proposes from the next round on."""
        if name not in self.candidates:
            raise KeyError(f"no candidate {name!r}; candidates: {', '.join(self.candidates)}")
        self.selected = name

    def share_cache(self, target: object) -> None:
        for drafter in self.candidates.values():
            share_cache(drafter, target)

    def start(self, prompts: list[torch.Tensor]) -> None:
        self.use(self.default)
        self.replayed = [prompt.shape[-1] for prompt in prompts]  # the prompts are not the target's text
        for drafter in self.candidates.values():
            drafter.start(prompts)

    def propose(
        self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
        generator: torch.Generator | None,
    ) -> RowProposals:
        return self.candidates[self.selected].propose(sequences, k, sampling, vocab_size, generator)

    def rollback(self, lengths: list[int]) -> None:
        for drafter in self.candidates.values():
            drafter.rollback(lengths)

    def select(self, rows: list[int]) -> None:
        self.replayed = [self.replayed[i] for i in rows]
        for drafter in self.candidates.values():
            drafter.select(rows)


def draft_kind(drafter) -> str:
    """What drafts: "head", "ngram" (a lookup), "hybrid" (a tree of both), or "model" (a copy or another model; a
    DraftSwitch, the calibrated default's online choice, counts as one whatever its candidates: see draft_kinds)."""
    if isinstance(drafter, HeadDrafter):
        return "head"
    return "hybrid" if isinstance(drafter, HybridTreeDrafter) else "ngram" if isinstance(
        drafter, (NGramDrafter, NGramTreeDrafter)) else "model"


def draft_kinds(drafter) -> list[str]:
    """The kinds a drafter drafts with: each candidate's of a DraftSwitch, else its own (draft_kind)."""
    if isinstance(drafter, DraftSwitch):
        return sorted({draft_kind(candidate) for candidate in drafter.candidates.values()})
    return [draft_kind(drafter)]
