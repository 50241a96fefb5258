"""What a run generates with, built from its config once: the settings, the pair, the speculative method's
drafter (the pair's chain drafter, or the tree of cfg.tree); and each method's generation of one prompt."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from specdec import Generation, autoregressive_generate, draft_then_score, speculative_generate, tree_generate
from specdec.auto.setup import Prepared, prepare_decoding, tree_form
from specdec.auto.threads import use_threads
from specdec.hf import HFOptions, hf_generate
from specdec.llamacpp import LlamaCppOptions, llamacpp_generate
from specdec.verify.base import AcceptanceRule

from .pair import Pair, Pairs, tree_drafter
from .schema import AUTO
from .settings import ConfigError, Plan, placement, plan_of


@dataclass
class Setup:
    """A run resolved into objects: its settings, its pair, what the library prepared for decoding, method=hf's
    options."""

    plan: Plan
    pair: Pair
    prepared: Prepared
    hf: HFOptions
    llamacpp: LlamaCppOptions

    drafter = property(lambda self: self.prepared.drafter)  # the speculative drafter: the pair's, or cfg.tree's
    acceptance = property(lambda self: self.prepared.acceptance)  # how chains or trees are verified (conf/verify/)

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
            return hf_generate(pair.target, ids, sampling=plan.sampling, max_new_tokens=max_new_tokens, seed=seed,
                               eos_token_id=eos, options=self.hf, draft=pair.draft_model, tokenizer=pair.tokenizer,
                               draft_tokenizer=pair.draft_tokenizer)  # fmt: skip
        if method == "llamacpp":  # the same prompt tokens, on llama.cpp's conversion of the target's own weights
            return llamacpp_generate(pair.target.name_or_path, ids, sampling=plan.sampling, seed=seed,
                                     max_new_tokens=max_new_tokens, options=self.llamacpp, stop_at_eos=stop_at_eos)
        return draft_then_score(pair.target, pair.draft_model, prompts, draft_tokenizer=pair.draft_tokenizer,
                                target_tokenizer=pair.tokenizer, **common)  # fmt: skip

    def speculative(self, prompts: torch.Tensor | list[torch.Tensor], common: dict) -> Generation:
        """Speculative decoding of one prompt or a batch, chains or trees, with the run's rule or fixed k."""
        plan, prepared = self.plan, self.prepared
        if plan.trees:
            return tree_generate(self.pair.target, prepared.batch_drafter, prompts, k=prepared.rule or plan.tree_k,
                                 max_nodes=plan.max_nodes, phase_times=True, acceptance=prepared.acceptance,
                                 **common)  # fmt: skip
        return speculative_generate(self.pair.target, prepared.batch_drafter, prompts, k=prepared.rule or plan.k,
                                    phase_times=True, acceptance=prepared.acceptance, **common)  # fmt: skip


def setup_of(cfg: DictConfig, pairs: Pairs, plan: Plan | None = None) -> Setup:
    """Validate cfg, resolve its settings (or take them: plan), build (or reuse) its pair, and let the library prepare
    decoding (specdec.auto.setup.prepare_decoding: the tree drafter on its runtime, the acceptance rule, k=auto's
    rule)."""
    plan = plan or plan_of(cfg)
    if isinstance(plan.threads, int):  # auto: measured once the target is loaded (experiments.run.pair)
        use_threads(plan.threads)
    pair = pairs.get(cfg, plan)
    tree = tree_drafter(cfg, pair, plan.max_nodes) if plan.trees else None
    try:  # refuses what cannot draft for a batch, before any prompt runs
        prepared = prepare_decoding(
            pair.target, pair.drafts, k=None if plan.k == AUTO else plan.k, k_max=plan.k_max,
            sampling=plan.sampling, acceptance=acceptance_of(cfg, plan), tree=tree, max_nodes=plan.max_nodes,
            batch_size=plan.batch_size, threads=pair.threads, speculative="speculative" in plan.methods,
            **placement(cfg),
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise ConfigError(f"batch_size={plan.batch_size}: {e}" if plan.batch_size > 1 else str(e)) from e
    return Setup(plan, pair, prepared, HFOptions(**cfg.hf), LlamaCppOptions(**cfg.llamacpp))


def acceptance_of(cfg: DictConfig, plan: Plan) -> AcceptanceRule:
    """The acceptance rule of cfg.verify; with a tree, a chain's rule in its tree form (specdec.auto.setup.tree_form)."""
    acceptance = instantiate(cfg.verify)
    return tree_form(acceptance) if plan.trees else acceptance
