"""Decisions that keep being made: which draft, and how many tokens of it, chosen again every round.

A calibration at the start (specdec.choose.calibration) measures each candidate draft for a few seconds and keeps
one. On a shared machine that choice can be wrong for the rest of the run: a burst of load during those
seconds makes a good draft look slow, and load that starts later makes a good draft slow (a draft's small
matmuls suffer more from a busy core than the target's pass does). Here the choice is a rule of the decoding
loop instead (specdec.decoding), made each round from measurements of earlier rounds:

    DraftSwitch            the candidates behind one drafter: the loop sees one, `select` picks who proposes
    OnlineDraftChoice      per round the (draft, k) with the most expected tokens per second, where k = 0 is
                           "no draft" (a plain target step); each candidate has its own specdec.choose.cost.CostModel
                           (its draft time and per-position acceptance), all share one table of target pass
                           times by width

Notation of Leviathan et al.: a round with draft d and length k is expected to emit E_d(k) tokens and to cost
C_d(k) = T_pass(k + 1) + T_draft,d(k) seconds; the rule picks argmax over (d, k) of E_d(k) / C_d(k).

Exploration at a bounded cost. Two estimates go stale for a draft that is not used: its acceptance (each round
decays its evidence towards its prior, so an unused draft is tried again once the prior says it would win; the
default run gives a draft model its calibrated alpha, and prompt lookup, whose acceptance depends on the text
rather than the pair, a prior that learns: the optimistic default counted as LOOKUP_PRIOR_WEIGHT rounds, then the
mean beta_1 of every round lookup drafted in the run, so that on text that does not repeat its prompt, lookup is
not tried every few rounds in place of a draft model that wins there) and its draft time (a machine that got
quieter or busier). A draft whose newest draft timing is older than its probe gap gets one probe round at its best
k >= 1; a probe that does not make it the best doubles its gap (up to `probe_most` rounds), one that does resets it. The probes are at most one
round in `probe_every`, and fewer the longer a draft keeps losing. Timings older than `max_age` rounds no longer
count once a newer one exists (specdec.choose.cost.RecentTimes), so a change of load reaches every estimate within a
few rounds.

Exactness: every choice is a function of earlier rounds only (their times and acceptance), never of this
round's target distribution p. Given the past, the round is speculative sampling with a fixed draft and a fixed
k, which emits the target's distribution (notebook 01, section 9); so the whole output is exact, whatever the
machine's load does to the choices.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from ..draft.switch import DraftSwitch
from ..theory import best_draft_length, expected_tokens
from .cost import Choice, CostModel, Round

LOOKUP_PRIOR_WEIGHT = 2.0  # prompt lookup's optimistic prior counts as this many rounds of its learned one


def is_lookup(drafter: object) -> bool:
    """A drafter whose proposal costs one call whatever its length (prompt lookup): its acceptance is a property of
    the text being written (how much of it repeats the prompt), not of a model pair, so a calibration prompt's alpha
    says little about another prompt's; its prior learns from the run instead (LOOKUP_PRIOR_WEIGHT)."""
    return getattr(drafter, "draft_cost", None) == "per_call"


def best_rate(model: CostModel, limit: int, shortest: int = 0) -> tuple[int, float]:
    """The draft length in shortest..limit with the most expected tokens per second, and that rate."""
    acceptance = model.acceptance()[:limit]
    k = best_draft_length(acceptance, model.cost, shortest)
    return k, expected_tokens(acceptance[:k]) / model.cost(k)


