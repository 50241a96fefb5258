"""Which draft to speculate with on this machine: time each candidate, estimate its alpha, predict, pick.

Notation of Leviathan et al. (2023): alpha the acceptance rate of one draft token, k (their gamma) the
draft length, c the cost of one draft step relative to one target step. Their Thm 3.8 predicts the
speedup over target-only decoding as E(k) / (k c + 1) with E(k) = (1 - alpha^(k+1)) / (1 - alpha). The
"1" is the cost of one verification pass over k + 1 tokens, assumed equal to one target step; on a CPU
it is not (small-matrix kernels), so here it is the measured ratio v(k+1) = T_pass(k+1) / T_step:

    speedup(k) = E(k) / (k c + v(k+1))         a draft model (c per drafted token)
    speedup(k) = E(k) / (c + v(k+1))           a lookup (c per call, whatever its length)

Which draft is fastest depends on the CPU: bitsandbytes' fused 4-bit kernel needs AVX512-BF16, torch's
dynamic int8 and bf16 matmuls depend on AVX-512 / AMX. A draft slower than the target (c > 1) cannot
gain: E(k) <= k + 1 < k c + 1 <= k c + v(k+1). So the choice is made by measurement, each run.

The model candidates are copies of the target and, by default, draft from the target's KV cache
(ModelDrafter(reads_target_cache=True)): in the loop they run one-token steps only, which is what is timed.

- timings: one-token steps of the target and of every draft model, target passes of a few widths (other
  widths read off a line through them, as specdec.choose.cost does), one lookup call; medians after a warm-up,
  all of them interleaved in each repeat so that they share the machine's load;
- alpha: a short speculative_generate at k = probe_k per candidate; for a draft model the mean of
  sum_x min(p, q) over the positions on the output path (Leviathan's definition of alpha); for a lookup
  the value for which Eq. 1 gives the measured tokens per target pass (finding nothing counts as a rejection).
  Candidates are probed in the order of their speedup at alpha = 1 (an upper bound); one whose bound is
  below the best probed speedup cannot win and is not probed (a slow draft costs most to probe).
Both can be injected (`timings=`, `alphas=`), which makes the choice reproducible in tests. calibrate measures
candidates that are all loaded; calibrate_in_turn (what specdec.auto.setup.prepare_drafts runs) builds one at a time,
times it in a window of its own next to target steps, and keeps only the best so far, so that memory never holds
every copy of the target at once.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial

import torch
from transformers import PreTrainedModel

from ..choose.timings import interpolated
from ..decoding import speculative_generate
from ..draft.base import Drafter
from ..draft.head_drafter import HeadDrafter
from ..draft.model import ModelDrafter
from ..markdown import cell, markdown_table
from ..runtime.cached import CachedLM, logits_width
from ..runtime.probes import pass_tokens, timed_step
from ..runtime.timing import interleaved_samples
from ..sampling import GREEDY, Sampling
from ..theory import expected_tokens_per_pass, optimal_k, walltime_improvement
from .linears import MARGIN

PASS_WIDTHS = (1, 3, 5, 9)  # target pass widths timed; others interpolated
UNSTEADY = 0.5  # Timings.spread above which the calibration says its timings are unsteady


@dataclass(frozen=True)
class Timings:
    """Milliseconds: target passes by width (width 1 is a step) and each candidate's draft unit."""

    pass_ms: dict[int, float]  # width -> median ms of one target pass over that many tokens
    draft_ms: dict[str, float]  # name -> one draft-model step, or one lookup call
    spread: float = 0.0  # the largest (max - min) / median over the repeats of a timing (>= 1 ms): changing load

    @property
    def unsteady(self) -> bool:
        """The repeats of some timing differed by more than half its median: the machine's load changed while
        the calibration ran, so its choice is a weak guess (an online choice re-measures it, specdec.choose.online)."""
        return self.spread > UNSTEADY

    @property
    def step_ms(self) -> float:
        return self.pass_ms[1]

    def pass_cost(self, width: int) -> float:
        """v(width) = T_pass(width) / T_step: measured, or read off a line through the measured widths; never
        below 1 (a wider pass does the step's work and more: a lower reading is timing noise)."""
        return max(1.0, interpolated(self.pass_ms, width) / self.step_ms)


