"""Statistics of one generation, and the theory they are compared with.

Notation of Leviathan et al. (2023): alpha = E[sum_x min(p(x), q(x))] is the acceptance rate of
one draft token, k (their gamma) the draft length, c the cost of a draft step relative to a
target step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch


@dataclass
class Stats:
    """Counters and timings of one generation (batch size 1).

    A round is one target verification pass; it emits the accepted draft tokens plus one token
    sampled by the target (the resampled token on a rejection, the bonus token otherwise).
    Draft counters record the algorithm's decisions: when an EOS ends the output inside the accepted
    tokens, the last round's accepted tokens after it are counted though not emitted.
    """

    emitted: int = 0  # new tokens returned (prompt excluded)
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted
    target_forwards: int = 0  # target passes after the prefill (verification or decode steps)
    draft_forwards: int = 0  # draft-model passes after its prefill (0 for model-free drafters)
    drafted_at: list[int] = field(default_factory=list)  # drafted_at[i]: rounds with a draft at position i+1
    accepted_at: list[int] = field(default_factory=list)  # accepted_at[i]: rounds accepting position i+1
    reached_at: list[int] = field(default_factory=list)  # reached_at[i]: rounds that drafted and tested position i+1
    accepted_per_round: list[int] = field(default_factory=list)  # n accepted in each round
    overlap_sum: float = 0.0  # sum over observed positions of sum_x min(p, q)
    overlap_count: int = 0  # positions in overlap_sum
    seconds: dict[str, float] = field(default_factory=dict)  # "prefill", "draft", "verify", "total"
    extras: dict[str, float] = field(default_factory=dict)  # method-specific numbers (e.g. naive scores)
    # Draft length per round (k="auto": chosen by specdec.cost.CostModel) and the cost model's prediction
    # over the rounds it predicted (warm-up excluded) next to what those rounds measured.
    chosen_k: list[int] = field(default_factory=list)  # draft length chosen in each round (0: plain step)
    chosen_draft: list[str] = field(default_factory=list)  # the candidate of each drafting round chosen online
    # (specdec.online.OnlineDraftChoice); "" for a plain step; empty for a single drafter
    chosen_threads: list[int] = field(default_factory=list)  # the torch thread count of each round chosen online
    predicted_tokens: float = 0.0  # sum of E(k) over predicted rounds
    predicted_seconds: float = 0.0  # sum of C(k) over predicted rounds
    measured_tokens: int = 0  # tokens those rounds produced (accepted + 1, before EOS truncation)
    measured_seconds: float = 0.0  # their measured draft + verify seconds
    tree_nodes: list[int] = field(default_factory=list)  # token trees: nodes verified in each round
    tree_depths: list[int] = field(default_factory=list)  # token trees: depth of each round's tree

    def record_schedule(self, k: int, predicted: tuple[float, float] | None, produced: int,
                        seconds: dict[str, float], draft: str | None = None, threads: int | None = None) -> None:
        """A round's chosen k, the model's (E(k), C(k)) if any, the tokens it produced, its timed seconds, and
        the candidate that drafted it when one was chosen online (draft)."""
        self.chosen_k.append(k)
        if draft is not None:
            self.chosen_draft.append(draft if k else "")
        if threads is not None:
            self.chosen_threads.append(threads)
        for key, value in seconds.items():
            self.seconds[key] = self.seconds.get(key, 0.0) + value
        if predicted is not None:
            self.predicted_tokens += predicted[0]
            self.predicted_seconds += predicted[1]
            self.measured_tokens += produced
            self.measured_seconds += sum(seconds.values())

    @property
    def chosen_k_histogram(self) -> list[int]:
        """histogram[k]: rounds that chose draft length k."""
        return torch.bincount(torch.tensor(self.chosen_k, dtype=torch.long)).tolist() if self.chosen_k else []

    @property
    def predicted_tokens_per_second(self) -> float:
        """The cost model's expected tokens per second over the rounds it predicted."""
        return self.predicted_tokens / self.predicted_seconds if self.predicted_seconds else float("nan")

    @property
    def measured_tokens_per_second(self) -> float:
        """Tokens per second those same rounds achieved (draft + verify time)."""
        return self.measured_tokens / self.measured_seconds if self.measured_seconds else float("nan")

    def record_round(self, nodes: int, depth: int, accepted: int, overlapped: int, tree: bool = False) -> None:
        """Add one verification pass over `nodes` draft tokens reaching depth `depth` (a chain: nodes = depth =
        k) that accepted `accepted` of them; per-position counters are by depth, positions 1..min(accepted + 1,
        depth) were tested (those on the output path); `overlapped` positions were added to overlap_sum.
        tree: also keep the pass's node count and depth (tree_nodes, tree_depths)."""
        observed = min(accepted + 1, depth)
        self.drafted += nodes
        self.accepted += accepted
        self.target_forwards += 1
        grow = max(0, depth - len(self.drafted_at))
        self.drafted_at += [0] * grow
        self.accepted_at += [0] * grow
        self.reached_at += [0] * grow
        for i in range(depth):
            self.drafted_at[i] += 1
        for i in range(observed):
            self.reached_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1
        self.accepted_per_round.append(accepted)
        self.overlap_count += overlapped
        if tree:
            self.tree_nodes.append(nodes)
            self.tree_depths.append(depth)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted draft tokens (vLLM's draft acceptance rate)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        """Emitted tokens per target pass, bonus included (1.0 for plain decoding)."""
        return self.emitted / self.target_forwards if self.target_forwards else float("nan")

    @property
    def alpha(self) -> float:
        """Estimate of alpha: mean of sum_x min(p, q) over positions on the output path."""
        return self.overlap_sum / self.overlap_count if self.overlap_count else float("nan")

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(position i accepted | position i drafted and reached), i = 1..k."""
        return [a / r if r else float("nan") for a, r in zip(self.accepted_at, self.reached_at)]

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens (prompt excluded) per second of the whole call, prefill included."""
        total = self.seconds.get("total", 0.0)
        return self.emitted / total if total else float("nan")

    def summary(self) -> dict[str, float]:
        """Flat scalar view for tables and loggers."""
        flat = {
            k: v for k, v in asdict(self).items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        flat.update({f"seconds_{k}": v for k, v in self.seconds.items()})
        flat.update(self.extras)
        flat.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            alpha=self.alpha,
            tokens_per_second=self.tokens_per_second,
            predicted_tokens_per_second=self.predicted_tokens_per_second,
            measured_tokens_per_second=self.measured_tokens_per_second,
        )
        return flat


@dataclass
class Generation:
    """New tokens (n,) of one generation and how they were made."""

    tokens: torch.Tensor
    stats: Stats


def expected_tokens(acceptance: Sequence[float]) -> float:
    """E(k) = sum_{j=0..k} prod_{i<=j} a_i: expected tokens from one target pass over a chain of k =
    len(acceptance) draft tokens, a_i the probability that position i is accepted given that 1..i-1 were."""
    total, reach = 1.0, 1.0
    for a in acceptance:
        reach *= a
        total += reach
    return total


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha)  (Leviathan Eq. 1): expected_tokens with every a_i = alpha."""
    return expected_tokens([alpha] * k)


def accepted_length_distribution(alpha: float, k: int) -> list[float]:
    """P(n draft tokens accepted), n = 0..k, when each is accepted independently with prob. alpha."""
    return [alpha**n * (1.0 - alpha) for n in range(k)] + [alpha**k]


def walltime_improvement(
    alpha: float, c: float, k: int, pass_cost: float = 1.0, draft_cost: str = "per_token"
) -> float:
    """Expected speedup over target-only decoding (Leviathan Thm 3.8): E(k) / (k c + v).

    v = pass_cost is one verification pass over k + 1 tokens in target steps (Thm 3.8 assumes 1; on a CPU
    it is measured); draft_cost "per_call" (a lookup) pays c once per round instead of once per token.
    """
    return expected_tokens_per_pass(alpha, k) / round_cost(c, k, pass_cost, draft_cost)


def round_cost(c: float, k: int, pass_cost: float = 1.0, draft_cost: str = "per_token") -> float:
    """One round in target steps: k c + v for a draft model, c + v for a lookup (c per call)."""
    return (c if draft_cost == "per_call" else k * c) + pass_cost


def best_draft_length(acceptance: Sequence[float], cost: Callable[[int], float], shortest: int = 0) -> int:
    """The k in shortest..len(acceptance) maximising E(k) / cost(k) (tokens per unit of time); ties go to the
    shorter draft. k = 0 is a plain target step."""
    rates = {k: expected_tokens(acceptance[:k]) / cost(k) for k in range(shortest, len(acceptance) + 1)}
    return max(rates, key=lambda k: (rates[k], -k))


def optimal_k(
    alpha: float,
    c: float,
    k_max: int = 64,
    pass_cost: Callable[[int], float] = lambda width: 1.0,
    draft_cost: str = "per_token",
) -> int:
    """The draft length 1..k_max that maximises walltime_improvement (found numerically); pass_cost(w) is
    a pass over w tokens in target steps."""
    return best_draft_length([alpha] * k_max, lambda k: round_cost(c, k, pass_cost(k + 1), draft_cost), shortest=1)
