"""k for a batch from measured costs: one draft length per round for all active rows.
"""

from __future__ import annotations

from .cost import Choice, CostModel, RecentTimes


class BatchCostModel(CostModel):
    """specdec.choose.cost.CostModel for a batch: one k per round for all active rows, from measured costs.

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
