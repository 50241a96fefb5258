"""Prompt lookup (n-gram drafting): continuations of earlier occurrences of the sequence's suffix, as a chain
(NGramDrafter) or as a trie of several matches (NGramTreeDrafter).
"""

from __future__ import annotations

import torch

from ..checks import check_counts, check_ngram_range
from ..sampling import Sampling
from .base import RowDrafter
from .proposal import Draft
from .tree import TreeDraft, deterministic_tree


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

    def orders(self, seq: torch.Tensor) -> range:
        """The suffix lengths n tried, longest first."""
        return range(min(self.max_ngram, seq.numel() - 1), self.min_ngram - 1, -1)

    @staticmethod
    def occurrences(seq: torch.Tensor, n: int) -> torch.Tensor:
        """Start positions of the earlier occurrences of seq's last n tokens that have a successor."""
        windows = seq[:-1].unfold(0, n, 1)  # (L-n, n): every n-gram that has a successor
        return (windows == seq[-n:]).all(dim=-1).nonzero()

    def latest(self, seq: torch.Tensor) -> tuple[int, int]:
        """(n, start): the longest suffix n that occurred before, and where its latest occurrence's successor
        starts; (0, 0): none did."""  # seq: (L,)
        for n in self.orders(seq):
            hits = self.occurrences(seq, n)
            if hits.numel():
                return n, int(hits[-1]) + n
        return 0, 0

    def context(self, sequences: list[torch.Tensor]) -> int:
        """The match order of the round: the longest suffix n that occurred before, the shortest such n over the
        rows (0: some row has no match, nothing to propose). How much of a lookup is accepted depends on it far
        more than on the model pair: an online rule (specdec.choose.online) learns acceptance per order."""
        return min((self.latest(s[0])[0] for s in sequences), default=0)

    def lookup(self, seq: torch.Tensor, k: int) -> torch.Tensor:
        """Up to k tokens: a match's continuation, matched again from its end while it is shorter than k.

        The latest match is often close to the end (a repeating pattern), so its continuation alone is short.
        """  # seq: (L,) -> (n,), n <= k
        return self.chain(seq, k)[1]

    def chain(self, seq: torch.Tensor, k: int) -> tuple[int, torch.Tensor]:
        """lookup's tokens, and the match order of its first match (0: no match, no tokens)."""
        order, found = 0, seq[:0]
        while found.numel() < k:
            text = torch.cat([seq, found])
            n, start = self.latest(text)
            if not n:
                break
            order = order or n
            found = torch.cat([found, text[start : start + k - found.numel()]])
        return order, found

    def replay(self, prefix: torch.Tensor, continuation: list[int], k: int) -> tuple[int, list[float]] | None:
        """Hindsight on the text written: the context of `prefix` (L,) and how a lookup of k tokens there would have
        fared against the tokens that followed (`continuation`): per position up to the first miss, 1.0 for a hit and
        0.0 for the miss. A sampled token hits with probability p_i(x_i), beta_i of a one-hot draft, so these are
        unbiased samples of the acceptance a round would have seen. None: every proposed token known so far hit and
        more are to come; (0, []): nothing to propose there."""
        order, proposal = self.chain(prefix, k)
        scores = []
        for i, token in enumerate(proposal.tolist()):
            if i >= len(continuation):
                return None
            scores.append(float(token == continuation[i]))
            if not scores[-1]:
                break
        return order, scores

    def propose_row(
        self, sequence: torch.Tensor, k: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> Draft:
        tokens = self.lookup(sequence[0], k)  # (n,) with n <= k
        q = torch.zeros(tokens.numel(), vocab_size, device=sequence.device)
        q[torch.arange(tokens.numel()), tokens] = 1.0
        return Draft(tokens, q)


class NGramTreeDrafter(RowDrafter):
    """Prompt lookup with several matches: the continuations of the latest `matches` occurrences of the
    sequence's last n tokens, for n = max_ngram down to min_ngram, merged into a trie of at most `nodes`
    nodes and depth `depth`. Longer n-grams and later occurrences come first among siblings."""

    vocab_size = None
    draft_cost = "per_call"  # k="auto": a lookup costs about the same whatever the depth
    stateless = True  # keeps nothing between calls: one object serves every row of a batch

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, matches: int = 4, depth: int = 8, nodes: int = 16):
        check_ngram_range(max_ngram, min_ngram)
        check_counts(matches=matches, depth=depth, nodes=nodes)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.matches, self.depth, self.nodes = matches, depth, nodes

    @property
    def most_nodes(self) -> int:
        """The most nodes one proposal holds."""
        return self.nodes

    def continuations(self, seq: torch.Tensor, depth: int) -> list[list[int]]:
        """Candidate continuations (each up to `depth` tokens), best first."""  # seq: (L,)
        found = []
        for n in range(min(self.max_ngram, seq.numel() - 1), self.min_ngram - 1, -1):
            windows = seq[:-1].unfold(0, n, 1)  # (L-n, n): every n-gram that has a successor
            hits = (windows == seq[-n:]).all(dim=-1).nonzero().flatten()
            for start in (hits[-self.matches :] + n).flip(0).tolist():
                period = seq.numel() - start  # a match near the end repeats its continuation
                idx = start + torch.arange(depth, device=seq.device) % period
                found.append(seq[idx].tolist())
        return found

    def propose_row(
        self, sequence: torch.Tensor, depth: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> TreeDraft:
        tokens: list[int] = []
        parents: list[int] = []
        trie: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for continuation in self.continuations(sequence[0], min(self.depth, depth)):
            parent = -1
            for token in continuation:
                if (parent, token) not in trie:
                    if len(tokens) == self.nodes:
                        break
                    trie[parent, token] = len(tokens)
                    tokens.append(token)
                    parents.append(parent)
                parent = trie[parent, token]
        return deterministic_tree(tokens, parents, vocab_size, sequence.device)
