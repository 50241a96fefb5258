"""End-of-sequence handling shared by every decoding loop."""

from __future__ import annotations

import torch


class EosSet:
    """The token ids that end a generation (none when eos_token_id is None)."""

    def __init__(self, eos_token_id: int | list[int] | None):
        ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id
        self.ids = {int(i) for i in ids}

    def ended(self, new: torch.Tensor) -> bool:
        """Whether the last of the new tokens (n,) ends the sequence."""
        return bool(self.ids) and int(new[-1]) in self.ids


def truncate_at_eos(new: torch.Tensor, eos: EosSet) -> torch.Tensor:
    """Cut new tokens (n,) right after the first end-of-sequence token, if any."""
    if not eos.ids:
        return new
    for i, token in enumerate(new.tolist()):
        if token in eos.ids:
            return new[: i + 1]
    return new