@torch.inference_mode()
def measure_timings(
    target: PreTrainedModel,
    drafters: Mapping[str, Drafter],
    prefix: torch.Tensor,
    *,
    k_max: int = 8,
    repeats: int = 3,
    widths: Sequence[int] = PASS_WIDTHS,
) -> Timings:
    """Median ms of target passes at a few widths and of one draft step (or lookup call) per candidate.

    Interleaved: every repeat times each of them once in turn, so that all see the same machine load (on a
    shared machine the load changes within seconds; c is a ratio of two of these medians). prefix: (1, L).
    """
    jobs: dict[object, tuple[Callable[[], object], Callable[[], None]]] = {}
    target_lm = CachedLM(target)
    target_lm.forward(prefix, last_only=True)
    for w in widths:
        jobs[w] = timed_step(target_lm, pass_tokens(prefix, w))
    for name, d in drafters.items():
        if isinstance(d, ModelDrafter):
            lm = CachedLM(d.model)
            lm.forward(prefix, last_only=True)
            jobs[name] = timed_step(lm, prefix[:, -1:])
        elif isinstance(d, HeadDrafter):  # a trained head: one draft token, on a target cache that keeps features
            source = CachedLM(target)
            d.share_cache(source)
            source.forward(prefix[:, :-1])
            d.start([prefix])
            jobs[name] = (partial(d.propose, [prefix], 1, GREEDY, logits_width(target), None), lambda: None)
        else:
            d.start([prefix])  # a lookup: one row
            jobs[name] = (partial(d.propose, [prefix], k_max, GREEDY, logits_width(target), None), lambda: None)
    samples = interleaved_samples({key: run for key, (run, _) in jobs.items()}, repeats, warmup=1,
                                  device=prefix.device, after={key: undo for key, (_, undo) in jobs.items()})
    ms = {key: 1000 * statistics.median(values) for key, values in samples.items()}
    # timings of a millisecond or more: a lookup call's fraction of a millisecond is all timer noise
    spread = max([(max(v) - min(v)) / statistics.median(v) for k, v in samples.items() if ms[k] >= 1.0], default=0.0)
    return Timings({w: ms[w] for w in widths}, {name: ms[name] for name in drafters}, spread)


def alpha_from_tokens_per_pass(tokens_per_pass: float, k: int) -> float:
    """The alpha for which Eq. 1, (1 - alpha^(k+1)) / (1 - alpha), equals tokens_per_pass (bisection)."""
    if tokens_per_pass >= k + 1 or tokens_per_pass <= 1:  # every draft accepted / none
        return 1.0 if tokens_per_pass >= k + 1 else 0.0
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens_per_pass(mid, k) < tokens_per_pass else (low, mid)
    return (low + high) / 2


def measure_alpha(
    target: PreTrainedModel,
    drafter: Drafter,
    ids: torch.Tensor,
    *,
    probe_k: int = 4,
    max_new_tokens: int = 24,
    sampling: Sampling = GREEDY,
    eos_token_id: int | list[int] | None = None,
    seed: int = 0,
) -> float:
    """alpha from a short speculative generation at k = probe_k after ids (1, L)."""
    out = speculative_generate(
        target, drafter, ids, k=probe_k, sampling=sampling, max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id, generator=torch.Generator(device=ids.device).manual_seed(seed),
    )  # fmt: skip
    stats = out.stats
    if drafter.draft_cost == "per_token" and stats.overlap_count:
        # a draft model: Leviathan's alpha = E[sum_x min(p, q)] over the positions on the output path. Not
        # from tokens per pass, which the last rounds' shorter drafts (never past the budget) pull down
        return stats.alpha
    per_pass = (stats.accepted + stats.target_forwards) / stats.target_forwards  # before EOS truncation
    return alpha_from_tokens_per_pass(per_pass, probe_k)


