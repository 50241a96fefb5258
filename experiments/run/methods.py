"""What a run generates with, built from its config once: the settings, the pair, the speculative method's
drafter (the pair's chain drafter, or the tree of cfg.tree); and each method's generation of one prompt."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from specdec import (
    BlockVerification,
    Generation,
    TokenLevel,
    TraversalVerification,
    TreeRules,
    autoregressive_generate,
    draft_then_score,
    speculative_generate,
    tree_generate,
)
from specdec.choose.cost import Rule
from specdec.choose.online import OnlineDraftChoice, is_lookup
from specdec.choose.rules import compiled_k_max, rule_for
from specdec.choose.threads import OnlineThreadChoice
from specdec.draft.base import Drafter, check_rows
from specdec.draft.switch import DraftSwitch
from specdec.runtime.compiled import runs_compiled
from specdec.verify.base import AcceptanceRule

from .hf import hf_generate, hf_generate_batch
from .pair import Pair, Pairs, tree_drafter
from .schema import AUTO
from .settings import ConfigError, Plan, plan_of


@dataclass
class Setup:
    """A run resolved into objects: its settings, its pair, its speculative drafter and method=hf's options."""

    plan: Plan
    pair: Pair
    drafter: Drafter
    hf: DictConfig
    acceptance: AcceptanceRule  # how the speculative method's chains or trees are verified (conf/verify/)
    rule: Rule | None = None  # k=auto: one rule across the run's prompts (run_rule); None: a fixed k

    def generate(
        self, method: str, ids: torch.Tensor | list[torch.Tensor], max_new_tokens: int, seed: int | None = None,
        stop_at_eos: bool = True,
    ) -> Generation:
        """One generation of up to max_new_tokens after ids (1, L), with a fresh generator seeded with seed
        (default: the run's seed); stop_at_eos=False runs to the budget whatever the tokens. A list of prompts
        (1, L_b) is one batch (specdec.state): every method then decodes all of them together."""
        plan, pair = self.plan, self.pair
        seed = plan.seed if seed is None else seed
        eos = pair.eos_token_id if stop_at_eos else []
        batch = isinstance(ids, list)
        prompts = [p[0] for p in ids] if batch else ids
        common = {"sampling": plan.sampling, "max_new_tokens": max_new_tokens, "eos_token_id": eos or None,
                  "generator": torch.Generator(device=plan.device).manual_seed(seed)}  # fmt: skip
        if method == "autoregressive":
            return autoregressive_generate(pair.target, prompts, **common)
        if method == "speculative":
            return self.speculative(prompts, common)
        if method == "hf":
            return (hf_generate_batch if batch else hf_generate)(pair, ids, self.hf, plan.sampling, max_new_tokens,
                                                                 seed, eos)  # fmt: skip
        return draft_then_score(pair.target, pair.draft_model, prompts, draft_tokenizer=pair.draft_tokenizer,
                                target_tokenizer=pair.tokenizer, **common)  # fmt: skip

    def speculative(self, prompts: torch.Tensor | list[torch.Tensor], common: dict) -> Generation:
        """Speculative decoding of one prompt or a batch, chains or trees, with the run's rule or fixed k."""
        plan = self.plan
        if plan.trees:
            return tree_generate(self.pair.target, self.batch_drafter, prompts, k=self.rule or plan.tree_k,
                                 max_nodes=plan.max_nodes, phase_times=True, acceptance=self.acceptance,
                                 **common)  # fmt: skip
        return speculative_generate(self.pair.target, self.batch_drafter, prompts, k=self.rule or plan.k,
                                    phase_times=True, acceptance=self.acceptance, **common)  # fmt: skip

    @property
    def batch_drafter(self) -> Drafter:
        """The drafter the run decodes with: at batch_size > 1 a DraftSwitch's calibrated best candidate (the
        online choice of the draft is a single-sequence rule), else the run's drafter."""
        if self.plan.batch_size > 1 and isinstance(self.drafter, DraftSwitch):
            return self.drafter.candidates[self.drafter.default]
        return self.drafter


