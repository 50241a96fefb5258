"""specdec: speculative sampling (Leviathan et al. 2023) next to the article's draft-then-score."""

from .autoregressive import autoregressive_generate
from .cost import CostModel
from .drafters import Draft, Drafter, ModelDrafter, NGramDrafter
from .metrics import (
    Generation,
    Stats,
    accepted_length_distribution,
    expected_tokens_per_pass,
    optimal_k,
    walltime_improvement,
)
from .naive import draft_then_score
from .sampling import GREEDY, Sampling, probabilities
from .speculative import speculative_generate
from .tree import TreeDraft, TreeDrafter, tree_generate
from .tree_drafters import ChainTreeDrafter, HybridTreeDrafter, ModelTreeDrafter, NGramTreeDrafter

__all__ = [
    "GREEDY",
    "ChainTreeDrafter",
    "CostModel",
    "Draft",
    "Drafter",
    "Generation",
    "HybridTreeDrafter",
    "ModelDrafter",
    "ModelTreeDrafter",
    "NGramDrafter",
    "NGramTreeDrafter",
    "Sampling",
    "Stats",
    "TreeDraft",
    "TreeDrafter",
    "accepted_length_distribution",
    "autoregressive_generate",
    "draft_then_score",
    "expected_tokens_per_pass",
    "optimal_k",
    "probabilities",
    "speculative_generate",
    "tree_generate",
    "walltime_improvement",
]
