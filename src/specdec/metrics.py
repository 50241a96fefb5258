"""Statistics of one generation, and the theory they are compared with.

Notation of Leviathan et al. (2023): alpha = E[sum_x min(p(x), q(x))] is the acceptance rate of
one draft token, k (their gamma) the draft length, c the cost of a draft step relative to a
target step.
"""

from __future__ import annotations

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
    predicted_tokens: float = 0.0  # sum of E(k) over predicted rounds
    predicted_seconds: float = 0.0  # sum of C(k) over predicted rounds
    measured_tokens: int = 0  # tokens those rounds produced (accepted + 1, before EOS truncation)
    measured_seconds: float = 0.0  # their measured draft + verify seconds

    def record_schedule(self, k: int, predicted: tuple[float, float] | None, produced: int,
                        seconds: dict[str, float]) -> None:
        """A round's chosen k, the model's (E(k), C(k)) if any, the tokens it produced and its timed seconds."""
        self.chosen_k.append(k)
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
    tree_nodes: list[int] = field(default_factory=list)  # token trees: nodes verified in each round
    tree_depths: list[int] = field(default_factory=list)  # token trees: depth of each round's tree

    def record_round(self, drafted: int, accepted: int, observed: int, overlapped: int | None = None) -> None:
        """Add one verification round: `drafted` proposed, `accepted` kept, `observed` = min(accepted + 1, drafted)
        positions tested (those on the output path); `overlapped` positions added to overlap_sum (default
        `observed`; token trees pass their own count)."""
        self.drafted += drafted
        self.accepted += accepted
        self.target_forwards += 1
        grow = max(0, drafted - len(self.drafted_at))
        self.drafted_at += [0] * grow
        self.accepted_at += [0] * grow
        self.reached_at += [0] * grow
        for i in range(drafted):
            self.drafted_at[i] += 1
        for i in range(observed):
            self.reached_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1
        self.accepted_per_round.append(accepted)
        self.overlap_count += observed if overlapped is None else overlapped

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


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """E[tokens per target pass] = (1 - alpha^(k+1)) / (1 - alpha)  (Leviathan Eq. 1)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def accepted_length_distribution(alpha: float, k: int) -> list[float]:
    """P(n draft tokens accepted), n = 0..k, when each is accepted independently with prob. alpha."""
    return [alpha**n * (1.0 - alpha) for n in range(k)] + [alpha**k]


def walltime_improvement(alpha: float, c: float, k: int) -> float:
    """Expected speedup over target-only decoding (Leviathan Thm 3.8)."""
    return expected_tokens_per_pass(alpha, k) / (k * c + 1.0)


def optimal_k(alpha: float, c: float, k_max: int = 64) -> int:
    """The draft length 1..k_max that maximises walltime_improvement (found numerically)."""
    return max(range(1, k_max + 1), key=lambda k: walltime_improvement(alpha, c, k))


def validate_alpha_c(alpha: float, c: float) -> None:
    """Refuse values outside the theory's domain."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if c < 0.0:
        raise ValueError(f"c (draft step cost / target step cost) must be >= 0, got {c}")
