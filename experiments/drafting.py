"""What a run drafts with each round, from the config: a chain of k tokens or a token tree, and its drafter."""

from __future__ import annotations

from omegaconf import DictConfig

from specdec import HybridTreeDrafter, ModelTreeDrafter, NGramTreeDrafter, TreeDrafter

from .pair import Pair
from .schema import AUTO, TreeKind
from .settings import ConfigError


def ngram_tree(tree: DictConfig, pair: Pair) -> NGramTreeDrafter:
    return NGramTreeDrafter(
        tree.max_ngram, tree.min_ngram, matches=tree.matches, depth=tree.depth, nodes=tree.nodes
    )


def model_tree(tree: DictConfig, pair: Pair) -> ModelTreeDrafter:
    """The pair's draft model branching (settings.check_tree refuses n-gram pairs before loading)."""
    if pair.draft_model is None:
        raise ConfigError(f"tree={tree.kind} needs a draft model, but this pair loaded none: use tree=ngram")
    return ModelTreeDrafter(
        pair.draft_model, tuple(tree.branches), depth=tree.depth, nodes=tree.nodes, children=tree.children,
        reads_target_cache=getattr(pair.drafter, "reads_target_cache", False),  # as the pair's chain drafter
    )  # fmt: skip


def hybrid_tree(tree: DictConfig, pair: Pair) -> HybridTreeDrafter:
    return HybridTreeDrafter(ngram_tree(tree, pair), model_tree(tree, pair))


TREE_DRAFTERS = {TreeKind.NGRAM: ngram_tree, TreeKind.MODEL: model_tree, TreeKind.HYBRID: hybrid_tree}


def tree_drafter(tree: DictConfig, pair: Pair) -> TreeDrafter:
    """A fresh tree drafter of the kind tree.kind names (not none), built from the pair's draft model."""
    return TREE_DRAFTERS[TreeKind(tree.kind)](tree, pair)


def uses_tree(cfg: DictConfig) -> bool:
    return cfg.tree.kind != TreeKind.NONE


def chain_k(cfg: DictConfig) -> int | None:
    """The fixed draft length of a chain (what Thm 3.8 is checked at); None for k=auto and trees."""
    return None if uses_tree(cfg) or cfg.k == AUTO else cfg.k


def longest_draft(cfg: DictConfig) -> int:
    """The longest draft a round may verify: k_max for k=auto, else the tree's depth or k."""
    return cfg.k_max if cfg.k == AUTO else cfg.tree.depth if uses_tree(cfg) else cfg.k


def tree_depth_rule(cfg: DictConfig) -> int | str:
    """tree_generate's k: "auto" (depth <= k_max and node budget <= tree.max_nodes chosen each round by a
    cost model), else the tree's own depth (an integer k sets chains only)."""
    return AUTO if cfg.k == AUTO else cfg.tree.depth