@dataclass(frozen=True)
class CandidateResult:
    """One candidate: measured c and alpha, and Thm 3.8's speedup at the run's k and at its best k."""

    name: str
    draft_cost: str  # per_token (c per drafted token) or per_call (c per lookup)
    draft_ms: float  # one draft step or lookup call
    c: float  # draft_ms / target step ms
    alpha: float  # NaN: not probed, since even alpha = 1 could not beat the best probed (speedups: bounds)
    k: int  # the draft length the speedup is predicted at (the run's k, else best_k)
    pass_cost: float  # v(k+1): one verification pass over k+1 tokens, in target steps
    speedup: float  # predicted at k
    best_k: int  # 1..k_max maximising the predicted speedup
    best_speedup: float
    linears: float | None = None  # R, where c was predicted from the linears and the copy never built (auto.linears)

    @property
    def slower_than_target(self) -> bool:
        """c > 1 for a draft model: speculative decoding cannot gain with it."""
        return self.draft_cost == "per_token" and self.c > 1.0


@dataclass(frozen=True)
class Calibration:
    """Every candidate's result (best first), the chosen one and why."""

    step_ms: float  # one target step
    results: tuple[CandidateResult, ...]
    chosen: str
    reason: str

    @property
    def choice(self) -> CandidateResult:
        return next(r for r in self.results if r.name == self.chosen)

    def rows(self) -> list[dict[str, object]]:
        return [asdict(r) for r in self.results]

    def to_json(self) -> dict[str, object]:
        return {"chosen": self.chosen, "reason": self.reason, "target_step_ms": self.step_ms, "candidates": self.rows()}

    def markdown(self) -> str:
        """Which draft the calibration chose and why: each candidate's measured c, alpha, predicted speedup."""
        rows = [
            [r.name + (" (not built)" if r.linears is not None else ""), cell(r.draft_ms, "{:.1f}"),
             cell(r.c, "{:.2f}"), cell(r.alpha, "{:.3f}"), str(r.k),
             cell(r.pass_cost, "{:.2f}"), cell(r.speedup, "{:.2f}"), str(r.best_k),
             cell(r.best_speedup, "{:.2f}")]
            for r in self.results
        ]  # fmt: skip
        header = ["candidate", "draft ms", "c", "alpha", "k", "pass cost", "predicted speedup", "best k",
                  "at best k"]  # fmt: skip
        return (
            f"Draft calibration (model.draft.candidates; target step {self.step_ms:.1f} ms; c per "
            "draft token, per lookup call for ngram; pass cost = one verification pass over k+1 tokens in "
            "target steps; speedup by Leviathan's Thm 3.8 with that pass cost):\n\n"
            f"{markdown_table(header, rows)}\n\nChosen draft: {self.reason}\n"
        )


def evaluate(
    name: str, draft_cost: str, timings: Timings, alpha: float, k: int | None, k_max: int
) -> CandidateResult:
    """Thm 3.8 with the measured c and pass cost (specdec.metrics) at the run's k and at the best k."""
    c = timings.draft_ms[name] / timings.step_ms

    def speedup(j: int) -> float:
        return walltime_improvement(alpha, c, j, timings.pass_cost(j + 1), draft_cost)

    best_k = optimal_k(alpha, c, k_max, timings.pass_cost, draft_cost)
    at = best_k if k is None else k
    return CandidateResult(
        name, draft_cost, timings.draft_ms[name], c, alpha, at, timings.pass_cost(at + 1), speedup(at), best_k,
        speedup(best_k),
    )  # fmt: skip


def choose(results: Sequence[CandidateResult]) -> tuple[str, str]:
    """The candidate with the best predicted speedup at the run's k, and a sentence saying why."""
    ranked = sorted(results, key=lambda r: -r.speedup)
    best = ranked[0]
    reason = (
        f"{best.name}: predicted {best.speedup:.2f}x at k={best.k} (alpha {best.alpha:.2f}, c {best.c:.2f}, "
        f"verification pass {best.pass_cost:.2f} target steps), the best of {len(ranked)} candidates"
    )
    if len(ranked) > 1:
        bound = "at most" if math.isnan(ranked[1].alpha) else "at"
        reason += f"; next {ranked[1].name} {bound} {ranked[1].speedup:.2f}x"
    if best.speedup <= 1.0:
        reason += (
            ". No candidate is predicted to beat the target alone on this machine at this k"
            f" (best k {best.best_k}: {best.best_speedup:.2f}x); k=auto falls back to plain target steps"
        )
    skipped = [r.name for r in ranked if math.isnan(r.alpha) and r.linears is None]
    if skipped:
        reason += f". Not probed for alpha (could not win even at alpha = 1): {', '.join(skipped)}"
    unbuilt = [f"{r.name} (its linears {r.linears:.2f}x the target's)" for r in ranked if r.linears is not None]
    if unbuilt:
        reason += (f". Not built ({MARGIN} times the c predicted from its linears could not win either): "
                   f"{', '.join(unbuilt)}")
    slow = [r.name for r in ranked if r.slower_than_target]
    if slow:
        reason += (
            f". Slower than the target (c > 1): {', '.join(slow)}; speculative decoding cannot gain with "
            f"{'that draft' if len(slow) == 1 else 'those drafts'} on this machine"
        )
    return best.name, reason + "."


