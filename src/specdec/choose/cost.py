"""How much to speculate: draft lengths chosen each round from costs and acceptance measured online.

Notation of Leviathan et al. (2023): k (their gamma) draft tokens, a_i the probability that draft position i is
accepted given that positions 1..i-1 were. A round that drafts k tokens emits in expectation

    E(k) = sum_{j=0..k} prod_{i<=j} a_i        (E(0) = 1: a plain target step)

tokens and costs C(k) = T_pass(k + 1) + T_draft(k) seconds, with T_pass(w) the time of one target pass over w
tokens (T_pass(1) is a plain step) and T_draft(k) the time to draft k tokens. Each round picks k in 0..k_max
maximising E(k) / C(k), the expected tokens per second: Leviathan's Thm 3.8 with per-position acceptance and the
measured pass cost in place of "1".

The rule looks only at earlier rounds (their times and acceptance) and the tokens so far, never at this round's
target distribution p, so the output keeps the target's distribution: whatever k a round uses, speculative
sampling with that k is exact, and k is fixed before p is seen.

Every number is measured while generating; nothing is a hard-coded timing constant:
- T_pass(w): the median of the last `window` passes of width w that are recent (measured in the last
  `max_age` rounds; a width measured longer ago counts by its newest pass alone, so that a change of
  machine load reaches every estimate within a few rounds); an unseen width is read off a least-squares
  line over the measured widths, never below T_pass(1);
- T_draft(k): k times the median time per drafted token (`draft_cost="per_token"`, a draft model:
  each token is one forward), or the median time per call (`draft_cost="per_call"`, prompt lookup:
  a proposal costs about the same whatever its length);
- a_i: beta_i = sum_x min(p_i(x), q_i(x)), the probability that position i is accepted given that it
  is reached (for a deterministic drafter, q_i is one-hot and beta_i = p_i(x_i)), averaged over the
  rounds that reached position i with weights that decay by `decay` per round; a position with
  little recent evidence is shrunk towards a_{i-1} (position 1 towards `prior`, or with `prior_weight` towards
  the run's mean beta_1: prompt lookup among draft models, specdec.choose.online). With from_rounds False the
  model learns acceptance only from record_acceptance (lookup's hindsight, specdec.choose.online), not rounds.
A round during which a graph of the compiled runtime compiled (specdec.runtime.compiled: a first pass of its
shape, seconds to a minute) gives its acceptance but no times.

A round with k = 0 is a plain target step and calls no drafter (a draft model catches up on the
unseen tail at its next proposal). A lookup drafter is asked for the chosen k tokens, which for prompt
lookup is the first k of what it would propose for k_max.

Warm-up: the first round is a plain step (measures T_pass(1)); rounds then draft k_max tokens until a
pass wider than one token and a draft have been timed. Exploration: the decay also shrinks the
evidence of positions that are no longer drafted, so after a run of plain steps a_1 drifts back
towards the prior and drafting is tried again (unless drafting is too expensive for any acceptance).

Token trees (specdec.tree_generate, k="auto"): specdec.choose.tree_cost.TreeCostModel chooses a depth and a node
budget per round with acceptance learned per depth and sibling rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from ..theory import best_draft_length, expected_tokens
from .timings import RecentTimes, interpolated

DraftCost = Literal["per_token", "per_call"]
Tokens = Sequence[torch.Tensor] | None  # each row's tokens so far, (1, L) each, as the loop passes them to a rule
DRAFT_COSTS = ("per_token", "per_call")


@dataclass(frozen=True)
class Choice:
    """A round's draft length k (a tree: its depth; 0: a plain target step; None: as deep as the drafter likes
    within the budget), a tree's node budget (None: no pruning), and the model's E and C (None: warm-up, fixed)."""

    k: int | None
    nodes: int | None = None
    expected_tokens: float | None = None
    seconds: float | None = None
    draft: str | None = None  # the candidate chosen online (specdec.choose.online; "": no draft), None: one drafter
    threads: int | None = None  # the torch thread count chosen online (specdec.choose.threads.OnlineThreadChoice)

    @property
    def prediction(self) -> tuple[float, float] | None:
        """(E, C), or None when the round was not predicted."""
        return None if self.seconds is None else (self.expected_tokens, self.seconds)


class ObservedRound(Protocol):
    """What a rule observes of a finished round (specdec.decoding.Round has these fields)."""

    choice: Choice
    proposed: object  # the drafter's proposal (a tree: before pruning), with .size and .parents
    verified: object  # what the target scored: one proposal per row (specdec.draft.proposal.RowProposals)
    path: list[list[int]]  # each row's accepted node ids of its proposal
    overlaps: list[torch.Tensor]  # each row's (observed,) beta = sum_x min(p, q) on its output path
    seconds: dict[str, float]  # "draft", "verify"
    timed: bool  # False: its seconds timed a compile (specdec.runtime.compiled), not the round: not learned


class FixedDraftLength:
    """k draft tokens every round (fewer near the end of the budget): the classical algorithm. For trees k
    is the depth; k=None lets the drafter draft as deep as it likes within the budget."""

    clock = None  # reads no times: the loop need not synchronize the device around its phases

    def __init__(self, k: int | None):
        self.k = k

    def choose(self, limit: int, rows: int = 1, tokens: Tokens = None) -> Choice:
        return Choice(None if self.k is None else min(self.k, limit))

    def observe(self, round: ObservedRound) -> None:
        pass


class Rule(Protocol):
    """What the decoding loop asks of a rule: a choice from earlier rounds only, and each finished round."""

    clock: Callable[[], float] | None  # the clock the rule reads round times with; None: it reads none

    def choose(self, limit: int, rows: int = 1, tokens: Tokens = None) -> Choice:
        """This round's draft length (and node budget) for the `rows` rows still decoding, at most `limit` (tokens
        left in the budget, minus one); tokens: each row's tokens so far (1, L), which a rule may read (never p)."""

    def observe(self, round: ObservedRound) -> None:
        """A finished round."""


