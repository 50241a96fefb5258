"""Statistics of one generation, and the theory they are compared with.

Notation of Leviathan et al. (2023): alpha = E[sum_x min(p(x), q(x))] is the acceptance rate of
one draft token, k (their gamma) the draft length, c the cost of a draft step relative to a
target step.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields

import torch

from .theory import expected_tokens_per_pass, optimal_k, walltime_improvement


@dataclass
class Stats:
    """Counters and timings of one generation (of one sequence, or summed over a batch's rows).

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
    # Draft length per round (k="auto": chosen by specdec.choose.cost.CostModel) and the cost model's prediction
    # over the rounds it predicted (warm-up excluded) next to what those rounds measured.
    chosen_k: list[int] = field(default_factory=list)  # draft length chosen in each round (0: plain step)
    chosen_draft: list[str] = field(default_factory=list)  # the candidate of each drafting round chosen online
    # (specdec.choose.online.OnlineDraftChoice); "" for a plain step; empty for a single drafter
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

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> Stats:
        """The statistics back from a flat row: summary()'s counters and seconds_<phase> (a phase whose
        seconds are None or NaN left out) and the per-round lists by name (a results row of the run)."""
        names = {f.name for f in fields(cls)} - {"seconds", "extras"}
        seconds = {key.removeprefix("seconds_"): v for key, v in row.items()
                   if key.startswith("seconds_") and v is not None and not math.isnan(v)}  # fmt: skip
        return cls(**{name: row[name] for name in names if name in row}, seconds=seconds)

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
    """New tokens of one generation and how they were made: (n,) for one sequence; for a batch a list with each
    row's (n_b,), the batch's statistics, and each row's own.

    A batch's stats count over all rows: emitted is the batch's tokens, target_forwards the row-passes (a pass
    over R rows counts R), so mean_accepted_length is the tokens per pass of one row; extras["passes"] is the
    number of target passes and stats.tokens_per_second the batch's throughput. latency[b]: seconds from the
    call's start to row b's last token (rows[b].seconds["total"]); a row's other phase times (prefill, draft,
    verify) are the batch's, which all its rows shared. generation[b] is row b's Generation.
    """

    tokens: torch.Tensor | list[torch.Tensor]
    stats: Stats
    rows: list[Stats] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)

    def __getitem__(self, b: int) -> Generation:
        return Generation(self.tokens[b], self.rows[b])

    def __len__(self) -> int:
        return len(self.rows)


def one_sequence(result: Generation) -> Generation:
    """A batch of one as a one-sequence Generation: its tokens (n,) and the batch's statistics."""
    for key in ("passes", "rows"):
        result.stats.extras.pop(key, None)
    return Generation(result.tokens[0], result.stats)


def round_statistics(generations: Sequence[Stats], longest: int = 0) -> tuple[dict[str, float], dict[str, list[int]]]:
    """The rounds of the generations together: their number, accepted depth, chosen k and share of plain steps, the
    share of rounds each draft and torch thread count chosen online ran, tree size (means; histograms count the rounds
    per integer value up to at least `longest`, k_max or the tree depth), and the cost model's predicted tokens per
    second against the measured rate over the rounds it predicted. ({}, {}) for no generation."""
    if not generations:
        return {}, {}

    def rounds(name: str) -> list:
        return [value for stats in generations for value in getattr(stats, name)]

    def total(name: str) -> float:
        return sum(getattr(stats, name) for stats in generations)

    accepted = rounds("accepted_per_round")
    metrics = {"rounds": float(total("target_forwards")), "accepted_depth_mean": mean(accepted)}
    histograms = {"accepted_depth": counts(accepted, longest)}
    chosen = rounds("chosen_k")
    if chosen:  # the draft length (a tree: its depth) of every round, 0: a plain target step
        metrics["chosen_k_mean"] = mean(chosen)
        metrics["plain_step_share"] = mean([k == 0 for k in chosen])  # rounds that drafted nothing
        histograms["chosen_k"] = counts(chosen, longest)
    # k=auto over candidates: the share of rounds each one drafted ("": none), and each torch thread count ran
    metrics.update(shares("draft_share", rounds("chosen_draft")))
    metrics.update(shares("threads_share", rounds("chosen_threads")))
    nodes = rounds("tree_nodes")
    if nodes:  # trees: nodes verified and depth proposed per pass
        metrics["tree_nodes_mean"] = mean(nodes)
        metrics["tree_depth_mean"] = mean(rounds("tree_depths"))
    if total("predicted_seconds") > 0:  # rounds the cost model predicted (k=auto after warm-up)
        metrics["predicted_tokens_per_second"] = ratio(total("predicted_tokens"), total("predicted_seconds"))
        metrics["measured_tokens_per_second"] = ratio(total("measured_tokens"), total("measured_seconds"))
        metrics["predicted_over_measured"] = ratio(metrics["predicted_tokens_per_second"],
                                                   metrics["measured_tokens_per_second"])  # fmt: skip
    return metrics, histograms


