"""Acceptance for a batch: each row accepted on its own by a single-sequence rule (specdec.state says why
that keeps every row exact).
"""

from __future__ import annotations

import torch

from ..draft.proposal import RowProposals


class PerRow:
    """An acceptance rule applied to each row on its own: the row's p, its proposal, the shared generator."""

    def __init__(self, rule):
        self.rule = rule
        self.trees = rule.trees

    def accept(self, p: list[torch.Tensor], proposals: RowProposals, generator: torch.Generator | None
               ) -> tuple[list[list[int]], list[torch.Tensor]]:
        paths, tokens = [], []
        for p_b, proposal in zip(p, proposals.rows):
            path, token = self.rule.accept(p_b, proposal, generator)
            paths.append(path)
            tokens.append(token)
        return paths, tokens