def run_rule(plan: Plan, pair: Pair, drafter: Drafter) -> Rule | None:
    """k=auto: one rule for the whole run, so that what it measured on earlier prompts (pass times, draft times,
    acceptance) prices the next prompt's rounds instead of a warm-up at k_max on every prompt: a calibrated
    pair's online choice (online_rule), else the factory's rule for the drafter (a CostModel pricing passes over
    the batch's rows, a TreeCostModel for trees). It still reads only finished rounds, so every output stays
    exact. None for a fixed k."""
    if plan.k != AUTO:
        return None
    online = online_rule(plan, pair) if plan.batch_size == 1 else None
    return online or rule_for(AUTO, drafter, k_max=plan.k_max, trees=plan.trees, max_nodes=plan.max_nodes,
                              rows=plan.batch_size, target=pair.target)  # fmt: skip


def setup_of(cfg: DictConfig, pairs: Pairs, plan: Plan | None = None) -> Setup:
    """Validate cfg, resolve its settings (or take them: plan), and build (or reuse) its pair and drafter."""
    plan = plan or plan_of(cfg)
    if isinstance(plan.threads, int):  # auto: measured once the target is loaded (experiments.run.pair)
        torch.set_num_threads(plan.threads)
    pair = pairs.get(cfg, plan)
    drafter = tree_drafter(cfg, pair, plan.max_nodes) if plan.trees else pair.drafter
    setup = Setup(plan, pair, drafter, cfg.hf, acceptance_of(cfg, plan))
    if "speculative" in plan.methods:
        try:  # refuses what cannot draft for a batch, before any prompt runs
            check_rows(setup.batch_drafter, plan.batch_size)
            setup.rule = run_rule(plan, pair, setup.batch_drafter)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"batch_size={plan.batch_size}: {e}" if plan.batch_size > 1 else str(e)) from e
    return setup


TREE_RULE = {TokenLevel: TreeRules, BlockVerification: TraversalVerification}  # a chain's rule -> its tree form


def verification_for(temperature: float) -> AcceptanceRule:
    """verify=auto: block verification when sampling, where it accepts more tokens per pass than the token-level
    rule (docs/performance.md); the token-level rule at temperature 0, where both accept the same tokens. A tree
    takes the tree form of either (TREE_RULE)."""
    return TokenLevel() if temperature == 0 else BlockVerification()


def acceptance_of(cfg: DictConfig, plan: Plan) -> AcceptanceRule:
    """The acceptance rule of cfg.verify; with a tree, a chain's rule in its tree form (verify=token: the
    token-level tree rules; verify=auto when sampling: traversal verification)."""
    acceptance = instantiate(cfg.verify)
    if plan.trees and type(acceptance) in TREE_RULE:
        return TREE_RULE[type(acceptance)]()
    return acceptance


def online_rule(plan: Plan, pair: Pair) -> OnlineDraftChoice | OnlineThreadChoice | None:
    """k=auto with a calibrated pair's candidates (a chain): one rule for the whole run, which chooses the draft
    and k every round, starting from the calibration's measurements (its alphas as priors, prompt lookup's excepted:
    specdec.choose.online.is_lookup; its
    timings as the first samples, replaced as rounds are timed); with threads=auto on the CPU, one such rule per count
    of threads probed at the start and the count chosen every round too (the start's count seeded with the calibration),
    except on a compiled target, whose graphs hold for the count they were built at (a round at another count would
    compile them again); None otherwise (k=auto then prices the one drafter)."""
    switch = pair.drafter
    if plan.trees or plan.k != AUTO or not isinstance(switch, DraftSwitch) or pair.calibration is None:
        return None
    results = [r for r in pair.calibration.results if r.name in switch.candidates]
    priors = {r.name: r.alpha for r in results if not math.isnan(r.alpha) and not is_lookup(switch.candidates[r.name])}
    k_max = compiled_k_max(plan.k_max, pair.target)  # no chain longer than the target's compiled graphs hold
    rule = OnlineDraftChoice(switch, k_max, prior=priors)
    step = pair.calibration.step_ms / 1000
    rule.seed({1: step, **{r.k + 1: r.pass_cost * step for r in results}}, {r.name: r.draft_ms / 1000 for r in results})
    counts = sorted(pair.threads.probe_ms) if pair.threads is not None else []
    if len(counts) < 2 or runs_compiled(pair.target):
        return rule
    start = pair.threads.threads  # the calibration ran at the count threads=auto chose
    rules = {start: rule, **{t: OnlineDraftChoice(switch, k_max, prior=priors) for t in counts if t != start}}
    return OnlineThreadChoice(rules)
