"""What a run generates with, built from its config once: the settings, the pair, the speculative method's
drafter (the pair's chain drafter, or the tree of cfg.tree); and each method's generation of one prompt."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from specdec import (
    BatchCostModel,
    BatchGeneration,
    BlockVerification,
    Generation,
    TokenLevel,
    TraversalVerification,
    TreeRules,
    autoregressive_generate,
    batched_draft_then_score,
    draft_then_score,
    speculative_generate,
    tree_generate,
)
from specdec.choose.cost import Rule
from specdec.choose.online import OnlineDraftChoice, OnlineThreadChoice
from specdec.choose.rules import draft_rule
from specdec.decoding import AcceptanceRule
from specdec.draft.base import Drafter
from specdec.draft.batch import batch_drafter
from specdec.draft.switch import DraftSwitch

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
    rule: OnlineDraftChoice | OnlineThreadChoice | None = None  # k=auto over a calibrated pair's candidates (and
    # threads=auto: the thread count too), one rule across the run's prompts
    _batch_rule: BatchCostModel | None = None  # k=auto for batches (batch_rule)
    _run_rule: Rule | None = None  # k=auto with one drafter (run_rule)

    def generate(
        self, method: str, ids: torch.Tensor | list[torch.Tensor], max_new_tokens: int, seed: int | None = None,
        stop_at_eos: bool = True,
    ) -> Generation | BatchGeneration:
        """One generation of up to max_new_tokens after ids (1, L), with a fresh generator seeded with seed
        (default: the run's seed); stop_at_eos=False runs to the budget whatever the tokens. A list of prompts
        (1, L_b) is one batch (specdec.state): every method then decodes all of them together."""
        if isinstance(ids, list):
            return self.generate_batch(method, ids, max_new_tokens, seed, stop_at_eos)
        plan, pair = self.plan, self.pair
        seed = plan.seed if seed is None else seed
        eos = pair.eos_token_id if stop_at_eos else []
        generator = torch.Generator(device=plan.device).manual_seed(seed)
        common = {"sampling": plan.sampling, "max_new_tokens": max_new_tokens, "eos_token_id": eos or None,
                  "generator": generator}  # fmt: skip
        if method == "autoregressive":
            return autoregressive_generate(pair.target, ids, **common)
        if method == "speculative" and plan.trees:
            return tree_generate(pair.target, self.drafter, ids, k=self.run_rule or plan.tree_k, k_max=plan.k_max,
                                 max_nodes=plan.max_nodes, phase_times=True, acceptance=self.acceptance,
                                 **common)  # fmt: skip
        if method == "speculative":
            threads = torch.get_num_threads()
            try:  # an OnlineThreadChoice sets the count each round; the other methods keep the run's
                return speculative_generate(pair.target, self.drafter, ids, k=self.rule or self.run_rule or plan.k,
                                            k_max=plan.k_max, phase_times=True, acceptance=self.acceptance,
                                            **common)  # fmt: skip
            finally:
                torch.set_num_threads(threads)
        if method == "hf":
            return hf_generate(pair, ids, self.hf, plan.sampling, max_new_tokens, seed, eos)
        return draft_then_score(
            pair.target, pair.draft_model, ids, draft_tokenizer=pair.draft_tokenizer, target_tokenizer=pair.tokenizer,
            **common,
        )  # fmt: skip

    def generate_batch(
        self, method: str, prompts: list[torch.Tensor], max_new_tokens: int, seed: int | None, stop_at_eos: bool
    ) -> BatchGeneration:
        """One batch of prompts (1, L_b) decoded together by `method`, every row to its own end."""
        plan, pair = self.plan, self.pair
        seed = plan.seed if seed is None else seed
        eos = pair.eos_token_id if stop_at_eos else []
        generator = torch.Generator(device=plan.device).manual_seed(seed)
        rows = [p[0] for p in prompts]
        common = {"sampling": plan.sampling, "max_new_tokens": max_new_tokens, "eos_token_id": eos or None,
                  "generator": generator}  # fmt: skip
        if method == "autoregressive":
            return autoregressive_generate(pair.target, rows, **common)
        if method == "speculative" and plan.trees:
            return tree_generate(pair.target, self.batch_drafter, rows, k=plan.tree_k, k_max=plan.k_max,
                                 max_nodes=plan.max_nodes, phase_times=True, acceptance=self.acceptance,
                                 **common)  # fmt: skip
        if method == "speculative":
            return speculative_generate(pair.target, self.batch_drafter, rows, k=self.batch_rule or plan.k,
                                        k_max=plan.k_max, phase_times=True, acceptance=self.acceptance,
                                        **common)  # fmt: skip
        if method == "hf":
            return hf_generate_batch(pair, prompts, self.hf, plan.sampling, max_new_tokens, seed, eos)
        return batched_draft_then_score(pair.target, pair.draft_model, rows, **common)

    @property
    def run_rule(self) -> Rule | None:
        """k=auto with one drafter: one cost model (a TreeCostModel for trees) for the whole run, so that what
        it measured on earlier prompts (pass times, draft times, acceptance) prices the next prompt's rounds
        instead of a warm-up at k_max on every prompt; None for a fixed k and for a calibrated pair's
        candidates (whose OnlineDraftChoice, `rule`, already spans the run). It still reads only finished
        rounds, so every output stays exact."""
        if self.plan.k != AUTO or self.rule is not None or isinstance(self.drafter, DraftSwitch):
            return None
        if self._run_rule is None:
            self._run_rule = draft_rule(AUTO, self.plan.k_max, self.drafter, trees=self.plan.trees,
                                        max_nodes=self.plan.max_nodes)  # fmt: skip
        return self._run_rule

    @property
    def batch_rule(self) -> BatchCostModel | None:
        """k=auto for batches of chains: one BatchCostModel for the whole run, so that its timings (keyed by
        the pass's total tokens and the batch's rows) carry from batch to batch; None for a fixed k."""
        if self.plan.k != AUTO or self.plan.trees:
            return None
        if self._batch_rule is None:
            self._batch_rule = BatchCostModel(self.plan.k_max, self.batch_drafter.draft_cost)
        return self._batch_rule

    @property
    def batch_drafter(self) -> Drafter:
        """The drafter a batch drafts with: a DraftSwitch's calibrated best candidate (the online choice of the
        draft is a single-sequence rule), else the run's drafter."""
        if isinstance(self.drafter, DraftSwitch):
            return self.drafter.candidates[self.drafter.default]
        return self.drafter


