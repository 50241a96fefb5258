"""Prompt lookup (n-gram drafting): continuations of earlier occurrences of the sequence's suffix.
"""

from __future__ import annotations

import torch

from ..checks import check_ngram_range
from ..sampling import Sampling
from .base import RowDrafter
from .proposal import Draft


class NGramDrafter(RowDrafter):
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens, propose what followed.

    Deterministic, so q is one-hot at each proposed token; tries n = max_ngram down to min_ngram.
    """

    vocab_size = None
    draft_cost = "per_call"
    stateless = True  # keeps nothing between calls: one object serves every row of a batch

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        check_ngram_range(max_ngram, min_ngram)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def match(self, seq: torch.Tensor, k: int) -> torch.Tensor:
        """The up to k tokens that followed the latest earlier match of seq's suffix."""  # seq: (L,)
        for n in range(min(self.max_ngram, seq.numel() - 1), self.min_ngram - 1, -1):
            windows = seq[:-1].unfold(0, n, 1)  # (L-n, n): every n-gram that has a successor
            hits = (windows == seq[-n:]).all(dim=-1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n
                return seq[start : start + k]
        return seq[:0]

    def lookup(self, seq: torch.Tensor, k: int) -> torch.Tensor:
        """Up to k tokens: a match's continuation, matched again from its end while it is shorter than k.

        The latest match is often close to the end (a repeating pattern), so its continuation alone is short.
        """  # seq: (L,) -> (n,), n <= k
        found = seq[:0]
        while found.numel() < k:
            more = self.match(torch.cat([seq, found]), k - found.numel())
            if not more.numel():
                break
            found = torch.cat([found, more])
        return found

    def propose_row(
        self, sequence: torch.Tensor, k: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> Draft:
        tokens = self.lookup(sequence[0], k)  # (n,) with n <= k
        q = torch.zeros(tokens.numel(), vocab_size, device=sequence.device)
        q[torch.arange(tokens.numel()), tokens] = 1.0
        return Draft(tokens, q)
