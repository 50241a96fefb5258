"""Batched speculative decoding: B sequences of different lengths in the one decoding loop (specdec.decoding).

Notation of Leviathan et al.: p target distribution, q draft distribution, k = gamma draft tokens.
A batched round is the single-sequence round done for every row at once:

    choose      one k for the batch (a tree: one depth and node budget), from earlier rounds only
    propose     every active row gets its own proposal (a batched draft model drafts all rows per step)
    score       one target pass over all rows: row b's last token and its proposal, padded to the widest
    accept      each row's acceptance rule runs on that row's p and q alone, with the shared generator
    commit      each row keeps its accepted path in both caches (specdec.batch_cache: dead slots, no copy)
    retire      rows that ended (an end token or their budget) leave the batch: no more drafting for them

Why every row stays exact. Row b's round uses only row b's p and q: the pass computes row b's logits
from row b's own tokens (the masks hide every other row and every dead slot), and the rule accepts row
b's tokens with uniforms drawn for row b alone. So, given the tokens before the round, row b's emitted
tokens have the distribution the single-sequence rule gives them, which is the target's. Sharing a
generator only interleaves the rows' draws; it never makes one row's acceptance depend on another's.
Cutting every row to the batch's shortest accepted length, or one uniform shared by all rows, would not
be exact (tests/test_batch.py shows a chi-square test rejecting both).

Why k may depend only on the past. k (and a tree's shape) is fixed before the pass that computes p, from
rounds that are finished; so for each row the round is a round of speculative sampling with a k chosen
independently of this round's p, which is exact for any k. A k chosen after seeing this round's p (for
example "draft longer while the rows agree") would bias the output.

Seeding: one torch.Generator for the whole batch. Draft tokens are drawn row by row in the order of the
rows still active, then each row's uniforms in the same order; a run is reproducible given its seed and
its batch, but a row's draws depend on which rows share its batch (its distribution does not).
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Rows
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from .batch_cache import DEAD, BatchedLM, left_padded
from .cached import context_length
from .cost import Choice, CostModel, RecentTimes
from .drafters import Drafter, ModelDrafter, same_shapes
from .metrics import Generation, Stats
from .sampling import DEFAULT_SAMPLING, Sampling, probabilities, sample
from .speculative import Draft
from .stopping import EosSet, truncate_at_eos
from .timing import stopwatch
from .tree import TreeDraft, ancestry

# input -----------------------------------------------------------------------------------------------


def batched(input_ids: torch.Tensor | Rows, attention_mask: torch.Tensor | None = None) -> bool:
    """Several prompts: a list, a tensor of other than one row, or any tensor with an attention mask."""
    return not isinstance(input_ids, torch.Tensor) or attention_mask is not None or (
        input_ids.dim() == 2 and input_ids.shape[0] != 1)


def batch_rows(input_ids: torch.Tensor | Rows, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The prompts as rows (1, L_b): a list of token id lists or 1D tensors, or a (B, L) tensor with an
    attention mask of 1 for tokens and 0 for padding (left or right padding; no holes)."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (B, L), got {tuple(input_ids.shape)}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"the attention mask has shape {tuple(attention_mask.shape)} but input_ids "
                             f"{tuple(input_ids.shape)}: give one mask entry (1 token, 0 padding) per token")
        if not ((attention_mask == 0) | (attention_mask == 1)).all():
            raise ValueError("the attention mask must hold only 0 (padding) and 1 (a token)")
        rows = []
        for b, (ids, mask) in enumerate(zip(input_ids, attention_mask.bool())):
            where = mask.nonzero().flatten()
            if where.numel() and int(where[-1] - where[0]) + 1 != where.numel():
                raise ValueError(f"row {b} of the attention mask has padding between tokens: pad on the left "
                                 "or on the right only")
            rows.append(ids[mask])
    else:
        rows = [torch.as_tensor(r, dtype=torch.long).flatten() for r in input_ids]
    if not rows:
        raise ValueError("the batch is empty (batch size 0): give at least one prompt")
    for b, row in enumerate(rows):
        if row.numel() == 0:
            raise ValueError(f"prompt {b} is empty: give at least one token (e.g. the BOS token)")
    return [row[None] for row in rows]


def check_batch(model: PreTrainedModel, prompts: list[torch.Tensor], max_new_tokens: int) -> None:
    """Room in the model's context for every row's generation."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    limit = context_length(model)
    longest = max(p.shape[-1] for p in prompts)
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(f"the longest prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                         f"context ({limit}): lower max_new_tokens to at most {limit - longest}")


# the loop state ---------------------------------------------------------------------------------------


class Batch:
    """The loop state for B rows: each row's tokens so far, its budget, whether it ended, and when.

    `order` lists the rows still in the caches, in cache order; the loop's tokens and proposals follow it.
    """

    def __init__(self, prompts: list[torch.Tensor], max_new_tokens: int, eos: EosSet, device: torch.device):
        self.rows = [p.to(device) for p in prompts]  # (1, L_b) each, grown as rows emit
        self.prompt_lengths = [p.shape[-1] for p in prompts]
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self.ended = [False] * len(prompts)
        self.order = list(range(len(prompts)))
        self.start = time.perf_counter()
        self.latency = [0.0] * len(prompts)  # seconds from the call's start to the row's last token
        self.stats = [Stats() for _ in prompts]  # each row's own counts

    @property
    def tokens(self) -> list[torch.Tensor]:
        """The active rows' sequences (1, L_b), in cache order."""
        return [self.rows[b] for b in self.order]

    def emitted(self, b: int) -> int:
        return self.rows[b].shape[-1] - self.prompt_lengths[b]

    def row_active(self, b: int) -> bool:
        return not self.ended[b] and self.emitted(b) < self.max_new_tokens

    @property
    def active(self) -> bool:
        return bool(self.order)

    def rooms(self) -> list[int]:
        """Draft tokens each active row may still add (one token of its budget is the target's own)."""
        return [self.max_new_tokens - self.emitted(b) - 1 for b in self.order]

    def room(self) -> int:
        return max(self.rooms())

    def extend(self, accepted: list[torch.Tensor], next_tokens: list[torch.Tensor]) -> None:
        """Append each active row's accepted tokens and its target token, cut after an end token."""
        now = time.perf_counter() - self.start
        for b, tokens, last in zip(self.order, accepted, next_tokens):
            new = truncate_at_eos(torch.cat([tokens.to(last.device), last]), self.eos)
            self.rows[b] = torch.cat([self.rows[b], new[None].to(self.rows[b].device)], dim=-1)
            self.ended[b] = self.eos.ended(new)
            self.latency[b] = now

    def retire(self, lm: BatchedLM, drafter: BatchDrafter) -> None:
        """Rows that ended leave the caches (target and draft); the others roll back to their sequence."""
        still = [i for i, b in enumerate(self.order) if self.row_active(b)]
        if len(still) < len(self.order):
            self.order = [self.order[i] for i in still]
            if self.order:
                lm.select(still)
                drafter.select(still)
        if self.order:
            drafter.rollback([self.rows[b].shape[-1] - 1 for b in self.order])

    def new_tokens(self) -> list[torch.Tensor]:
        return [row[0, start:] for row, start in zip(self.rows, self.prompt_lengths)]

    def record(self, stats: Stats, round, trees: bool) -> None:
        """Each active row's share of a round, in the batch's statistics and in the row's own."""
        for b, proposal, path, overlaps in zip(self.order, round.verified.rows, round.path, round.overlaps):
            depth = max(proposal.depths(), default=0)
            for counts in (stats, self.stats[b]):
                counts.record_round(proposal.size, depth, len(path), overlaps.numel(), tree=trees)
            self.stats[b].overlap_sum += float(overlaps.sum())

    def produced(self, round) -> int:
        """Tokens the round made over all rows (accepted + 1 each, before end-token truncation)."""
        return sum(len(path) + 1 for path in round.path)

    def result(self, stats: Stats) -> BatchGeneration:
        """The finished batch: counts summed over rows, each row's latency and emitted tokens."""
        for b, row in enumerate(self.stats):
            row.emitted = self.emitted(b)
            row.seconds.update({phase: t for phase, t in stats.seconds.items() if phase != "total"})  # shared
            row.seconds["total"] = self.latency[b]
        stats.emitted = sum(row.emitted for row in self.stats)
        stats.extras.update(passes=len(stats.chosen_k) or stats.extras.get("passes", 0), rows=len(self.stats))
        return BatchGeneration(self.new_tokens(), stats, self.stats, list(self.latency))


# proposals and their scoring -------------------------------------------------------------------------


@dataclass
class RowProposals:
    """One proposal per active row (chains or trees), scored by one target pass over all rows."""

    rows: list[Draft | TreeDraft]
    forwards: int = 0  # draft passes spent (a batched draft model: one per step for all rows)

    @property
    def size(self) -> int:
        """The pass's proposal width: the largest row's (the others are padded)."""
        return max(r.size for r in self.rows)

    def depths(self) -> list[int]:
        return [d for r in self.rows for d in r.depths()]

    def depth(self) -> int:
        return max(self.depths(), default=0)

    def map(self, change) -> RowProposals:
        return RowProposals([change(r) for r in self.rows], self.forwards)

    def score(self, lm: BatchedLM, sequences: list[torch.Tensor], sampling: Sampling, vocab: int
              ) -> list[torch.Tensor]:
        """One target pass: row b's last token (the root) and its proposal; p_b (n_b + 1, V) per row."""
        width = 1 + self.size
        lengths = lm.lengths().tolist()
        tokens = torch.zeros(len(self.rows), width, dtype=torch.long)
        positions = torch.full((len(self.rows), width), DEAD, dtype=torch.long)
        seen = torch.zeros(len(self.rows), width, width, dtype=torch.bool)
        for b, (proposal, sequence, cached) in enumerate(zip(self.rows, sequences, lengths)):
            if sequence.shape[-1] != cached + 1:
                raise RuntimeError(f"row {b}: the target caches {cached} of {sequence.shape[-1]} tokens; it must "
                                   "cache all but the last")
            n = proposal.size
            tokens[b, 0] = sequence[0, -1]
            tokens[b, 1 : 1 + n] = proposal.tokens
            positions[b, 0] = cached
            positions[b, 1 : 1 + n] = cached + torch.tensor(proposal.depths(), dtype=torch.long)
            seen[b, : 1 + n, : 1 + n] = ancestry([-1] + [p + 1 for p in proposal.parents.tolist()])  # root = 0
        logits = lm.forward(tokens, positions, seen)  # (B, width, V)
        p = probabilities(logits[..., :vocab], sampling)
        return [p[b, : 1 + r.size] for b, r in enumerate(self.rows)]

    def overlaps(self, p: list[torch.Tensor], paths: list[list[int]]) -> list[torch.Tensor]:
        """Each row's beta = sum_x min(p, q) on its output path."""
        return [r.overlaps(p_b, path) for r, p_b, path in zip(self.rows, p, paths)]

    def accepted(self, paths: list[list[int]]) -> list[torch.Tensor]:
        return [r.tokens[path] for r, path in zip(self.rows, paths)]


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


# drafters for a batch -------------------------------------------------------------------------------


class BatchDrafter:
    """What the loop asks of a batch's drafter: the Drafter protocol over rows, and `select` (rows leave)."""

    vocab_size: int | None
    draft_cost: str

    def start(self, prompts: list[torch.Tensor]) -> None: ...

    def propose(self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
                generator: torch.Generator | None) -> RowProposals: ...

    def rollback(self, lengths: list[int]) -> None: ...

    def select(self, rows: list[int]) -> None: ...


class BatchModelDrafter(BatchDrafter):
    """A draft model drafting every row at once: one forward of B tokens per draft step.

    Each row's unseen tail (its last token, and after a full acceptance or a plain step a few more) is fed
    left-padded in one pass; then k - 1 one-token steps. A rejection only marks the row's dead slots
    (specdec.batch_cache), so rollback copies nothing.

    reads_target_cache=True (a reduced-precision copy of the target, as for ModelDrafter): instead of its
    own prefill and catch-up passes, before each proposal the draft cache takes the target's cached states,
    cast to the draft's dtype (only the slots appended since the last copy, unless the target's slots moved),
    and the draft runs one-token steps only. q is still what each token is sampled from, so every row stays
    exact; the draft is "the copy, reading the target's states".
    """

    draft_cost = "per_token"

    def __init__(self, model: PreTrainedModel, reads_target_cache: bool = False):
        self.model = model
        self.lm = BatchedLM(model)
        self.vocab_size = self.lm.vocab_size
        self.reads_target_cache = reads_target_cache
        self.offered: BatchedLM | None = None  # the target cache the loop handed over for the next batch
        self.target: BatchedLM | None = None  # the target cache read during this batch
        self.synced, self.layout = 0, -1  # target slots copied, in the target's layout `layout`

    def share_cache(self, target: BatchedLM) -> None:
        if self.reads_target_cache and same_shapes(self.model, target.model) and target.device == self.lm.device:
            self.offered = target

    def start(self, prompts: list[torch.Tensor]) -> None:
        self.target, self.offered, self.synced, self.layout = self.offered, None, 0, -1
        if self.target is None:
            self.lm.prefill(prompts)

    def copy_target(self) -> None:
        """Make the draft cache hold the target's states for every slot the target holds."""
        if self.target.layout != self.layout:  # its slots moved (or a first copy): start over
            self.lm.reset()
            self.synced, self.layout = 0, self.target.layout
        self.lm.copy_from(self.target, self.synced)
        self.synced = self.target.slots

    def propose(self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
                generator: torch.Generator | None) -> RowProposals:
        if self.target is not None:
            self.copy_target()
        lengths = self.lm.lengths().tolist()
        tokens, positions = left_padded([s[0, n:] for s, n in zip(sequences, lengths)], lengths, self.lm.device)
        logits = self.lm.forward(tokens, positions, last_only=True)[:, -1, :vocab_size]  # (B, V)
        next_position = positions[:, -1:] + 1
        drafted, rows = [], []
        for i in range(k):
            q = probabilities(logits, sampling)  # (B, V)
            x = sample(q, generator)  # (B,)
            drafted.append(x)
            rows.append(q)
            if i + 1 < k:
                logits = self.lm.forward(x[:, None], next_position + i)[:, -1, :vocab_size]
        x, q = torch.stack(drafted, dim=1), torch.stack(rows, dim=1)  # (B, k), (B, k, V)
        return RowProposals([Draft(x[b], q[b], forwards=k) for b in range(len(sequences))], forwards=k)

    def rollback(self, lengths: list[int]) -> None:
        if self.target is None:  # reading the target, the next copy replaces the draft's own slots
            self.lm.truncate(torch.tensor(lengths))

    def select(self, rows: list[int]) -> None:
        if self.target is None:  # reading the target, its layout changed: the next copy starts over
            self.lm.select(rows)


class RowDrafters(BatchDrafter):
    """Any single-sequence drafter, one copy per row (fork), each proposing for its own row: prompt lookup
    and the tree drafters. A model drafter copied this way drafts its rows one after another; the target's
    pass is still one for the whole batch."""

    def __init__(self, drafter: Drafter):
        self.prototype = drafter
        self.vocab_size = drafter.vocab_size
        self.draft_cost = getattr(drafter, "draft_cost", None)
        self.drafters: list[Drafter] = []

    def start(self, prompts: list[torch.Tensor]) -> None:
        self.drafters = [fork(self.prototype) for _ in prompts]
        for drafter, prompt in zip(self.drafters, prompts):
            drafter.start(prompt)

    def propose(self, sequences: list[torch.Tensor], k: int, sampling: Sampling, vocab_size: int,
                generator: torch.Generator | None) -> RowProposals:
        rows = [d.propose(s, k, sampling, vocab_size, generator) for d, s in zip(self.drafters, sequences)]
        return RowProposals(rows, forwards=sum(r.forwards for r in rows))

    def rollback(self, lengths: list[int]) -> None:
        for drafter, length in zip(self.drafters, lengths):
            drafter.rollback(length)

    def select(self, rows: list[int]) -> None:
        self.drafters = [self.drafters[i] for i in rows]


def fork(drafter: Drafter) -> Drafter:
    """A drafter for one more row: the same object if it keeps no state between calls, else its fork()."""
    if getattr(drafter, "stateless", False):  # prompt lookup reads only the sequence it is given
        return drafter
    if hasattr(drafter, "fork"):
        return drafter.fork()
    raise ValueError(
        f"{type(drafter).__name__} cannot draft for a batch (it keeps per-sequence state and has no fork()): use "
        "batch_size=1 with it, or a model drafter, prompt lookup or a tree drafter"
    )


def batch_drafter(drafter: Drafter | BatchDrafter) -> BatchDrafter:
    """The batch form of a drafter: a chain draft model drafts all rows per step; others get one copy per row."""
    if isinstance(drafter, BatchDrafter):
        return drafter
    if type(drafter) is ModelDrafter:
        return BatchModelDrafter(drafter.model, drafter.reads_target_cache)
    if getattr(drafter, "candidates", None) is not None:
        raise ValueError("a DraftSwitch (the draft chosen online among candidates) does not batch yet: give one "
                         "of its candidates as the drafter (the run picks the calibrated best at batch_size > 1)")
    fork(drafter)  # refuse early what cannot batch
    return RowDrafters(drafter)


# choosing k for a batch ------------------------------------------------------------------------------


class BatchCostModel(CostModel):
    """specdec.cost.CostModel for a batch: one k per round for all active rows, from measured costs.

    With R rows a pass over chains of k is R (k + 1) tokens wide and a draft step drafts R tokens, so
    C_R(k) = T_pass(R (k + 1)) + k T_step(R); each row expects E(k) tokens, the batch R E(k), and the
    k maximising E(k) / C_R(k) maximises the batch's tokens per second. T_pass is keyed by the pass's total
    token count (an unseen count is read off the line through the measured ones), T_step by the row count
    (the nearest measured count stands in for an unseen one). On a machine where a pass costs about its
    token count (a CPU at large R) C_R(k) grows like k + 1 and E(k) / C_R(k) falls below E(0) / C_R(0): k = 0,
    plain batched decoding, is then chosen. Acceptance is pooled over rows (each row's beta_i at the
    positions it reached), decayed once per round.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows = 1  # active rows of the coming round (the loop sets it)
        self.step_times: dict[int, RecentTimes] = {}  # rows -> seconds per draft step (or per call)
        self.plain_timed = False

    def record_batch_draft(self, rows: int, steps: int, seconds: float) -> None:
        if self.draft_cost == "per_call" or steps:
            unit = seconds if self.draft_cost == "per_call" else seconds / steps
            self.step_times.setdefault(rows, RecentTimes(self.window, self.max_age)).add(self.round, unit)

    def observe(self, round) -> None:
        """A finished batch round: its rows, draft steps, pass width and every row's beta_i."""
        self.round += 1
        rows, drafted = len(round.verified.rows), round.verified.size
        if round.choice.k:
            self.record_batch_draft(rows, drafted, round.seconds["draft"])
        self.record_pass(rows * (drafted + 1), round.seconds["verify"])
        self.plain_timed |= drafted == 0
        for i in range(self.k_max):
            self.overlap_sum[i] *= self.decay
            self.overlap_weight[i] *= self.decay
        for row_overlaps in round.overlaps:
            for i, beta in enumerate(row_overlaps.tolist()[: self.k_max]):
                self.overlap_sum[i] += beta
                self.overlap_weight[i] += 1.0

    def draft_seconds(self, k: int) -> float:
        if k == 0:
            return 0.0
        nearest = min(self.step_times, key=lambda r: (abs(r - self.rows), -r))
        unit = self.step_times[nearest].median(self.round)
        return unit if self.draft_cost == "per_call" else k * unit

    def cost(self, k: int) -> float:
        return self.pass_seconds(self.rows * (k + 1)) + self.draft_seconds(k)

    def predicted(self, k: int) -> Choice:
        """k with the batch's E (every row's E(k): R E(k) tokens) and C_R(k)."""
        choice = super().predicted(k)
        return Choice(k, expected_tokens=self.rows * choice.expected_tokens, seconds=choice.seconds)

    @property
    def ready(self) -> bool:
        return self.plain_timed and len(self.pass_times) > 1 and len(self.step_times) > 0

    def choose(self, limit: int):
        limit = min(limit, self.k_max)
        if not self.ready:
            return Choice(limit if self.plain_timed else 0)
        return super().choose(limit)


# results ---------------------------------------------------------------------------------------------


@dataclass
class BatchGeneration:
    """Every row's new tokens, the batch's statistics, and each row's own.

    stats counts over all rows: emitted is the batch's tokens, target_forwards the row-passes (a pass over R
    rows counts R), so mean_accepted_length is the tokens per pass of one row; extras["passes"] is the
    number of target passes and stats.tokens_per_second the batch's throughput. latency[b]: seconds from
    the call's start to row b's last token (rows[b].seconds["total"]); a row's other phase times
    (prefill, draft, verify) are the batch's, which all its rows shared.
    """

    tokens: list[torch.Tensor]
    stats: Stats
    rows: list[Stats] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)

    def __getitem__(self, b: int) -> Generation:
        return Generation(self.tokens[b], self.rows[b])

    def __len__(self) -> int:
        return len(self.tokens)


