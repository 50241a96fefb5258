"""Decisions that keep being made: which draft, and how many tokens of it, chosen again every round.

A calibration at the start (specdec.auto.calibration) measures each candidate draft for a few seconds and keeps
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

Context and hindsight. Prompt lookup's acceptance depends on the text being written, not on a model pair: a round
whose last three tokens occurred before is accepted far more often than one where only the last token did, and a
text that copies its prompt far more often than one that does not. A candidate with `context` and `replay`
(specdec.NGramDrafter: the match order) has a CostModel per context, sharing its draft timings. Its acceptance is
learned in hindsight at every position of the text, whichever draft ran: what a lookup there would have proposed
against the tokens that followed, the target's own (NGramDrafter.replay; a hit has probability p_i(x_i), beta_i
of a one-hot draft). Each round rates it on the model of the tokens so far; context 0 (no match) leaves it out.

Exploration at a bounded cost. Two estimates go stale for a draft that is not used: its acceptance (each round
decays its evidence towards its prior, so an unused draft is tried again once the prior says it would win; the
default run gives a draft model its calibrated alpha, prompt lookup an optimistic prior counted as
LOOKUP_PRIOR_WEIGHT positions, then the mean beta_1 of its evidence in that context) and its draft time (a machine
that got quieter or busier). A draft whose newest draft timing is older than its probe gap gets one probe round at
its best k >= 1; a probe that does not make it the best doubles its gap (up to `probe_most` rounds), one that does
resets it. The probes are at most one round in `probe_every`, and fewer the longer a draft keeps losing. A draft
learnt in hindsight is not probed: its acceptance is never stale, and a lookup's draft time is microseconds.
Timings older than `max_age` rounds no longer count once a newer one exists (specdec.choose.cost.RecentTimes), so
a change of load reaches every estimate within a few rounds.

Exactness: every choice is a function of earlier rounds (their times and acceptance) and of the tokens so far,
never of this round's target distribution p. Given the past, the round is speculative sampling with a fixed draft
and a fixed k, which emits the target's distribution (notebook 01, section 9); so the whole output is exact,
whatever the machine's load does to the choices.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch

from ..draft.switch import DraftSwitch
from ..theory import best_draft_length, expected_tokens
from .cost import Choice, CostModel, ObservedRound, Tokens

LOOKUP_PRIOR_WEIGHT = 2.0  # prompt lookup's optimistic prior counts as this many records of its learned one


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
    expected tokens per second, from earlier rounds and the tokens so far only; see the module's docstring.

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
        self.switch, self.clock, self.k_max = switch, clock, k_max
        self.probe_every, self.probe_most = probe_every, probe_most
        self.pass_times: dict = {}  # width -> RecentTimes, shared by every candidate's model
        priors = dict(prior) if isinstance(prior, Mapping) else {name: prior for name in switch.candidates}
        self.new_model = lambda name: CostModel(
            k_max, switch.candidates[name].draft_cost, clock=clock, window=window, max_age=max_age, decay=decay,
            prior=priors.get(name, 0.9), pass_times=self.pass_times,
            prior_weight=LOOKUP_PRIOR_WEIGHT if is_lookup(switch.candidates[name]) else None,
        )  # fmt: skip
        self.models = {name: self.new_model(name) for name in switch.candidates}  # each candidate's model now
        self.base = dict(self.models)  # the models of a call without tokens (no context)
        # a candidate whose acceptance depends on the text (lookup): a model per context, sharing its draft timings
        self.contexts: dict[str, dict] = {n: {} for n, d in switch.candidates.items() if hasattr(d, "replay")}
        self.idle: set[str] = set()  # candidates with nothing to propose for the tokens so far
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

    def hindsight(self, tokens: Tokens) -> list[tuple[str, int, list[float]]]:
        """Each contextual candidate's replay (NGramDrafter.replay) at every position of every row written since the
        last call and decided by now: (candidate, context, scores). The rows' positions are kept by the switch."""
        evidence, rows = [], list(tokens or ())
        if not self.contexts or len(rows) != len(self.switch.replayed):  # no such candidate, or rows the switch
            return evidence  # did not start (a rule asked directly): nothing to look back on
        for b, row in enumerate(rows):
            text, t = row[0].tolist(), self.switch.replayed[b]
            seq = torch.tensor(text)  # on the host: a lookup's searches are many small steps
            while t < len(text):
                replays = {n: self.switch.candidates[n].replay(seq[:t], text[t:], self.k_max) for n in self.contexts}
                if None in replays.values():
                    break
                evidence += [(name, *replay) for name, replay in replays.items() if replay[0]]
                t += 1
            self.switch.replayed[b] = t
        return evidence

    def learn(self, evidence: list[tuple[str, int, list[float]]]) -> None:
        """Hindsight scores into each candidate's model of their context (one record each: the decay is per
        position looked back on)."""
        for name, key, scores in evidence:
            self.context_model(name, key).record_acceptance(scores)

    def context_model(self, name: str, key: int) -> CostModel:
        """The candidate's model for a context; a context seen first gets a fresh one that shares the candidate's
        draft timings and learns acceptance from hindsight only."""
        models = self.contexts[name]
        if key not in models:
            models[key] = self.new_model(name)
            models[key].draft_times, models[key].from_rounds = self.base[name].draft_times, False
        return models[key]

    def follow(self, tokens: Tokens) -> None:
        """Put in place each contextual candidate's model for the tokens so far (its context: lookup's match order);
        a candidate whose context is 0 has nothing to propose this round (idle). No tokens: the models without
        context."""
        self.idle = set()
        for name in self.contexts:
            key = None if tokens is None else self.switch.candidates[name].context(tokens)
            if key == 0:
                self.idle.add(name)
                continue
            self.models[name] = self.base[name] if key is None else self.context_model(name, key)
            self.models[name].round = self.round

    def choose(self, limit: int, rows: int = 1, tokens: Tokens = None) -> Choice:
        """This round's draft and draft length (0: a plain target step), at most `limit` tokens (one row); a
        contextual candidate is rated on its model for the tokens so far (follow)."""
        self.learn(self.hindsight(tokens))
        self.follow(tokens)
        return self.decide(limit)

    def decide(self, limit: int) -> Choice:
        """choose, once hindsight is learned and the contexts followed."""
        limit = min(limit, self.k_max)
        if limit == 0 or 1 not in self.pass_times:  # nothing to draft, or T_pass(1) not timed yet
            return Choice(0, draft="")
        able = {name: m for name, m in self.models.items() if name not in self.idle}
        unready = [name for name, m in able.items() if not m.ready]
        if unready:  # warm-up: each candidate drafts the longest draft once, which times it and a wide pass
            return self.draft(unready[0], limit)
        if not able:
            return self.plain_step()
        rated = {name: best_rate(m, limit) for name, m in able.items()}
        best = max(rated, key=lambda name: rated[name][1])
        if self.best != best:
            self.gap[best] = self.probe_every
        self.best = best
        drafting = best if rated[best][0] else None  # a plain step times no draft: every draft can go stale
        stale = [n for n in able if n != drafting and n not in self.contexts and self.age(n) >= self.gap[n]]
        if stale:  # the draft timed longest ago, at its best k >= 1
            name = max(stale, key=self.age)
            self.gap[name] = min(2 * self.gap[name], self.probe_most)
            return self.draft(name, best_rate(self.models[name], limit, shortest=1)[0])
        k = rated[best][0]
        return self.draft(best, k) if k else self.plain_step()

    def plain_step(self) -> Choice:
        """k = 0, predicted: one token at the cost of one target step."""
        return Choice(0, expected_tokens=1.0, seconds=next(iter(self.models.values())).cost(0), draft="")

    @property
    def ready(self) -> bool:
        """Every candidate's draft, a plain step and a wider pass have been timed."""
        return all(m.ready for m in self.models.values())

    def predicted_rate(self, limit: int) -> float | None:
        """The most expected tokens per second any (draft, k <= limit) is predicted to give now (an idle candidate:
        a plain step's); None while any candidate is unmeasured."""
        if not self.ready:
            return None
        limit = min(limit, self.k_max)
        return max(1.0 / m.cost(0) if name in self.idle else best_rate(m, limit)[1] for name, m in self.models.items())

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

    def observe(self, round: ObservedRound) -> None:
        """The drafting candidate learns the round (its draft time, acceptance, and the shared pass time); the
        others' acceptance evidence decays by one round."""
        used = round.choice.draft if round.choice.k else None
        for name, model in self.models.items():
            model.round = self.round
            if name == used or (used is None and model is next(iter(self.models.values()))):
                model.observe(round)  # a plain step: times the pass (the shared table) and decays
            else:
                model.round += 1
                if model.from_rounds:
                    model.record_acceptance()
        self.round += 1