class CostModel:
    """Online estimates of pass time by width, draft time and per-position acceptance; picks k per round.

    For R rows a pass over chains of k is R (k + 1) tokens wide and a draft step drafts R tokens, so
    C_R(k) = T_pass(R (k + 1)) + k T_step(R); each row expects E(k) tokens, the batch R E(k), and the k maximising
    E(k) / C_R(k) maximises the batch's tokens per second (R = 1: one sequence). T_pass is keyed by the pass's
    token count, T_step by the row count (the nearest measured count stands in for an unseen one). On a machine
    where a pass costs about its token count (a CPU at large R) C_R(k) grows like k + 1 and E(k) / C_R(k) falls
    below E(0) / C_R(0): k = 0, plain decoding, is then chosen. Acceptance is pooled over rows (each row's beta_i at
    the positions it reached), decayed once per record (a round; from_rounds False: a position looked back on).

    clock: seconds as a float (time.perf_counter); inject a fake clock to make choices reproducible.
    window: recent timings kept per width (median). max_age: rounds after which a timing no longer counts
    once a newer one exists (default: window). decay: weight kept by older acceptance evidence per round.
    prior: a_1 before any evidence (optimistic, so that drafting is tried). prior_weight: None, a fixed prior; a
    number, a prior that learns (current_prior). pass_times: the table of target
    pass times to fill (width -> RecentTimes), to share one among the cost models of several drafters
    (specdec.choose.online); default: a table of its own.
    """

    trees = False  # prices chains: one draft length per round

    def __init__(
        self,
        k_max: int = 8,
        draft_cost: DraftCost = "per_token",
        *,
        clock: Callable[[], float] = time.perf_counter,
        window: int = 9,
        decay: float = 0.9,
        prior: float = 0.9,
        max_age: int | None = None,
        pass_times: dict[int, RecentTimes] | None = None,
        prior_weight: float | None = None,
    ):
        if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
            raise ValueError(f"k_max (longest draft k='auto' may choose) must be an int >= 1, got {k_max!r}")
        if draft_cost not in DRAFT_COSTS:
            raise ValueError(f"draft_cost must be one of {DRAFT_COSTS}, got {draft_cost!r}")
        if not 0.0 < decay <= 1.0 or not 0.0 <= prior <= 1.0 or window < 1:
            raise ValueError(f"need 0 < decay <= 1, 0 <= prior <= 1, window >= 1; got {decay}, {prior}, {window}")
        if prior_weight is not None and not prior_weight > 0:
            raise ValueError(f"prior_weight must be None or > 0, got {prior_weight}")
        self.k_max, self.draft_cost, self.clock = k_max, draft_cost, clock
        self.window, self.decay, self.prior = window, decay, prior
        self.max_age = window if max_age is None else max_age
        self.round = 0  # rounds observed: the age of a timing
        self.pass_times: dict[int, RecentTimes] = {} if pass_times is None else pass_times  # width -> seconds
        self.draft_times: dict[int, RecentTimes] = {}  # rows -> seconds per drafted token (per call)
        self.plain_timed = False  # a plain step (k = 0) of this model's rounds has been timed
        self.overlap_sum = [0.0] * k_max  # decayed sum of beta_i over rounds that reached position i
        self.overlap_weight = [0.0] * k_max  # decayed count of those rounds
        self.prior_weight = prior_weight
        self.first_sum, self.first_count = 0.0, 0  # beta_1 summed over every round that reached position 1
        self.from_rounds = True  # observe learns each round's acceptance (False: only record_acceptance calls)

    # measurements -----------------------------------------------------------------------------------

    def record_pass(self, width: int, seconds: float) -> None:
        """One target pass over `width` tokens (1: a plain step of one row) took `seconds`."""
        self.pass_times.setdefault(width, RecentTimes(self.window, self.max_age)).add(self.round, seconds)

    def record_draft(self, tokens: int, seconds: float, rows: int = 1) -> None:
        """A drafter call proposing `tokens` tokens per row for `rows` rows took `seconds` (empty: per call only)."""
        if self.draft_cost == "per_call" or tokens:
            unit = seconds if self.draft_cost == "per_call" else seconds / tokens
            self.draft_times.setdefault(rows, RecentTimes(self.window, self.max_age)).add(self.round, unit)

    def record_acceptance(self, *rows: Sequence[float]) -> None:
        """One round: each row's beta_i = sum_x min(p_i, q_i) at the positions i = 1..len it reached (one argument
        per row; none: the evidence only decays)."""
        self.overlap_sum = [total * self.decay for total in self.overlap_sum]
        self.overlap_weight = [weight * self.decay for weight in self.overlap_weight]
        for row in rows:
            if row:
                self.first_sum, self.first_count = self.first_sum + row[0], self.first_count + 1
            for i, beta in enumerate(row[: self.k_max]):
                self.overlap_sum[i] += beta
                self.overlap_weight[i] += 1.0

    def observe(self, round: ObservedRound) -> None:
        """A finished round: its rows, draft and verify times, and every row's beta_i at the positions it
        reached. A k = 0 round called no drafter and times only its pass; a round that compiled a graph times
        nothing (its seconds are the compile's)."""
        self.round += 1
        rows, drafted = len(round.verified.rows), round.verified.size
        if round.timed:
            if round.choice.k:
                self.record_draft(drafted, round.seconds["draft"], rows)
            self.record_pass(rows * (drafted + 1), round.seconds["verify"])
            self.plain_timed |= drafted == 0
        if self.from_rounds:
            self.record_acceptance(*(o.tolist() for o in round.overlaps))  # (observed,) each -> host

    # estimates --------------------------------------------------------------------------------------

    def pass_seconds(self, width: int) -> float:
        """T_pass(width): measured median, else a line through the measured widths, never below T_pass(1)."""
        if not self.pass_times:
            raise ValueError("no target pass has been timed yet")
        return interpolated({w: times.median(self.round) for w, times in self.pass_times.items()}, width)

    def draft_seconds(self, k: int, rows: int = 1) -> float:
        """T_draft(k) for `rows` rows: time to propose k tokens (0 for k = 0: a plain step calls no drafter)."""
        if k == 0:
            return 0.0
        nearest = min(self.draft_times, key=lambda r: (abs(r - rows), -r))
        unit = self.draft_times[nearest].median(self.round)
        return unit if self.draft_cost == "per_call" else k * unit

    def proposal_seconds(self, width: int, drafted: int) -> float:
        """Cost of any proposal (a chain or a tree) of one row: one pass over `width` tokens after drafting
        `drafted`."""
        return self.pass_seconds(width) + self.draft_seconds(drafted)

    def cost(self, k: int, rows: int = 1) -> float:
        """C_R(k) = T_pass(R (k + 1)) + T_draft(k) seconds for chains of k; C(0) is a plain target step."""
        return self.pass_seconds(rows * (k + 1)) + self.draft_seconds(k, rows)

    def acceptance(self) -> list[float]:
        """a_1..a_k_max: decayed mean of beta_i, shrunk towards a_{i-1} (a_0 := prior) by one pseudo-round."""
        estimates, previous = [], self.current_prior()
        for total, weight in zip(self.overlap_sum, self.overlap_weight):
            previous = (total + previous) / (weight + 1.0)
            estimates.append(previous)
        return estimates

    def current_prior(self) -> float:
        """a_0: the fixed prior, or with prior_weight the run's mean beta_1 with the prior as prior_weight rounds."""
        if self.prior_weight is None:
            return self.prior
        return (self.prior * self.prior_weight + self.first_sum) / (self.prior_weight + self.first_count)

    @property
    def timed_plain(self) -> bool:
        return self.plain_timed or 1 in self.pass_times

    @property
    def ready(self) -> bool:
        """True once a plain step, a wider pass and a draft have been timed."""
        return self.timed_plain and len(self.pass_times) > 1 and len(self.draft_times) > 0

    def newest_draft(self) -> int:
        """The round of the newest draft timing (-1: none yet)."""
        return max((times.newest() for times in self.draft_times.values()), default=-1)

    # the rule ---------------------------------------------------------------------------------------

    def choose(self, limit: int, rows: int = 1, tokens: Tokens = None) -> Choice:
        """The draft length for the next round of `rows` rows, at most `limit` (tokens left in the budget, minus
        one); the tokens so far are not read."""
        limit = min(limit, self.k_max)
        if not self.ready:  # warm-up: a plain step, then the longest draft, until both are timed
            return Choice(limit if self.timed_plain else 0)
        return self.predicted(best_draft_length(self.acceptance()[:limit], lambda k: self.cost(k, rows)), rows)

    def predicted(self, k: int, rows: int = 1) -> Choice:
        """k with the model's E (every row's E(k): R E(k) tokens) and C_R(k)."""
        return Choice(k, expected_tokens=rows * expected_tokens(self.acceptance()[:k]), seconds=self.cost(k, rows))


def check_draft_cost(drafter: object, expected: DraftCost | None = None) -> DraftCost:
    """The drafter's declared draft_cost, which k='auto' needs to price a draft; refuse drafters without one."""
    kind = getattr(drafter, "draft_cost", None)
    name = type(drafter).__name__
    if kind not in DRAFT_COSTS:
        raise ValueError(
            f"k='auto' needs to know how drafting costs grow with the draft length, but {name} has "
            f"draft_cost={kind!r}: set the attribute draft_cost = 'per_token' on {name} if each draft token "
            "costs a forward of a draft model, or 'per_call' if a proposal costs about the same whatever its "
            "length (a lookup); or pass an int k"
        )
    if expected is not None and kind != expected:
        raise ValueError(
            f"the CostModel prices drafts {expected!r} but {name} has draft_cost={kind!r}: "
            f"build it with CostModel(draft_cost={kind!r})"
        )
    return kind
