"""The library sets itself up: from a target, its candidate drafters and plain options to what decode needs, with a
report of what it measured and chose, and why.

    prepared = prepare(target, {"copy": ModelDrafter(copy), "ngram": NGramDrafter()}, calibration_ids(tokenizer),
                       k=None, threads="auto", runtime=RuntimeOptions(name="auto"), max_new_tokens=128)
    speculative_generate(target, prepared.batch_drafter, ids, k=prepared.rule, acceptance=prepared.acceptance, ...)

In three steps, which a caller that keeps loaded models between runs (an app's jobs of a sweep) takes one by one:
prepare_target (the thread count, then the target's runtime: compiled graphs hold for the count they were built at),
prepare_drafts (the drafters' runtime; candidates calibrated, the best kept behind a DraftSwitch) and prepare_decoding
(a tree drafter, the acceptance rule in its tree form, and k=auto's one rule for the run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..choose.cost import Rule
from ..choose.online import OnlineDraftChoice, is_lookup
from ..choose.rules import compiled_k_max, rule_for
from ..choose.threads import OnlineThreadChoice
from ..draft.base import Drafter, check_rows
from ..draft.switch import DraftSwitch
from ..runtime.compiled import runs_compiled
from ..runtime.machine import collecting_new_objects_only, machine, release_memory
from ..runtime.models import encode_prompt
from ..runtime.probes import ThreadChoice
from ..sampling import GREEDY, Sampling
from ..verify.base import AcceptanceRule
from ..verify.block import BlockVerification
from ..verify.token import TokenLevel
from ..verify.traversal import TraversalVerification
from ..verify.tree import TreeRules
from .calibration import Calibration, calibrate_in_turn
from .linears import cost_bound
from .report import Report
from .runtime import EAGER_RUNTIME, RuntimeOptions, put_drafter_on_runtime, put_on_runtime
from .threads import use_threads

# Candidates are measured on this prompt (short: the calibration takes seconds), and threads=auto probes with it
CALIBRATION_PROMPT = "Explain in two sentences why the sky is blue."
# Calibrated candidates: the best ones kept (by predicted speedup; the chosen first; besides it none that cannot
# gain: slower than the target, or predicted at most 1x) for k=auto's online choice
KEEP_CANDIDATES = 3


def calibration_ids(tokenizer: PreTrainedTokenizerBase, chat: bool = False) -> torch.Tensor:
    """CALIBRATION_PROMPT as the target reads it (1, L)."""
    return encode_prompt(tokenizer, CALIBRATION_PROMPT, chat=chat)


def prepare_target(target: PreTrainedModel, prompt_ids: torch.Tensor, *, threads: int | str | None = None,
                   k: int | None = None, runtime: RuntimeOptions = EAGER_RUNTIME, device: str = "cpu",
                   max_new_tokens: int = 128, report: Report | None = None) -> ThreadChoice | None:
    """Set the thread count (specdec.auto.threads.use_threads; None: as it is) and put the target on its runtime;
    returns threads="auto"'s measured choice."""
    choice = use_threads(threads, target, prompt_ids, device=device, k=k, report=report) if threads is not None else None
    put_on_runtime(target, runtime, device=device, max_new_tokens=max_new_tokens, report=report)
    return choice


@dataclass
class Drafts:
    """What drafts: the drafter speculative decoding runs with, the draft model of the naive method (and of model
    trees), and the calibration that chose among candidates (None: one drafter, as given)."""

    drafter: Drafter
    model: PreTrainedModel | None
    calibration: Calibration | None = None


