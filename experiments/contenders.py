"""Decoding methods side by side: ours and Hugging Face's, each a contender with the same call shape.

A contender turns (setting, input_ids (1, L), max_new_tokens, seed) into the new tokens and, for our
loops, the Stats summary. Register a new method with one line in CONTENDERS:

    CONTENDERS["spec_model_k8"] = Contender(speculative(model_draft, k=lambda s: 8), "ours", "model")

Each contender names whose loop it is ("ours", "hf") and what drafts ("model", "ngram", "hybrid" or
None), so the benchmark can pick our best n-gram configuration, our best configuration with the draft
model, and so on, without a list of names to keep in step.

The greedy check (every contender emits the reference's tokens) lives here too; the schedule and the
timers that run the contenders live in experiments.schedule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from transformers import GenerationConfig, PreTrainedModel

from specdec import (
    GREEDY,
    Drafter,
    Generation,
    HybridTreeDrafter,
    ModelDrafter,
    ModelTreeDrafter,
    NGramDrafter,
    NGramTreeDrafter,
    Sampling,
    TreeDrafter,
    autoregressive_generate,
    speculative_generate,
    tree_generate,
)

HF_PROMPT_LOOKUP_TOKENS = 10  # Hugging Face's documented example value; prompt lookup has no built-in default
HF_LOOKUP_FIXED_K = (2, 8)  # prompt lookup at more fixed k (hf_lookup: the setting's k), for HF's best fixed k
Owner = Literal["ours", "hf"]
Source = Literal["model", "ngram", "hybrid"]


@dataclass
class Setting:
    """What every contender gets: the models, k, sampling and the stop tokens (same for all contenders)."""

    target: PreTrainedModel
    draft: PreTrainedModel | None  # None when no contender that runs needs a draft model
    k: int = 4  # fixed draft length (gamma) of the chain contenders, ours and Hugging Face's
    sampling: Sampling = GREEDY
    eos: int | list[int] | None = None
    max_ngram: int = 3  # our n-gram drafter: longest and shortest suffix matched
    min_ngram: int = 1
    k_max: int = 8  # k="auto": longest draft the cost model may choose
    nodes: int = 4  # tree node budget; a tree pass is nodes + 1 tokens wide, as a chain of k = nodes
    branches: tuple[int, ...] = (2,)  # model trees: children per node at the first depths (top-b)
    auto_nodes: int = 16  # k="auto" trees: the drafter's tree and the pass limit (the cost model cuts it)


@dataclass
class Output:
    tokens: torch.Tensor  # (n,) new tokens
    stats: dict | None = None  # our Stats summary; None for Hugging Face's loops


@dataclass(frozen=True)
class Contender:
    generate: Callable[
        [Setting, torch.Tensor, int, int], Output
    ]  # (setting, ids (1, L), max_new_tokens, seed)
    owner: Owner = "ours"
    drafts: Source | None = None  # None: no speculation (target only)

    @property
    def needs_draft(self) -> bool:
        return self.drafts in ("model", "hybrid")


# ---------------------------------------------------------------------------- ours


def ours(s: Setting, seed: int, loop: Callable[..., Generation]) -> Output:
    """One of our loops, given the common arguments and a fresh generator seeded with seed.

    The Stats summary gains the per-round lists as totals: chosen draft lengths (k="auto") and tree sizes.
    """
    generator = torch.Generator(device=s.target.device).manual_seed(seed)
    g = loop(sampling=s.sampling, eos_token_id=s.eos, generator=generator)
    summary = g.stats.summary()
    summary.update(
        chosen_k_histogram=g.stats.chosen_k_histogram,
        tree_rounds=len(g.stats.tree_nodes),
        tree_nodes_sum=sum(g.stats.tree_nodes),
        tree_depth_sum=sum(g.stats.tree_depths),
    )
    return Output(g.tokens, summary)


def target_only(s: Setting, ids: torch.Tensor, n: int, seed: int) -> Output:
    return ours(s, seed, lambda **kw: autoregressive_generate(s.target, ids, max_new_tokens=n, **kw))


def speculative(
    drafter_of: Callable[[Setting], Drafter], k: Callable[[Setting], int | str] = lambda s: s.k
) -> Callable[[Setting, torch.Tensor, int, int], Output]:
    """Our speculative loop with the drafter drafter_of(setting) and k(setting): an int or "auto" (k_max)."""

    def generate(s: Setting, ids: torch.Tensor, n: int, seed: int) -> Output:
        return ours(
            s,
            seed,
            lambda **kw: speculative_generate(
                s.target, drafter_of(s), ids, k=k(s), k_max=s.k_max, max_new_tokens=n, **kw
            ),
        )

    return generate


def tree(
    drafter_of: Callable[[Setting], TreeDrafter], auto: bool = False
) -> Callable[[Setting, torch.Tensor, int, int], Output]:
    """Our token-tree loop with the tree drafter drafter_of(setting): one target pass per tree; with auto,
    k="auto": each round the cost model picks a depth <= k_max and cuts the tree to <= auto_nodes nodes."""

    def generate(s: Setting, ids: torch.Tensor, n: int, seed: int) -> Output:
        shape = {"k": "auto", "k_max": s.k_max, "max_nodes": s.auto_nodes} if auto else {}
        return ours(
            s, seed, lambda **kw: tree_generate(s.target, drafter_of(s), ids, max_new_tokens=n, **shape, **kw)
        )

    return generate


def model_draft(s: Setting, reads_target_cache: bool = False) -> ModelDrafter:
    """The draft model; reads_target_cache: reading the target's KV cache (a copy of the target; otherwise it
    keeps its own)."""
    return ModelDrafter(s.draft, reads_target_cache=reads_target_cache)


def ngram_draft(s: Setting) -> NGramDrafter:
    return NGramDrafter(max_ngram=s.max_ngram, min_ngram=s.min_ngram)


def ngram_tree(s: Setting) -> NGramTreeDrafter:
    """A trie of n-gram matches with s.nodes nodes, as deep as a chain of the same width."""
    return NGramTreeDrafter(max_ngram=s.max_ngram, min_ngram=s.min_ngram, depth=s.nodes, nodes=s.nodes)


def model_tree(s: Setting) -> ModelTreeDrafter:
    """Top-b children at the first depths, then the most likely branch as a chain, s.nodes nodes in all."""
    depth = max(1, s.nodes - sum(s.branches) + len(s.branches))  # the chain fills the rest of the budget
    return ModelTreeDrafter(s.draft, branches=s.branches, depth=depth, nodes=s.nodes, children="top")


def ngram_tree_auto(s: Setting) -> NGramTreeDrafter:
    return NGramTreeDrafter(max_ngram=s.max_ngram, min_ngram=s.min_ngram, depth=s.k_max, nodes=s.auto_nodes)


def model_tree_auto(s: Setting, reads_target_cache: bool = False) -> ModelTreeDrafter:
    return ModelTreeDrafter(
        s.draft, branches=s.branches, depth=s.k_max, nodes=s.auto_nodes, children="top",
        reads_target_cache=reads_target_cache,
    )  # fmt: skip


def hybrid_tree(s: Setting) -> HybridTreeDrafter:
    """The n-gram trie and the model tree under one root (2 * s.nodes nodes)."""
    return HybridTreeDrafter(ngram_tree(s), model_tree(s))


# ---------------------------------------------------------------------------- Hugging Face


def hf_config(s: Setting, max_new_tokens: int) -> GenerationConfig:
    """A generation config that states everything, so model defaults cannot differ between contenders."""
    eos = s.eos[0] if isinstance(s.eos, list) and s.eos else s.eos
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        do_sample=not s.sampling.greedy,
        eos_token_id=s.eos if s.eos != [] else None,
        pad_token_id=eos if eos is not None else s.target.config.pad_token_id or 0,
    )
    if not s.sampling.greedy:
        config.update(
            temperature=s.sampling.temperature, top_k=s.sampling.top_k or None, top_p=s.sampling.top_p
        )
    else:
        config.update(temperature=None, top_k=None, top_p=None)
    return config


def fix_assistant_k(draft: PreTrainedModel, k: int | None) -> None:
    """HF reads the schedule from the assistant's own generation config.

    k: constant k, no confidence early stop. None: HF's defaults (20 tokens, stopped early by a
    confidence threshold that adapts during generation).
    """
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant" if k else None
    draft.generation_config.assistant_confidence_threshold = 0.0 if k else None


def hf(assisted_k: Callable[[Setting], int | None] | None = None, **options):
    """HF generate; with assisted_k, assisted generation with the draft and that k (None: HF's defaults)."""

    def generate(s: Setting, ids: torch.Tensor, n: int, seed: int) -> Output:
        torch.manual_seed(seed)
        config = hf_config(s, n)
        config.update(**{key: value(s) if callable(value) else value for key, value in options.items()})
        assistant = None
        if assisted_k is not None:
            assistant = s.draft
            fix_assistant_k(assistant, assisted_k(s))
        with torch.inference_mode():
            out = s.target.generate(
                ids, attention_mask=torch.ones_like(ids), assistant_model=assistant, generation_config=config
            )
        return Output(out[0, ids.shape[-1] :])

    return generate


CONTENDERS: dict[str, Contender] = {
    "ar": Contender(target_only),
    "hf_plain": Contender(hf(), "hf"),
    # the draft model: chains at k, at k="auto" and at the width of a tree; a top-b tree
    "spec_model": Contender(speculative(model_draft), "ours", "model"),
    "spec_model_auto": Contender(speculative(model_draft, k=lambda s: "auto"), "ours", "model"),
    "spec_model_shared": Contender(speculative(partial(model_draft, reads_target_cache=True)), "ours", "model"),
    "spec_model_shared_auto": Contender(
        speculative(partial(model_draft, reads_target_cache=True), k=lambda s: "auto"), "ours", "model"
    ),
    "spec_model_wide": Contender(speculative(model_draft, k=lambda s: s.nodes), "ours", "model"),
    "tree_model": Contender(tree(model_tree), "ours", "model"),
    "tree_model_auto": Contender(tree(model_tree_auto, auto=True), "ours", "model"),
    "tree_model_shared_auto": Contender(
        tree(partial(model_tree_auto, reads_target_cache=True), auto=True), "ours", "model"
    ),
    "hf_assisted": Contender(hf(assisted_k=lambda s: s.k), "hf", "model"),
    "hf_assisted_default": Contender(hf(assisted_k=lambda s: None), "hf", "model"),
    # n-gram lookup: the same four shapes, and Hugging Face prompt lookup at its defaults and fixed k
    "spec_ngram": Contender(speculative(ngram_draft), "ours", "ngram"),
    "spec_ngram_auto": Contender(speculative(ngram_draft, k=lambda s: "auto"), "ours", "ngram"),
    "spec_ngram_wide": Contender(speculative(ngram_draft, k=lambda s: s.nodes), "ours", "ngram"),
    "tree_ngram": Contender(tree(ngram_tree), "ours", "ngram"),
    "tree_ngram_auto": Contender(tree(ngram_tree_auto, auto=True), "ours", "ngram"),
    "hf_lookup": Contender(hf(prompt_lookup_num_tokens=lambda s: s.k), "hf", "ngram"),
    "hf_lookup_default": Contender(hf(prompt_lookup_num_tokens=HF_PROMPT_LOOKUP_TOKENS), "hf", "ngram"),
    **{
        f"hf_lookup_k{k}": Contender(hf(prompt_lookup_num_tokens=k), "hf", "ngram")
        for k in HF_LOOKUP_FIXED_K
    },
    # both under one root
    "tree_hybrid": Contender(tree(hybrid_tree), "ours", "hybrid"),
}
# chain vs tree at the same pass width (nodes + 1 tokens), per drafter: (chain with k = nodes, chain with the
# setting's k, which has that width when k = nodes, tree)
EQUAL_WIDTH = {
    "ngram": ("spec_ngram_wide", "spec_ngram", "tree_ngram"),
    "model": ("spec_model_wide", "spec_model", "tree_model"),
}


def bind(name: str, setting: Setting) -> Callable[[torch.Tensor, int, int], Output]:
    """The contender as fn(ids, max_new_tokens, seed)."""
    contender = CONTENDERS[name]
    if contender.needs_draft and setting.draft is None:
        raise ValueError(f"contender {name!r} needs a draft model; the setting has none")
    return lambda ids, n, seed: contender.generate(setting, ids, n, seed)


# ---------------------------------------------------------------------------- greedy check


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (length mismatch counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_identical(outputs: dict[str, dict[str, list[int]]], reference: str = "ar") -> dict:
    """Greedy decoding is deterministic and lossless: every contender must emit the reference's tokens."""
    mismatches = []
    for name, per_input in outputs.items():
        for key, tokens in per_input.items():
            at = first_difference(tokens, outputs[reference][key])
            if at is not None:
                mismatches.append({"contender": name, "prompt": key, "first_difference": at})
    return {"identical": not mismatches, "reference": reference, "mismatches": mismatches}