# the target-only baseline at batch size B ------------------------------------------------------------


def batched_autoregressive(
    target: PreTrainedModel,
    prompts: list[torch.Tensor],
    *,
    sampling: Sampling = DEFAULT_SAMPLING,
    max_new_tokens: int = 64,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> BatchGeneration:
    """Target-only decoding of B rows: one pass of one token per active row per step; finished rows leave."""
    check_batch(target, prompts, max_new_tokens)
    lm = BatchedLM(target, vocab_size=vocab_size)
    state = Batch(prompts, max_new_tokens, EosSet(eos_token_id), lm.device)
    stats = Stats()
    with stopwatch(stats.seconds, "total", lm.device):
        with stopwatch(stats.seconds, "prefill", lm.device):
            lm.prefill(state.tokens)
        with stopwatch(stats.seconds, "verify", lm.device):
            passes = 0
            while state.active:
                last = torch.cat([s[:, -1:] for s in state.tokens])  # (R, 1)
                logits = lm.forward(last, lm.lengths()[:, None], last_only=True)[:, -1]
                tokens = sample(probabilities(logits, sampling), generator)  # (R,)
                passes += 1
                for b in state.order:
                    state.stats[b].target_forwards += 1
                stats.target_forwards += len(state.order)
                state.extend([tokens[:0]] * len(state.order), [t[None] for t in tokens])
                still = [i for i, b in enumerate(state.order) if state.row_active(b)]
                if len(still) < len(state.order):
                    state.order = [state.order[i] for i in still]
                    if state.order:
                        lm.select(still)
    stats.extras["passes"] = passes
    return state.result(stats)
