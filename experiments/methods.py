"""What a run generates with, built from its config once: the settings, the pair, the speculative method's
drafter (the pair's chain drafter, or the tree of cfg.tree); and each method's generation of one prompt."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from specdec import Generation, autoregressive_generate, draft_then_score, speculative_generate, tree_generate
from specdec.decoding import AcceptanceRule
from specdec.drafters import Drafter

from .hf import hf_generate
from .pair import Pair, Pairs, tree_drafter
from .settings import Plan, plan_of


@dataclass
class Setup:
    """A run resolved into objects: its settings, its pair, its speculative drafter and method=hf's options."""

    plan: Plan
    pair: Pair
    drafter: Drafter
    hf: DictConfig
    acceptance: AcceptanceRule  # how the speculative method's chains are verified (conf/verify/)

    def generate(
        self, method: str, ids: torch.Tensor, max_new_tokens: int, seed: int | None = None, stop_at_eos: bool = True
    ) -> Generation:
        """One generation of up to max_new_tokens after ids (1, L), with a fresh generator seeded with seed
        (default: the run's seed); stop_at_eos=False runs to the budget whatever the tokens."""
        plan, pair = self.plan, self.pair
        seed = plan.seed if seed is None else seed
        eos = pair.eos_token_id if stop_at_eos else []
        generator = torch.Generator(device=plan.device).manual_seed(seed)
        common = {"sampling": plan.sampling, "max_new_tokens": max_new_tokens, "eos_token_id": eos or None,
                  "generator": generator}  # fmt: skip
        if method == "autoregressive":
            return autoregressive_generate(pair.target, ids, **common)
        if method == "speculative" and plan.trees:
            return tree_generate(pair.target, self.drafter, ids, k=plan.tree_k, k_max=plan.k_max,
                                 max_nodes=plan.max_nodes, phase_times=True, **common)  # fmt: skip
        if method == "speculative":
            return speculative_generate(pair.target, self.drafter, ids, k=plan.k, k_max=plan.k_max, phase_times=True,
                                        acceptance=self.acceptance, **common)  # fmt: skip
        if method == "hf":
            return hf_generate(pair, ids, self.hf, plan.sampling, max_new_tokens, seed, eos)
        return draft_then_score(
            pair.target, pair.draft_model, ids, draft_tokenizer=pair.draft_tokenizer, target_tokenizer=pair.tokenizer,
            **common,
        )  # fmt: skip


def setup_of(cfg: DictConfig, pairs: Pairs) -> Setup:
    """Validate cfg, resolve its settings, and build (or reuse) its pair and drafter."""
    plan = plan_of(cfg)
    if isinstance(plan.threads, int):  # auto: measured once the target is loaded (experiments.pair)
        torch.set_num_threads(plan.threads)
    pair = pairs.get(cfg, plan)
    drafter = tree_drafter(cfg, pair, plan.max_nodes) if plan.trees else pair.drafter
    return Setup(plan, pair, drafter, cfg.hf, instantiate(cfg.verify))
