"""Draft models: a small causal LM (or a cheaper copy of the target) that samples each draft token from q,
as a chain (ModelDrafter) or as a tree that branches at the first depths (ModelTreeDrafter; HybridTreeDrafter
puts an n-gram trie beside it under one root).

A drafter proposes up to k tokens after each row's sequence together with the distribution q each was sampled
from. Speculative sampling is exact only if the tokens really are samples of the returned q.
"""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

from ..runtime.cached import CachedLM, logits_width
from ..sampling import Sampling, probabilities, sample
from .base import RowDrafter
from .ngram import NGramTreeDrafter
from .proposal import Draft, RowProposals
from .tree import TreeDraft, empty_tree, grow_tree, merge, pick_children, tree_shape


class ModelDrafter:
    """A small causal LM that samples each draft token from its processed distribution q, for every row at once:
    one forward of B tokens per draft step (B = 1: one sequence).

    Each row's unseen tail (its last token, and after a full acceptance or a plain step a few more) is fed
    left-padded in one pass; then k - 1 one-token steps. A rejection crops one row's cache, and only marks dead
    slots in a batch's (specdec.runtime.cached), so rollback copies nothing.

    reads_target_cache=True (for a reduced-precision copy of the target: same layers, heads and head size):
    instead of computing its own states for the prompt and for accepted tokens, the draft takes the target's KV
    cache, cast to its own dtype, and runs only one-token steps. This removes the draft's prefill and catch-up
    passes (on a CPU without native bf16 matmuls a bf16 prompt pass costs several target passes) and a k = 0
    round costs the draft nothing. q is still the distribution each token is sampled from, so speculative
    sampling stays exact; the draft is then "the copy, reading the target's states", a different (usually
    better aligned) draft than the copy alone. The loop hands the target's cache over with `share_cache`; a loop
    that does not (or a target cache this copy cannot read) leaves the drafter computing its own states.
    """

    draft_cost = "per_token"

    def __init__(self, model: PreTrainedModel, reads_target_cache: bool = False):
        self.model = model
        self.lm = CachedLM(model)
        self.vocab_size = self.lm.vocab_size
        self.states = TargetStates(reads_target_cache)

    @property
    def reads_target_cache(self) -> bool:
        return self.states.enabled

    @property
    def target(self) -> CachedLM | None:
        """The target cache read during the current sequences (None: the draft computes its own states)."""
        return self.states.target

    def share_cache(self, target: CachedLM) -> None:
        self.states.offer(self.lm, target)

    def start(self, prompts: list[torch.Tensor]) -> None:
        self.lm.reset()
        if not self.states.begin():
            self.lm.prefill(prompts)

    def propose(
        self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
        generator: torch.Generator | None,
    ) -> RowProposals:
        if k == 0:
            return RowProposals.empty(len(sequences), vocab_size, sequences[0].device)
        if self.states.target is not None:
            self.states.copy_into(self.lm)
        logits = self.lm.advance(sequences, last_only=True)[:, -1, :vocab_size]  # (B, V)
        drafted, rows = [], []
        for i in range(k):
            q = probabilities(logits, sampling)  # (B, V)
            x = logits.argmax(dim=-1) if sampling.greedy else sample(q, generator)  # (B,): q's one token, greedy
            drafted.append(x)
            rows.append(q)
            if i + 1 < k:
                logits = self.lm.forward(x[:, None].to(self.lm.device))[:, -1, :vocab_size]
        x, q = torch.stack(drafted, dim=1), torch.stack(rows, dim=1)  # (B, k), (B, k, V)
        return RowProposals([Draft(x[b], q[b], forwards=k) for b in range(len(sequences))], forwards=k)

    def rollback(self, lengths: list[int]) -> None:
        if self.states.target is None:  # reading the target, the next copy replaces the draft's own slots
            self.lm.truncate(lengths)

    def select(self, rows: list[int]) -> None:
        if self.states.target is None:  # reading the target, its layout changed: the next copy starts over
            self.lm.select(rows)


class TargetStates:
    """The target's KV cache as a draft model reads it (ModelDrafter, ModelTreeDrafter with reads_target_cache).

    The loop offers its target cache before the sequences start (`offer`); `begin` takes the offer. Before each
    proposal `copy_into` makes the draft cache hold the target's states for every slot the target holds (each
    sequence but its last token), cast to the draft's dtype: slots copied earlier stay while the target's layout
    is unchanged (a crop keeps them), the draft's own states for its last proposal are dropped.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.offered: CachedLM | None = None  # the cache the loop handed over for its next sequences
        self.target: CachedLM | None = None  # the cache read during the current sequences
        self.synced, self.layout = 0, -1  # target slots copied, in the target's layout `layout`

    def offer(self, draft: CachedLM, target: CachedLM) -> None:
        """Read target during the next sequences, if enabled and the draft's cache can hold its states."""
        if self.enabled and can_read_cache(draft, target):
            self.offered = target

    def begin(self) -> bool:
        """New sequences: take the cache offered for them, if any; True if the draft reads it."""
        self.target, self.offered, self.synced, self.layout = self.offered, None, 0, -1
        return self.target is not None

    def copy_into(self, draft: CachedLM) -> None:
        """Make draft hold the target's states for every slot the target holds."""
        if self.target.layout != self.layout:  # its slots moved (or a first copy): start over
            draft.reset()
            self.synced, self.layout = 0, self.target.layout
        draft.copy_from(self.target, min(self.synced, self.target.slots))
        self.synced = self.target.slots


def can_read_cache(draft: CachedLM, target: CachedLM) -> bool:
    """Whether the draft's cache can hold the target's states: the same architecture and sizes (layers, heads,
    head size) on the same device."""
    return same_shapes(draft.model, target.model) and draft.device == target.device


def same_shapes(draft: PreTrainedModel, target: PreTrainedModel) -> bool:
    """Whether the draft's layers can hold the target's states: the same architecture, layers, heads, head size."""
    a, b = draft.config.get_text_config(), target.config.get_text_config()
    shape = ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
             "head_dim")
    return all(getattr(a, f, None) == getattr(b, f, None) for f in shape)


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
