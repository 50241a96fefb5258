"""Where draft trees come from: n-gram tries, a small model that branches, and both under one root.

Every node carries the q row it was drawn from and its mode (specdec.verify.tree): deterministic
candidates (n-gram matches, top-b by rank) have one-hot rows; sampled children keep the draft's
processed row (IID: each child drawn from the same q; DISTINCT: drawn without replacement, each
row being q without the earlier siblings). The acceptance rules are exact only if that is true.
"""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

from ..checks import check_counts, check_ngram_range
from ..runtime.cached import CachedLM, logits_width
from ..sampling import Sampling
from ..verify.tree import DETERMINISTIC, IID
from .base import Drafter, RowDrafter, share_cache
from .model import TargetStates
from .proposal import RowProposals
from .tree import TreeDraft, chain, empty_tree, merge
from .tree_growth import grow_tree, one_hot, pick_children, tree_shape


def deterministic_tree(tokens: list[int], parents: list[int], vocab_size: int, device: torch.device) -> TreeDraft:
    ids = torch.tensor(tokens, dtype=torch.long, device=device)
    modes = torch.full((len(tokens),), DETERMINISTIC, dtype=torch.long, device=device)
    return TreeDraft(ids, torch.tensor(parents, dtype=torch.long, device=device), one_hot(ids, vocab_size), modes)


class ChainTreeDrafter:
    """A chain drafter seen as a tree drafter (one child per node): chains and trees in the same loop."""

    def __init__(self, drafter: Drafter, k: int = 4):
        self.drafter = drafter
        self.k = k
        self.vocab_size = drafter.vocab_size
        self.draft_cost = getattr(drafter, "draft_cost", None)  # k="auto" prices it as the chain drafter

    def share_cache(self, target: CachedLM) -> None:
        share_cache(self.drafter, target)

    def start(self, prompts: list[torch.Tensor]) -> None:
        self.drafter.start(prompts)

    def rollback(self, lengths: list[int]) -> None:
        self.drafter.rollback(lengths)

    def select(self, rows: list[int]) -> None:
        self.drafter.select(rows)

    def propose(
        self, sequences: list[torch.Tensor], depth: int, sampling: Sampling, vocab_size: int,
        generator: torch.Generator | None,
    ) -> RowProposals:
        drafts = self.drafter.propose(sequences, min(self.k, depth), sampling, vocab_size, generator)
        return drafts.map(lambda d: chain(d.tokens, d.q, IID, d.forwards))  # one i.i.d. child: Leviathan's rule


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