def calibrate(
    target: PreTrainedModel,
    drafters: Mapping[str, Drafter],
    ids: torch.Tensor,
    *,
    k: int | None = None,
    k_max: int = 8,
    probe_k: int = 4,
    probe_tokens: int = 24,
    sampling: Sampling = GREEDY,
    eos_token_id: int | list[int] | None = None,
    seed: int = 0,
    repeats: int = 3,
    timings: Timings | None = None,
    alphas: Mapping[str, float] | None = None,
) -> Calibration:
    """Measure (or take) timings and alphas of the candidates after ids (1, L); pick the best predicted speedup.

    k: the run's draft length (None: each candidate at its own best k). timings / alphas: injected
    measurements, for reproducible choices in tests.
    """
    if not drafters:
        raise ValueError("calibrate needs at least one candidate drafter")
    timings = timings or measure_timings(target, drafters, ids, k_max=k_max, repeats=repeats)
    # alpha = 1 bounds what a candidate can gain; probe the most promising first, skip those that cannot win
    bounds = {n: evaluate(n, d.draft_cost, timings, 1.0, k, k_max) for n, d in drafters.items()}
    results: list[CandidateResult] = []
    probe = partial(measure_alpha, target, ids=ids, probe_k=probe_k, max_new_tokens=probe_tokens, sampling=sampling,
                    eos_token_id=eos_token_id, seed=seed)  # fmt: skip
    for name in sorted(drafters, key=lambda n: -bounds[n].speedup):
        alpha = alphas[name] if alphas is not None else None
        results.append(assess(bounds[name], results, timings, k, k_max, partial(probe, drafters[name]), alpha))
    return conclude(results, timings)


def assess(bound: CandidateResult, results: Sequence[CandidateResult], timings: Timings, k: int | None, k_max: int,
           probe: Callable[[], float], alpha: float | None = None) -> CandidateResult:
    """One candidate's result: at its given alpha; not probed (its alpha = 1 bound kept, alpha NaN) where even the
    bound is below the best result so far; else at the alpha `probe` measures."""
    if alpha is None and results and bound.speedup < max(r.speedup for r in results):
        return replace(bound, alpha=math.nan)  # not probed: its speedups are upper bounds
    return evaluate(bound.name, bound.draft_cost, timings, probe() if alpha is None else alpha, k, k_max)


def conclude(results: Sequence[CandidateResult], timings: Timings) -> Calibration:
    """The calibration of these results: ranked best first, the best chosen, and why (a weak guess where the timings
    were unsteady)."""
    chosen, reason = choose(results)
    if timings.unsteady:
        reason += (
            f" The timings were unsteady: repeats of one differed by {100 * timings.spread:.0f}% of its median (the "
            "machine's load changed while they ran), so this choice is a weak guess; k=auto re-measures every round."
        )
    ranked = tuple(sorted(results, key=lambda r: -r.speedup))
    return Calibration(timings.step_ms, ranked, chosen, reason)


def kept_names(results: Sequence[CandidateResult], keep: int, has_model: Callable[[str], bool]) -> list[str]:
    """The `keep` best results' names (best first) but those that cannot gain after the best (slower than the target,
    c > 1, or predicted at most 1x at their best k; or a draft model not probed, which even at alpha = 1 could not
    beat the best: each loaded copy costs its bytes for the whole run; or a copy never built), and the best one with
    a draft model if none of those has one (the naive method generates with it)."""
    ranked = [r.name for r in sorted(results, key=lambda r: -r.speedup)]
    slow = {r.name for r in results if r.slower_than_target or r.best_speedup <= 1.0
            or (math.isnan(r.alpha) and has_model(r.name)) or r.linears is not None}  # fmt: skip
    kept = [name for i, name in enumerate(ranked) if i == 0 or name not in slow][:keep]
    if not any(has_model(n) for n in kept):
        kept += [n for n in ranked if n not in kept and has_model(n)][:1]
    return kept


