"""The torch thread count chosen every round, next to the draft and k (specdec.choose.online): on a busy machine
more threads can be slower, and a count changes what every pass and every draft step costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from .cost import Choice, ObservedRound, Tokens
from .online import OnlineDraftChoice


class OnlineThreadChoice:
    """The torch thread count chosen every round as well: one OnlineDraftChoice per count (its own timings, since the
    count changes what every pass and every draft step costs, and on a busy machine more threads can be slower),
    and each round the count whose rule predicts the most tokens per second. A count not in use is probed as a
    draft is (after a gap that doubles while it keeps losing): while its rule has not timed everything, by a round
    shaped as the best count's last one (the same draft and k), and it is rated by that pass's time against the
    best count's; its rule warms up only once that rating makes it the best. Like every choice here it reads only earlier rounds and the tokens so far: exact.

    The rule only decides: each Choice names its count (`threads`) and its candidate (`draft`), and the decoding
    loop applies them (specdec.decoding.apply_choice sets torch's thread count and restores the caller's at the
    end of the call).
    """

    trees = False
    draft_cost = None  # each inner rule prices its candidates as their drafters say

    def __init__(
        self,
        rules: Mapping[int, OnlineDraftChoice],
        *,
        probe_every: int = 16,
        probe_most: int = 128,
    ):
        if not rules:
            raise ValueError("OnlineThreadChoice needs a rule for at least one thread count")
        if len({id(r.switch) for r in rules.values()}) > 1:
            raise ValueError("the rules of every thread count must select in one DraftSwitch")
        if not 1 <= probe_every <= probe_most:
            raise ValueError(f"need 1 <= probe_every <= probe_most, got {probe_every} and {probe_most}")
        self.rules = dict(rules)
        first = next(iter(self.rules.values()))
        self.switch, self.clock = first.switch, first.clock
        self.probe_every, self.probe_most = probe_every, probe_most
        self.round = 0
        self.last: dict[int, int | None] = dict.fromkeys(self.rules)  # the round each count last ran
        self.gap = dict.fromkeys(self.rules, probe_every)
        self.best: int | None = None
        self.current: int | None = None  # the count of the round being decided
        self.last_round: tuple[int, str] = (0, "")  # the best count's last (k, draft): what a probe repeats
        self.probe_width: dict[int, int] = {}  # the pass width each unmeasured count was last probed with

    def age(self, threads: int) -> int:
        last = self.last[threads]
        return self.round + 1 if last is None else self.round - last

    def pass_seconds(self, threads: int, width: int) -> float:
        return next(iter(self.rules[threads].models.values())).pass_seconds(width)

    def rates(self, limit: int) -> dict[int, float | None]:
        """Each count's predicted tokens per second: its rule's, or, for a count whose rule has not timed
        everything, the best measured count's rate scaled by the two counts' times of the pass the count was last
        probed with (a thread count changes the draft's steps and the target's alike); None: never timed."""
        rated = {t: r.predicted_rate(limit) for t, r in self.rules.items()}
        known = {t: rate for t, rate in rated.items() if rate is not None}
        if known:
            top = max(known, key=known.get)
            for t, rate in rated.items():
                if rate is None and t in self.probe_width:
                    width = self.probe_width[t]
                    rated[t] = known[top] * self.pass_seconds(top, width) / self.pass_seconds(t, width)
        return rated

    def choose(self, limit: int, rows: int = 1, tokens: Tokens = None) -> Choice:
        """The count with the best predicted rate (its rule warms up first if it has not timed everything), or a
        probe of a count not in use: its rule's choice, or while that rule is unmeasured the best count's last round
        (a plain step where that round's draft has nothing to propose now)."""
        evidence = next(iter(self.rules.values())).hindsight(tokens)  # the text is the same for every count
        for rule in self.rules.values():
            rule.learn(evidence)
            rule.follow(tokens)
        rated = self.rates(limit)
        scored = [t for t, rate in rated.items() if rate is not None]
        best = max(scored, key=rated.get) if scored else next(iter(self.rules))
        if best != self.best:
            self.gap[best] = self.probe_every
        self.best = best
        stale = [t for t in self.rules if t != best and self.age(t) >= self.gap[t]]
        threads = max(stale, key=self.age) if stale else best
        if stale:
            self.gap[threads] = min(2 * self.gap[threads], self.probe_most)
        self.current = threads
        if threads != best and not self.rules[threads].ready:  # a probe: the best count's last round, at this count
            k, draft = self.last_round
            k = 0 if draft in self.rules[threads].idle else min(k, limit)
            self.probe_width[threads] = k + 1
            return Choice(k, draft=draft if k else "", threads=threads)
        choice = self.rules[threads].decide(limit)
        if threads == best:
            self.last_round = (choice.k or 0, choice.draft or "")
        return replace(choice, threads=threads)

    def observe(self, round: ObservedRound) -> None:
        for threads, rule in self.rules.items():  # every rule's timings age by the same rounds
            rule.observe(round) if threads == self.current else rule.skip()
        self.last[self.current] = self.round
        self.round += 1
