"""Drafting with a trained head (specdec.draft.head) on the features the target's passes already computed.

The loop caches every token of a sequence but its last in the target; with `keep_features` the target's cache
also keeps each slot's feature f_i. Before drafting, the head catches up on the positions it has not read:
for each cached position i it takes (f_i, x_{i+1}) and writes its own KV cache; its output at the last cached
position predicts the feature of the sequence's last token, whose W_S row gives q for the first draft token.
Each further draft token feeds the head its own prediction: no target pass and no second copy of the target.
The head's cache keeps only positions read from true features; its drafting steps are cropped at the next call.

With a `confidence` threshold a chain stops before the token where the product of the head's top probabilities
max_x softmax(W_S f^)(x) along the chain falls below it (EAGLE-2's observation: a head's confidence tracks its
acceptance, and a path's product of confidences its chance of being accepted whole), so that rounds where the head
would likely be rejected run as plain target steps, and confident stretches draft up to k. The choice to draft one more
token depends only on what precedes that token, never on the token or on the target, so the output distribution
stays the target's (tests/test_head_options.py checks it).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from ..runtime.cached import CachedLM
from ..sampling import Sampling, sample
from .base import RowDrafter
from .head import DraftHead, load_head, spread_over
from .head_runtime import compiled_head
from .proposal import Draft, RowProposals
from .tree import TreeDraft, empty_tree, grow_tree, tree_shape


class HeadDrafter(RowDrafter):
    """Chains of up to k tokens from a DraftHead, one row at a time (a batch: one fork per row)."""

    draft_cost = "per_token"

    def __init__(self, head: DraftHead, confidence: float | None = None):
        if confidence is not None and not 0 <= confidence < 1:
            raise ValueError(f"confidence must be in [0, 1) (the chain's head probability below which it stops) or "
                             f"None, got {confidence}")
        self.head = head.eval()
        self.confidence = confidence
        self.vocab_size = head.vocab_size
        self.source: CachedLM | None = None  # the target cache whose features the head reads
        self.row = 0  # this fork's row in the target's batch
        self.checkpoint: str | None = None  # the folder the head was loaded from, if any

    def fork(self) -> HeadDrafter:
        twin = HeadDrafter(self.head, self.confidence)
        twin.source = self.source
        return twin

    def share_cache(self, target: CachedLM) -> None:
        """Read this target's features (the loop offers its cache before the target caches the prompts)."""
        target.keep_features()
        self.source = target
        if getattr(self, "forks", None):
            for fork in self.forks:
                fork.source = target

    def start(self, prompts: list[torch.Tensor]) -> None:
        if self.source is None:
            raise ValueError("a head drafter reads the target's features: decode with specdec's loop (decode, "
                             "speculative_generate), which hands it the target's cache")
        super().start(prompts)

    def start_row(self, prompt: torch.Tensor) -> None:
        self.runtime = compiled_head(self.head)  # fixed for the sequence: it decides the kind of cache
        self.cache = self.runtime.new_cache() if self.runtime else DynamicCache(config=self.head.body.config)
        self.length = 0  # positions in the head's cache
        self.synced = 0  # positions the head has read from true features

    def propose(
        self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
        generator: torch.Generator | None,
    ) -> RowProposals:
        for b, fork in enumerate(self.forks):
            fork.row = b
        return super().propose(sequences, k, sampling, vocab_size, generator)

    @torch.inference_mode()
    def propose_row(
        self, sequence: torch.Tensor, k: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> Draft:
        features = self.source.row_features(self.row)  # (L - 1, d): every position but the last
        cached = features.shape[0]
        if cached == 0 or k == 0:
            return Draft.empty(vocab_size, sequence.device)
        predicted, logits = self.catch_up(features, sequence[0], cached)  # f^ of the last token (1, d), W_S f^
        drafted, rows, reach = [], [], 1.0  # reach: the product of the head's top probabilities so far
        for i in range(k):
            if self.confidence:
                reach *= float(logits.softmax(dim=-1).max())
                if reach < self.confidence:
                    break  # not confident: the round verifies the tokens drafted so far (none: a plain step)
            ids, q = self.head.subset_distribution(logits, sampling, vocab_size)  # (N',), q on them (1, N')
            x = ids[q.argmax(dim=-1) if sampling.greedy else sample(q, generator)]  # (1,): drawn on S alone
            drafted.append(x)
            rows.append(q[0])
            if i + 1 < k:
                predicted, logits = self.step(predicted, x, cached + i)
        if not drafted:
            return Draft.empty(vocab_size, sequence.device)
        return Draft(torch.cat(drafted), spread_over(ids, torch.stack(rows), vocab_size), forwards=len(drafted))

    def catch_up(self, features: torch.Tensor, tokens: torch.Tensor, cached: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Read (f_i, x_{i+1}) for the positions not read yet (at least the last one); f^ at the last (1, d) and
        its logits on S (1, N)."""
        start = min(self.synced, cached - 1)
        self.crop_to(start)
        positions = torch.arange(start, cached, device=features.device)[None]  # (1, n)
        predicted, logits = self.advance(features[None, start:cached], tokens[None, start + 1 : cached + 1],
                                         positions)
        self.synced = cached
        return predicted[:, -1], logits

    def advance(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's forward on the n positions after its cache's (features (1, n, d), tokens and positions
        (1, n)): f^ at each (1, n, d), and the logits on S at the last (1, N); eager or compiled."""
        if self.runtime is None:
            predicted = self.head(features, tokens, positions, self.cache)
            logits = self.head.subset_logits(predicted[:, -1])
        else:
            predicted, logits = self.runtime.forward(self.cache, self.length, features, tokens, positions)
            logits = logits[:, -1]
        self.length += tokens.shape[1]
        return predicted, logits

    def crop_to(self, length: int) -> None:
        """Keep the first `length` positions of the head's cache."""
        surplus = self.length - length
        if surplus > 0:
            if self.runtime is None:
                self.cache.crop(-surplus)  # transformers' crop takes the number of positions to drop, negated
            else:
                for layer in self.cache.layers:
                    layer.keep_slots(length)
            self.length = length

    def step(self, predicted: torch.Tensor, token: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafting step on the head's own prediction: (f^, x) at `position` -> the next f^ (1, d) and its
        logits on S (1, N)."""
        positions = torch.tensor([[position]], device=predicted.device)
        predicted, logits = self.advance(predicted[:, None], token[None].to(predicted.device), positions)
        return predicted[:, -1], logits

    def rollback_row(self, length: int) -> None:
        self.synced = min(self.synced, max(length - 1, 0))


class HeadTreeDrafter(HeadDrafter):
    """Token trees from a DraftHead (EAGLE-2's idea: branch where the head is unsure): `branches[d]` children per
    node at depth d, picked by `children` ("top": the b most likely, one-hot q; "iid": b draws from q; "distinct":
    without replacement), then the most likely branch as a chain; at most `nodes` nodes and `depth` depth
    (specdec.draft.tree.grow_tree). A node's children need the head's prediction for its path: the head's cache holds
    the sequence's true positions and the path fed last; another path crops it back to their common prefix."""

    def __init__(self, head: DraftHead, branches: tuple[int, ...] = (2,), depth: int = 4, nodes: int = 16,
                 children: str = "top"):
        branches, mode = tree_shape(branches, depth, nodes, children)
        super().__init__(head)
        self.branches, self.depth, self.nodes, self.mode = branches, depth, nodes, mode

    @property
    def most_nodes(self) -> int:
        return self.nodes

    def fork(self) -> HeadTreeDrafter:
        twin = HeadTreeDrafter(self.head, self.branches, self.depth, self.nodes)
        twin.mode, twin.source = self.mode, self.source
        return twin

    @torch.inference_mode()
    def propose_row(
        self, sequence: torch.Tensor, depth: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> TreeDraft:
        features = self.source.row_features(self.row)  # (L - 1, d)
        depth, self.width = min(self.depth, depth), vocab_size
        if features.shape[0] == 0 or depth == 0:
            return empty_tree(vocab_size, sequence.device)
        self.cached = features.shape[0]
        self.predicted = {(): self.catch_up(features, sequence[0], self.cached)[0]}  # path -> f^ of its last token
        self.fed: tuple[int, ...] = ()  # the path whose head states follow the sequence's in the head's cache
        return grow_tree(self, sequence, depth, sampling, vocab_size, generator)

    def draft_ids(self, vocab_size: int) -> torch.Tensor:
        """The tokens the head drafts from (S below the vocabulary's width, (N',)): logits_after's entries."""
        return self.head.draft_ids(vocab_size)

    def logits_after(self, sequence: torch.Tensor, path: list[int]) -> torch.Tensor:
        """The head's logits (N',) on draft_ids for the token after the sequence followed by path (q is 0 on every
        other token: specdec.draft.tree.grow_tree grows the tree on S)."""
        path = tuple(path)
        if path not in self.predicted:
            self.feed(path)
        return self.head.subset_logits(self.predicted[path][0])[self.head.kept(self.width)]

    def feed(self, path: tuple[int, ...]) -> None:
        """Predict the features of path's prefixes the head has not read: crop its cache to the prefix shared with
        the path fed last, then read (f^ of each prefix, its next token) in one forward."""
        common = next((i for i, (a, b) in enumerate(zip(self.fed, path)) if a != b), min(len(self.fed), len(path)))
        common = min(common, len(path) - 1)
        self.crop_to(self.cached + common)
        inputs = torch.cat([self.predicted[path[:i]] for i in range(common, len(path))])  # (n, d)
        tokens = torch.tensor([path[common:]], device=inputs.device)
        positions = torch.arange(self.cached + common, self.cached + len(path), device=inputs.device)[None]
        out = self.advance(inputs[None], tokens, positions)[0][0]  # (n, d)
        for i in range(common, len(path)):
            self.predicted[path[: i + 1]] = out[i - common][None]
        self.fed = path


def load_head_drafter(target: PreTrainedModel, checkpoint: str | None, dtype: str | None = None,
                      confidence: float | None = None, vocab: int | None = None) -> HeadDrafter:
    """A HeadDrafter with the head trained for `target`, saved in the folder `checkpoint`, run in `dtype` (None:
    the target's), its chains stopped below `confidence` (None: always k tokens), its draft vocabulary cut to the
    `vocab` most frequent tokens (None: the head's own)."""
    if checkpoint is None:
        raise ValueError("no draft head is trained for this target: train one with `python -m "
                         "experiments.train_draft model=<pair>` (make train-draft), or name its folder in checkpoint=")
    drafter = HeadDrafter(load_head(checkpoint, target, dtype, vocab), confidence)
    drafter.checkpoint = str(checkpoint)  # where the head came from (a benchmark records its training)
    return drafter


def load_head_tree_drafter(target: PreTrainedModel, checkpoint: str | None, dtype: str | None = None,
                           vocab: int | None = None, **shape) -> HeadTreeDrafter:
    """A HeadTreeDrafter of the given shape (branches, depth, nodes, children) with the head in `checkpoint`."""
    drafter = HeadTreeDrafter(load_head_drafter(target, checkpoint, dtype, vocab=vocab).head, **shape)
    drafter.checkpoint = str(checkpoint)
    return drafter