def theory_check(baseline: Sequence[Stats], speculative: Sequence[Stats], k: int) -> dict[str, float]:
    """Leviathan's Thm 3.8 against a run at a fixed k: the measured c and verify cost, and the speedup the theorem
    predicts for the measured alpha, c and k (one pass counted as one step, as the theorem does, and with the measured
    verify cost); Eq. 1's tokens per pass against those the rounds produced. {} without speculative rounds.

    c = (draft seconds per round / k) / (seconds per target decode step of the baseline);
    verify_cost = seconds per verification pass / seconds per baseline step (1 in the theory).
    """
    if not baseline or not speculative or sum(s.drafted for s in speculative) == 0:
        return {}

    def total(generations: Sequence[Stats], name: str) -> float:
        return sum(getattr(s, name) for s in generations)

    def seconds(generations: Sequence[Stats], phase: str) -> float:
        return sum(s.seconds.get(phase, 0.0) for s in generations)

    step = ratio(seconds(baseline, "verify"), total(baseline, "target_forwards"))
    rounds = total(speculative, "target_forwards")
    c = ratio(seconds(speculative, "draft"), rounds) / k / step
    alpha = ratio(total(speculative, "overlap_sum"), total(speculative, "overlap_count"))
    verify_cost = ratio(seconds(speculative, "verify"), rounds) / step
    produced = [n + 1 for s in speculative for n in s.accepted_per_round]  # tokens per pass, before end-token cuts
    error = statistics.stdev(produced) / math.sqrt(len(produced)) if len(produced) > 1 else math.nan
    return {
        # Eq. 1 for the measured alpha at each round's draft length (the last rounds draft fewer, within the
        # budget), against the tokens the rounds produced, with their standard error
        "predicted_tokens_per_pass": mean([expected_tokens_per_pass(alpha, j) for s in speculative for j in s.chosen_k]),
        "produced_tokens_per_pass": mean(produced),
        "produced_tokens_per_pass_se": error,
        "c": c,
        "verify_cost": verify_cost,
        "theoretical_speedup": walltime_improvement(alpha, c, k),
        "theoretical_speedup_with_verify_cost": walltime_improvement(alpha, c, k, verify_cost),
        "optimal_k": optimal_k(alpha, c),
    }


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def counts(values: Sequence[int], longest: int = 0) -> list[int]:
    """counts[v]: how many of the values equal v, for v = 0..max(longest, max(values))."""
    top = max([longest, *values])
    return [sum(1 for v in values if v == i) for i in range(top + 1)]


def shares(prefix: str, values: Sequence) -> dict[str, float]:
    """{prefix/value: share of the values} for each value seen but "" (a round that drafted nothing)."""
    return {f"{prefix}/{v}": values.count(v) / len(values) for v in sorted(set(values)) if v != ""}


def round_totals(stats: Stats) -> dict:
    """A generation's summary with its per-round lists as totals (pooled_summaries pools several): chosen draft
    lengths for k="auto", drafting rounds per candidate of an online draft choice, tree sizes."""
    summary = stats.summary()
    summary.update(
        chosen_k_histogram=stats.chosen_k_histogram,
        draft_rounds=dict(Counter(d for d in stats.chosen_draft if d)),
        tree_rounds=len(stats.tree_nodes),
        tree_nodes_sum=sum(stats.tree_nodes),
        tree_depth_sum=sum(stats.tree_depths),
    )
    return summary


def pooled_summaries(stats: list[dict]) -> dict:
    """Several generations' round_totals, pooled: counters, seconds, the cost model's sums, histograms."""

    def total(key: str) -> float:
        return sum(s[key] for s in stats)

    histogram: list[int] = []
    for s in stats:
        h = s.get("chosen_k_histogram") or []
        width = max(len(h), len(histogram))
        histogram = [a + b for a, b in zip(histogram + [0] * (width - len(histogram)), h + [0] * (width - len(h)))]
    rounds = total("tree_rounds")
    measured, predicted = total("measured_seconds"), total("predicted_seconds")
    return {
        "emitted": total("emitted"),
        "drafted": total("drafted"),
        "accepted": total("accepted"),
        "target_forwards": total("target_forwards"),
        "draft_forwards": total("draft_forwards"),
        "acceptance_rate": total("accepted") / total("drafted") if total("drafted") else None,
        "mean_accepted_length": total("emitted") / total("target_forwards"),  # tokens per target pass
        "alpha": total("overlap_sum") / total("overlap_count") if total("overlap_count") else None,
        "seconds": {
            key: total(f"seconds_{key}")
            for key in ("prefill", "draft", "verify", "total")
            if all(f"seconds_{key}" in s for s in stats)
        },
        "chosen_k_histogram": histogram,
        "draft_rounds": dict(sorted(sum((Counter(s.get("draft_rounds", {})) for s in stats), Counter()).items())),
        # k="auto": the cost model's expected rate over the rounds it predicted, and what they measured
        "predicted_tokens_per_second": total("predicted_tokens") / predicted if predicted else None,
        "measured_tokens_per_second": total("measured_tokens") / measured if measured else None,
        # token trees: nodes per pass and accepted depth per pass
        "mean_tree_nodes": total("tree_nodes_sum") / rounds if rounds else None,
        "mean_tree_depth": total("tree_depth_sum") / rounds if rounds else None,
        "mean_accepted_depth": total("accepted") / rounds if rounds else None,
    }