def predicted(name: str, prediction: tuple[float, float], results: Sequence[CandidateResult], pass_ms: dict[int, float],
              draft_ms: dict[str, float], spread: float, k: int | None, k_max: int) -> CandidateResult | None:
    """A copy's result from its predicted c (lowered) and R, not built, where even at alpha = 1 it is below the best
    result so far (its c entered in draft_ms); else None (draft_ms as it was): it is built and measured."""
    c, ratio = prediction
    draft_ms[name] = c * pass_ms[1]
    bound = evaluate(name, "per_token", Timings(pass_ms, dict(draft_ms), spread), 1.0, k, k_max)
    if bound.speedup < max(r.speedup for r in results):
        return replace(bound, alpha=math.nan, linears=ratio)
    del draft_ms[name]
    return None


def calibrate_in_turn(
    target: PreTrainedModel,
    builders: Mapping[str, Callable[[], Drafter]],
    ids: torch.Tensor,
    *,
    keep: int,
    release: Callable[[], None] = lambda: None,
    k: int | None = None,
    k_max: int = 8,
    repeats: int = 3,
    predictions: Mapping[str, Callable[[torch.Tensor], tuple[float, float] | None]] | None = None,
    **probe: object,
) -> tuple[Calibration, dict[str, Drafter]]:
    """calibrate, loading one candidate at a time, so that memory holds the target, the `keep` best candidates so
    far and the one being measured, not every candidate at once (six copies of the target by default).

    builders: name -> a function that builds the candidate (loads its model, puts it on its runtime); probe:
    measure_alpha's keywords (probe_k, max_new_tokens, sampling, eos_token_id, seed). Each is timed
    in its own interleaved window next to target steps, its c the ratio of the two (the first window also times the
    target's passes); then it is assessed as calibrate assesses it (probed for alpha unless even alpha = 1 could
    not win). Candidates outside the best `keep` (kept_names: after the best, none that cannot gain) are dropped
    as soon as they fall out (release() then hands their memory back). predictions: name -> a function of the
    prefix giving a copy's c, lowered by a margin, and R, or None (specdec.auto.linears.cost_bound): after the first
    candidate, a copy whose speedup at that c and alpha = 1 is below the best so far is not built at all. Returns the
    calibration and the kept drafters by name, best first."""
    if not builders:
        raise ValueError("calibrate needs at least one candidate drafter")
    pass_ms: dict[int, float] = {}
    draft_ms: dict[str, float] = {}
    spread = 0.0
    results: list[CandidateResult] = []
    kept: dict[str, Drafter] = {}
    for name, build in builders.items():
        if results and name in (predictions or {}) and (prediction := predictions[name](ids)) is not None:
            unbuilt = predicted(name, prediction, results, pass_ms, draft_ms, spread, k, k_max)
            if unbuilt is not None:
                results.append(unbuilt)
                continue
        drafter = build()
        window = measure_timings(target, {name: drafter}, ids, k_max=k_max, repeats=repeats,
                                 widths=(1,) if pass_ms else PASS_WIDTHS)  # fmt: skip
        pass_ms = pass_ms or window.pass_ms
        draft_ms[name] = window.draft_ms[name] * pass_ms[1] / window.step_ms  # c as measured in its own window
        spread = max(spread, window.spread)
        timings = Timings(pass_ms, dict(draft_ms), spread)
        bound = evaluate(name, drafter.draft_cost, timings, 1.0, k, k_max)
        results.append(assess(bound, results, timings, k, k_max, partial(measure_alpha, target, drafter, ids, **probe)))
        kept[name] = drafter
        names = kept_names(results, keep, lambda n: getattr(kept.get(n), "model", None) is not None)
        dropped = [n for n in kept if n not in names]
        for n in dropped:
            del kept[n]
        del drafter
        if dropped:
            release()
    calibration = conclude(results, Timings(pass_ms, draft_ms, spread))
    return calibration, {r.name: kept[r.name] for r in calibration.results if r.name in kept}