def prepare_drafts(target: PreTrainedModel, drafters: Drafter | Mapping[str, Drafter | Callable[[], Drafter]],
                   prompt_ids: torch.Tensor, *, k: int | None = None, k_max: int = 8, sampling: Sampling = GREEDY,
                   eos_token_id: int | list[int] | None = None, seed: int = 0,
                   runtime: RuntimeOptions = EAGER_RUNTIME, device: str = "cpu", max_new_tokens: int = 128,
                   report: Report | None = None, copies: Mapping[str, Mapping[str, object]] | None = None) -> Drafts:
    """One drafter on its runtime as it is; or candidates by name (drafters, or functions that build one), each
    built and put on its runtime in turn, calibrated on prompt_ids (specdec.auto.calibration.calibrate_in_turn: one
    candidate loaded at a time besides the best so far) and the best KEEP_CANDIDATES kept behind a DraftSwitch (the
    chosen one its default: a fixed k drafts with it, k=auto chooses among them every round,
    specdec.choose.online); the others are dropped, and their memory handed back. k: the run's draft length (None:
    k=auto). copies: name -> load_model's keywords (quantization, dtype, ...) of the candidates that are copies of the
    target: after the first candidate, a copy is built only where its c predicted from its linears could win
    (specdec.auto.linears)."""
    options = {"device": device, "max_new_tokens": max_new_tokens, "report": report}
    if not isinstance(drafters, Mapping):
        put_drafter_on_runtime(drafters, runtime, **options)
        return Drafts(drafters, getattr(drafters, "model", None))

    def built(candidate: Drafter | Callable[[], Drafter]) -> Callable[[], Drafter]:
        def build() -> Drafter:
            built_already = hasattr(candidate, "propose") and not isinstance(candidate, type)  # else what builds one
            drafter = candidate if built_already else candidate()
            put_drafter_on_runtime(drafter, runtime, **options)
            return drafter
        return build

    builders = {name: built(candidate) for name, candidate in drafters.items()}
    if isinstance(drafters, dict):
        drafters.clear()  # the candidates live in the calibration only: a dropped one's memory goes back
    with collecting_new_objects_only():  # each dropped candidate's collection looks at the candidates only
        result, kept = calibrate_in_turn(target, builders, prompt_ids, keep=KEEP_CANDIDATES,
                                         release=partial(release_memory, device), k=k, k_max=k_max, sampling=sampling,
                                         eos_token_id=eos_token_id, seed=seed,
                                         predictions=copy_predictions(target, copies or {}, runtime))  # fmt: skip
    (report or Report()).say("calibration: %s", result.reason)
    # kept: best first, the chosen one first of all; the naive method's draft model: the first kept that has one
    model = next((d.model for d in kept.values() if getattr(d, "model", None) is not None), None)
    switch = DraftSwitch(kept, default=result.chosen)
    return Drafts(switch if len(kept) > 1 else kept[result.chosen], model, result)


def copy_predictions(target: PreTrainedModel, copies: Mapping[str, Mapping[str, object]], runtime: RuntimeOptions
                     ) -> dict[str, Callable[[torch.Tensor], tuple[float, float] | None]]:  # fmt: skip
    """The copies' predictions of c (specdec.auto.linears.cost_bound), each on the runtime it will run on: compiled
    where the target is and the copy compiles (runtime.drafts, or the packed int8 kernel's), else eager."""
    predictions = {}
    for name, form in copies.items():
        compiled = runs_compiled(target) and (runtime.drafts or form.get("quantization") == "packed_int8")
        if (bound := cost_bound(target, eager_copy=not compiled, **form)) is not None:
            predictions[name] = bound
    return predictions


TREE_RULE = {TokenLevel: TreeRules, BlockVerification: TraversalVerification}  # a chain's rule -> its tree form


def verification_for(temperature: float) -> AcceptanceRule:
    """verify=auto: block verification when sampling, where it accepts more tokens per pass than the token-level
    rule (docs/performance.md); the token-level rule at temperature 0, where both accept the same tokens. A tree
    takes the tree form of either (TREE_RULE)."""
    return TokenLevel() if temperature == 0 else BlockVerification()


def tree_form(acceptance: AcceptanceRule) -> AcceptanceRule:
    """A chain's rule in its tree form (the token-level tree rules; traversal verification for block verification);
    a tree rule as it is."""
    return TREE_RULE[type(acceptance)]() if type(acceptance) in TREE_RULE else acceptance


def online_rule(switch: Drafter, calibration: Calibration | None, threads: ThreadChoice | None, *, k_max: int,
                target: PreTrainedModel) -> OnlineDraftChoice | OnlineThreadChoice | None:
    """k=auto with calibrated candidates (a chain): one rule for the whole run, which chooses the draft and k every
    round, starting from the calibration's measurements (its alphas as priors, prompt lookup's excepted:
    specdec.choose.online.is_lookup; its timings as the first samples, replaced as rounds are timed); with
    threads="auto" on the CPU, one such rule per count of threads probed at the start and the count chosen every round
    too (the start's count seeded with the calibration), except on a compiled target, whose graphs hold for the count
    they were built at (a round at another count would compile them again); None otherwise (k=auto then prices the
    one drafter)."""
    if not isinstance(switch, DraftSwitch) or calibration is None:
        return None
    results = [r for r in calibration.results if r.name in switch.candidates]
    priors = {r.name: r.alpha for r in results if not math.isnan(r.alpha) and not is_lookup(switch.candidates[r.name])}
    k_max = compiled_k_max(k_max, target)  # no chain longer than the target's compiled graphs hold
    rule = OnlineDraftChoice(switch, k_max, prior=priors)
    step = calibration.step_ms / 1000
    rule.seed({1: step, **{r.k + 1: r.pass_cost * step for r in results}}, {r.name: r.draft_ms / 1000 for r in results})
    counts = sorted(threads.probe_ms) if threads is not None else []
    if len(counts) < 2 or runs_compiled(target):
        return rule
    start = threads.threads  # the calibration ran at the count threads=auto chose
    rules = {start: rule, **{t: OnlineDraftChoice(switch, k_max, prior=priors) for t in counts if t != start}}
    return OnlineThreadChoice(rules)