def setup_of(cfg: DictConfig, pairs: Pairs) -> Setup:
    """Validate cfg, resolve its settings, and build (or reuse) its pair and drafter."""
    plan = plan_of(cfg)
    if isinstance(plan.threads, int):  # auto: measured once the target is loaded (experiments.run.pair)
        torch.set_num_threads(plan.threads)
    pair = pairs.get(cfg, plan)
    drafter = tree_drafter(cfg, pair, plan.max_nodes) if plan.trees else pair.drafter
    setup = Setup(plan, pair, drafter, cfg.hf, acceptance_of(cfg, plan), online_rule(plan, pair))
    if plan.batch_size > 1 and "speculative" in plan.methods:
        try:
            batch_drafter(setup.batch_drafter)  # refuses what cannot draft for a batch, before any prompt runs
        except ValueError as e:
            raise ConfigError(f"batch_size={plan.batch_size}: {e}") from e
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
    and k every round, starting from the calibration's measurements (its alphas as priors, its timings as the
    first samples, replaced as rounds are timed); with threads=auto on the CPU, one such rule per thread count
    probed at the start and the count chosen every round too (the start's count seeded with the calibration);
    None otherwise (k=auto then prices the one drafter)."""
    switch = pair.drafter
    if plan.trees or plan.k != AUTO or not isinstance(switch, DraftSwitch) or pair.calibration is None:
        return None
    results = [r for r in pair.calibration.results if r.name in switch.candidates]
    priors = {r.name: r.alpha for r in results if not math.isnan(r.alpha)}
    rule = OnlineDraftChoice(switch, plan.k_max, prior=priors)
    step = pair.calibration.step_ms / 1000
    rule.seed({1: step, **{r.k + 1: r.pass_cost * step for r in results}}, {r.name: r.draft_ms / 1000 for r in results})
    counts = sorted(pair.threads.probe_ms) if pair.threads is not None else []
    if len(counts) < 2:
        return rule
    start = pair.threads.threads  # the calibration ran at the count threads=auto chose
    rules = {start: rule, **{t: OnlineDraftChoice(switch, plan.k_max, prior=priors) for t in counts if t != start}}
    return OnlineThreadChoice(rules)
