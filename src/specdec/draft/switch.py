"""Several candidate drafts behind one drafter: the rule of the round (specdec.choose.online) selects who
proposes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..sampling import Sampling
from .base import Drafter, Proposal


class DraftSwitch:
    """Several candidate drafters behind one: every candidate follows the sequence (start, rollback, the target's
    cache), the selected one proposes. `default` is selected at the start of each sequence (a rule that chooses
    online selects per round; a fixed k drafts with the default throughout)."""

    def __init__(self, candidates: Mapping[str, Drafter], default: str | None = None):
        if not candidates:
            raise ValueError("DraftSwitch needs at least one candidate drafter")
        self.candidates = dict(candidates)
        self.default = next(iter(self.candidates)) if default is None else default
        self.select(self.default)
        widths = [d.vocab_size for d in self.candidates.values() if d.vocab_size]
        self.vocab_size = min(widths) if widths else None

    @property
    def draft_cost(self) -> str:
        return self.candidates[self.selected].draft_cost

    @property
    def model(self) -> object:
        """The selected candidate's draft model (None for a model-free drafter)."""
        return getattr(self.candidates[self.selected], "model", None)

    def select(self, name: str) -> None:
        if name not in self.candidates:
            raise KeyError(f"no candidate {name!r}; candidates: {', '.join(self.candidates)}")
        self.selected = name

    def share_cache(self, target: object) -> None:
        for drafter in self.candidates.values():
            share = getattr(drafter, "share_cache", None)
            if share is not None:
                share(target)

    def start(self, prompt: torch.Tensor) -> None:
        self.select(self.default)
        for drafter in self.candidates.values():
            drafter.start(prompt)

    def propose(
        self, sequence: torch.Tensor, k: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> Proposal:
        return self.candidates[self.selected].propose(sequence, k, sampling, vocab_size, generator)

    def rollback(self, length: int) -> None:
        for drafter in self.candidates.values():
            drafter.rollback(length)
