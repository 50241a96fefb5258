"""What every acceptance rule is: one row's proposal accepted from its p, and the rows of a batch each on its own.

Why each row on its own stays exact is in specdec.state: row b's rule sees only row b's p and proposal and draws
its uniforms for row b alone (one generator, shared, only interleaves the draws).
"""

from __future__ import annotations

import torch


class AcceptanceRule:
    """Base of the acceptance rules: `accept` one row's scored proposal (the accepted node ids in path order and
    the target's next token); `accept_rows` applies it to every row of a round."""

    trees = False  # True: verifies token trees (the statistics keep each pass's tree size and depth)

    def accept(self, p: torch.Tensor, proposal, generator: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
        raise NotImplementedError

    def accept_rows(self, p: list[torch.Tensor], proposals, generator: torch.Generator | None
                    ) -> tuple[list[list[int]], list[torch.Tensor]]:
        """Each row accepted on its own: that row's p (n_b + 1, V) and proposal, with the shared generator."""
        accepted = [self.accept(p_b, row, generator) for p_b, row in zip(p, proposals.rows)]
        return [path for path, _ in accepted], [token for _, token in accepted]