class ModelTreeDrafter(RowDrafter):
    """A small causal LM that branches at the first depths, then extends its most likely branch as a chain.

    branches[d] children per node at depth d (the root is depth 0), picked by `children`: "top" = the b
    most likely tokens by the draft's logits (deterministic candidates, one-hot q), "iid" = b draws from
    q with replacement, "distinct" = b draws without replacement. The chain after the branching depths
    follows the branch with the highest draft probability: its argmax for "top", a sample of q otherwise.
    At most `nodes` nodes and `depth` depth.

    Scoring siblings runs their branches one after another with cache crops: a node whose children are
    needed costs one draft forward of its path. The draft cache holds the sequence plus the branch fed
    last; the next round crops it to the part that still agrees with the sequence and feeds the rest.
    """

    draft_cost = "per_token"  # k="auto": drafting time grows with the depth (one forward per expanded node)

    def __init__(
        self,
        model: PreTrainedModel,
        branches: tuple[int, ...] = (2,),
        depth: int = 4,
        nodes: int = 16,
        children: str = "top",
        reads_target_cache: bool = False,
    ):
        branches, mode = tree_shape(branches, depth, nodes, children)
        self.model = model
        self.vocab_size = logits_width(model)
        self.lm = CachedLM(model)
        self.branches, self.depth, self.nodes, self.mode = branches, depth, nodes, mode
        self.fed = torch.zeros(1, 0, dtype=torch.long)  # (1, lm.length) the tokens in the draft cache
        self.states = TargetStates(reads_target_cache)  # see ModelDrafter: a copy of the target reads its cache

    @property
    def most_nodes(self) -> int:
        """The most nodes one proposal holds."""
        return self.nodes

    def share_cache(self, target: CachedLM) -> None:
        self.states.offer(self.lm, target)

    def fork(self) -> ModelTreeDrafter:
        """The same weights and tree shape for another sequence (a batch's row): a cache of its own, reading
        no target cache (a batch's target cache is not one sequence's)."""
        twin = copy.copy(self)
        twin.lm, twin.fed, twin.states = CachedLM(self.model), self.fed[:, :0], TargetStates(False)
        return twin

    def start(self, prompts: list[torch.Tensor]) -> None:
        if len(prompts) > 1:
            self.states.offered = None  # a batch's target cache is not one sequence's: every row drafts alone
        super().start(prompts)

    def start_row(self, prompt: torch.Tensor) -> None:
        self.lm.reset()
        self.fed = prompt[:, :0]
        if not self.states.begin() and prompt.shape[-1] > 1:
            self.feed(prompt[:, :-1], last_only=True)  # prefill all but the last prompt token

    def rollback_row(self, length: int) -> None:
        """Nothing now: the next propose crops to the part of the cache that agrees with the sequence."""

    def crop(self, length: int) -> None:
        """Branches are fed one after another, so crops go back and forth (every layer keeps its states)."""
        self.lm.crop(length)
        self.fed = self.fed[:, :length]

    def feed(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Append tokens (1, m) to the draft cache; their logits (m, V)."""
        logits = self.lm.forward(tokens, last_only=last_only)[0]
        self.fed = torch.cat([self.fed, tokens.to(self.fed.device)], dim=-1)
        return logits

    def logits_after(self, sequence: torch.Tensor, path: list[int]) -> torch.Tensor:
        """The draft's next-token logits (V,) after sequence (1, L) followed by path."""
        full = torch.cat([sequence, torch.tensor([path], dtype=torch.long, device=sequence.device)], dim=-1)
        n = min(self.fed.shape[-1], full.shape[-1] - 1)
        agree = (self.fed[0, :n] == full[0, :n].to(self.fed.device)).long().cumprod(0).sum()
        self.crop(int(agree))
        return self.feed(full[:, self.lm.length :], last_only=True)[-1]

    def pick(self, logits: torch.Tensor, b: int, sampling: Sampling, vocab_size: int, generator) -> tuple:
        return pick_children(logits, b, self.mode, sampling, vocab_size, generator)

    def propose_row(
        self, sequence: torch.Tensor, depth: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> TreeDraft:
        depth = min(self.depth, depth)
        if depth == 0:
            return empty_tree(vocab_size, sequence.device)
        if self.states.target is not None:
            self.states.copy_into(self.lm)
            self.fed = sequence[:, : self.lm.length].to(self.fed.device)
        return grow_tree(self, sequence, depth, sampling, vocab_size, generator)


class HybridTreeDrafter(ModelTreeDrafter):
    """An n-gram trie and a model tree under one root: the n-gram's deterministic children first, then the
    model's; each keeps its own node budget. model and the keyword options are ModelTreeDrafter's."""

    def __init__(self, model: PreTrainedModel, ngram: NGramTreeDrafter, **options):
        super().__init__(model, **options)
        self.ngram = ngram

    @property
    def most_nodes(self) -> int:
        return self.nodes + self.ngram.nodes

    def propose_row(
        self, sequence: torch.Tensor, depth: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> TreeDraft:
        return merge(
            [
                self.ngram.propose_row(sequence, depth, sampling, vocab_size, generator),
                super().propose_row(sequence, depth, sampling, vocab_size, generator),
            ]
        )