def run_rule(target: PreTrainedModel, drafter: Drafter, *, k: int | None, k_max: int = 8, trees: bool = False,
             max_nodes: int = 16, batch_size: int = 1, calibration: Calibration | None = None,
             threads: ThreadChoice | None = None) -> Rule | None:
    """k=auto (k=None): one rule for the whole run, so that what it measured on earlier prompts (pass times, draft
    times, acceptance) prices the next prompt's rounds instead of a warm-up at k_max on every prompt: calibrated
    candidates' online choice (online_rule, a chain of one sequence), else the factory's rule for the drafter (a
    CostModel pricing passes over the batch's rows, a TreeCostModel for trees). It still reads only finished
    rounds, so every output stays exact. None for a fixed k."""
    if k is not None:
        return None
    chain = not trees and batch_size == 1
    online = online_rule(drafter, calibration, threads, k_max=k_max, target=target) if chain else None
    return online or rule_for("auto", drafter, k_max=k_max, trees=trees, max_nodes=max_nodes, rows=batch_size,
                              target=target)  # fmt: skip


@dataclass
class Prepared:
    """What decode needs, and what the setup measured and chose."""

    drafter: Drafter  # what speculates: a tree drafter, or the chain drafter (a DraftSwitch of calibrated candidates)
    acceptance: AcceptanceRule  # how its chains or trees are verified
    rule: Rule | None  # k=auto: one rule across the run's prompts; None: a fixed k
    batch_size: int
    drafts: Drafts | None = None
    threads: ThreadChoice | None = None  # threads="auto": the count measured fastest, and its probes
    report: Report | None = None

    @property
    def batch_drafter(self) -> Drafter:
        """The drafter to decode with: at batch_size > 1 a DraftSwitch's calibrated best candidate (the online choice
        of the draft is a single-sequence rule), else the drafter."""
        if self.batch_size > 1 and isinstance(self.drafter, DraftSwitch):
            return self.drafter.candidates[self.drafter.default]
        return self.drafter


def prepare_decoding(target: PreTrainedModel, drafts: Drafts, *, k: int | None, k_max: int = 8,
                     sampling: Sampling = GREEDY, acceptance: AcceptanceRule | None = None, tree: Drafter | None = None,
                     max_nodes: int = 16, batch_size: int = 1, threads: ThreadChoice | None = None,
                     runtime: RuntimeOptions = EAGER_RUNTIME, device: str = "cpu", max_new_tokens: int = 128,
                     speculative: bool = True, report: Report | None = None) -> Prepared:
    """The run's drafter (tree: a tree drafter on its runtime, else the drafts' chain drafter), its acceptance rule
    (None: verification_for the temperature; with a tree, a chain's rule in its tree form) and, for the speculative
    method, the drafter checked for batch_size rows and k=auto's rule (run_rule)."""
    if tree is not None:
        put_drafter_on_runtime(tree, runtime, device=device, max_new_tokens=max_new_tokens, report=report)
    acceptance = acceptance or verification_for(sampling.temperature)
    prepared = Prepared(tree or drafts.drafter, tree_form(acceptance) if tree is not None else acceptance, None,
                        batch_size, drafts, threads, report)
    if speculative:  # refuses what cannot draft for a batch, before any prompt runs
        check_rows(prepared.batch_drafter, batch_size)
        prepared.rule = run_rule(target, prepared.batch_drafter, k=k, k_max=k_max, trees=tree is not None,
                                 max_nodes=max_nodes, batch_size=batch_size, calibration=drafts.calibration,
                                 threads=threads)
    return prepared


def prepare(target: PreTrainedModel, drafters: Drafter | Mapping[str, Drafter], prompt_ids: torch.Tensor, *,
            k: int | None, k_max: int = 8, sampling: Sampling = GREEDY, acceptance: AcceptanceRule | None = None,
            tree: Drafter | None = None, max_nodes: int = 16, batch_size: int = 1, threads: int | str | None = None,
            runtime: RuntimeOptions = EAGER_RUNTIME, device: str = "cpu", max_new_tokens: int = 128,
            eos_token_id: int | list[int] | None = None, seed: int = 0) -> Prepared:
    """Set up a run from scratch: prepare_target, prepare_drafts, prepare_decoding, in that order, one report.

    drafters: one drafter, or candidates by name (calibrated on prompt_ids (1, L), e.g. calibration_ids). k: the
    draft length, None for k=auto. threads: a count, "auto", or None (as it is). tree: a tree drafter to speculate
    with instead of the chain drafter."""
    report = Report(machine=machine(device))
    places = {"runtime": runtime, "device": device, "max_new_tokens": max_new_tokens, "report": report}
    choice = prepare_target(target, prompt_ids, threads=threads, k=k, **places)
    drafts = prepare_drafts(target, drafters, prompt_ids, k=k, k_max=k_max, sampling=sampling,
                            eos_token_id=eos_token_id, seed=seed, **places)
    return prepare_decoding(target, drafts, k=k, k_max=k_max, sampling=sampling, acceptance=acceptance, tree=tree,
                            max_nodes=max_nodes, batch_size=batch_size, threads=choice, **places)