class OnlineDraftChoice:
    """A rule for chains (specdec.decoding): each round the candidate and draft length 0..k_max with the most
    expected tokens per second, from earlier rounds only; see the module's docstring.

    switch: the DraftSwitch the loop drafts with (this rule selects in it). prior: a_1 before evidence, one value
    or one per candidate (the calibrated alphas). probe_every / probe_most: the shortest and longest gap, in
    rounds, between probes of a draft that is not the best. window, max_age, decay, clock: each CostModel's.
    """

    trees = False
    draft_cost = None  # candidates price their drafts each as their drafter says (nothing to check)

    def __init__(
        self,
        switch: DraftSwitch,
        k_max: int = 8,
        *,
        clock: Callable[[], float] = time.perf_counter,
        window: int = 5,
        max_age: int | None = None,
        decay: float = 0.9,
        prior: float | Mapping[str, float] = 0.9,
        probe_every: int = 16,
        probe_most: int = 128,
    ):
        if not 1 <= probe_every <= probe_most:
            raise ValueError(f"need 1 <= probe_every <= probe_most, got {probe_every} and {probe_most}")
        self.switch = switch
        self.clock = clock
        self.k_max = k_max
        self.probe_every, self.probe_most = probe_every, probe_most
        self.pass_times: dict = {}  # width -> RecentTimes, shared by every candidate's model
        priors = dict(prior) if isinstance(prior, Mapping) else {name: prior for name in switch.candidates}
        self.models = {
            name: CostModel(
                k_max, d.draft_cost, clock=clock, window=window, max_age=max_age, decay=decay,
                prior=priors.get(name, 0.9), pass_times=self.pass_times,
                prior_weight=LOOKUP_PRIOR_WEIGHT if is_lookup(d) else None,
            )
            for name, d in switch.candidates.items()
        }  # fmt: skip
        self.round = 0
        self.gap = {name: probe_every for name in self.models}  # rounds before the next probe of each
        self.best: str | None = None  # the candidate the last non-probe choice preferred

    def seed(self, pass_seconds: Mapping[int, float], draft_seconds: Mapping[str, float]) -> None:
        """Start from measured timings (e.g. a calibration's), as if taken just before the first round: target
        passes by width, and each candidate's draft unit (per token or per call). Newer rounds replace them."""
        model = next(iter(self.models.values()))
        for width, seconds in pass_seconds.items():
            model.record_pass(width, seconds)
        for name, seconds in draft_seconds.items():
            self.models[name].record_draft(1, seconds)  # one token (or one call) took `seconds`

    # the rule ---------------------------------------------------------------------------------------

    def choose(self, limit: int, rows: int = 1) -> Choice:
        """This round's draft and draft length (0: a plain target step), at most `limit` tokens (one row)."""
        limit = min(limit, self.k_max)
        if limit == 0 or 1 not in self.pass_times:  # nothing to draft, or T_pass(1) not timed yet
            return Choice(0, draft="")
        unready = [name for name, m in self.models.items() if not m.ready]
        if unready:  # warm-up: each candidate drafts the longest draft once, which times it and a wide pass
            return self.draft(unready[0], limit)
        rated = {name: best_rate(m, limit) for name, m in self.models.items()}
        best = max(rated, key=lambda name: rated[name][1])
        if self.best != best:
            self.gap[best] = self.probe_every
        self.best = best
        drafting = best if rated[best][0] else None  # a plain step times no draft: every draft can go stale
        stale = [name for name in self.models if name != drafting and self.age(name) >= self.gap[name]]
        if stale:  # the draft timed longest ago, at its best k >= 1
            name = max(stale, key=self.age)
            self.gap[name] = min(2 * self.gap[name], self.probe_most)
            return self.draft(name, best_rate(self.models[name], limit, shortest=1)[0])
        k = rated[best][0]
        return self.draft(best, k) if k else Choice(0, expected_tokens=1.0, seconds=self.models[best].cost(0), draft="")

    @property
    def ready(self) -> bool:
        """Every candidate's draft, a plain step and a wider pass have been timed."""
        return all(m.ready for m in self.models.values())

    def predicted_rate(self, limit: int) -> float | None:
        """The most expected tokens per second any (draft, k <= limit) is predicted to give now; None while any
        candidate is unmeasured."""
        if not self.ready:
            return None
        return max(best_rate(m, min(limit, self.k_max))[1] for m in self.models.values())

    def draft(self, name: str, k: int) -> Choice:
        """Candidate `name` for a round of k draft tokens, with its model's E(k) and C(k) once it can."""
        model = self.models[name]
        if not model.ready:
            return Choice(k, draft=name)
        return Choice(k, expected_tokens=expected_tokens(model.acceptance()[:k]), seconds=model.cost(k), draft=name)

    def age(self, name: str) -> int:
        """Rounds since the candidate's newest draft timing."""
        return self.round - self.models[name].newest_draft()

    def skip(self) -> None:
        """A round this rule did not decide (another thread count's rule did): its timings age by one round."""
        self.round += 1

    def observe(self, round: Round) -> None:
        """The drafting candidate learns the round (its draft time, acceptance, and the shared pass time); the
        others' acceptance evidence decays by one round."""
        used = round.choice.draft if round.choice.k else None
        for name, model in self.models.items():
            model.round = self.round
            if name == used or (used is None and model is next(iter(self.models.values()))):
                model.observe(round)  # a plain step: times the pass (the shared table) and decays
            else:
                model.round += 1
                model.record_acceptance()
        self.round += 1


class OnlineThreadChoice:
    """The torch thread count chosen every round as well: one OnlineDraftChoice per count (its own timings, since the
    count changes what every pass and every draft step costs, and on a busy machine more threads can be slower),
    and each round the count whose rule predicts the most tokens per second. A count not in use is probed as a
    draft is (after a gap that doubles while it keeps losing): while its rule has not timed everything, by a round
    shaped as the best count's last one (the same draft and k), and it is rated by that pass's time against the
    best count's; its rule warms up only once that rating makes it the best. Like every choice here it reads only earlier rounds: exact.

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

    def choose(self, limit: int, rows: int = 1) -> Choice:
        """The count with the best predicted rate (its rule warms up first if it has not timed everything), or a
        probe of a count not in use: its rule's choice, or a plain step while that rule is unmeasured."""
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
            k = min(k, limit)
            self.probe_width[threads] = k + 1
            return Choice(k, draft=draft if k else "", threads=threads)
        choice = self.rules[threads].choose(limit)
        if threads == best:
            self.last_round = (choice.k or 0, choice.draft or "")
        return replace(choice, threads=threads)

    def observe(self, round: Round) -> None:
        for threads, rule in self.rules.items():  # every rule's timings age by the same rounds
            rule.observe(round) if threads == self.current else rule.skip()
        self.last[self.current] = self.round
        self.round += 1
