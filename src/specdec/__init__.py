"""specdec: speculative sampling (Leviathan et al. 2023) next to the article's draft-then-score."""

from .autoregressive import autoregressive_generate
from .batch import BatchCostModel, BatchGeneration
from .cost import CostModel, FixedDraftLength
from .cross_vocab import StringDrafter, TokenIntersectionDrafter
from .decoding import decode, speculative_generate, tree_generate
from .drafters import Drafter, ModelDrafter, NGramDrafter
from .metrics import (
    Generation,
    Stats,
    accepted_length_distribution,
    expected_tokens,
    expected_tokens_per_pass,
    optimal_k,
    walltime_improvement,
)
from .naive import batched_draft_then_score, draft_then_score
from .online import DraftSwitch, OnlineDraftChoice, OnlineThreadChoice
from .sampling import GREEDY, Sampling, probabilities
from .speculative import BlockVerification, Draft, TokenLevel
from .traversal import TraversalVerification
from .tree import TreeDraft
from .tree_accept import TreeRules
from .tree_cost import TreeCostModel
from .tree_drafters import ChainTreeDrafter, HybridTreeDrafter, ModelTreeDrafter, NGramTreeDrafter

__all__ = [
    "GREEDY",
    "BatchCostModel",
    "BatchGeneration",
    "BlockVerification",
    "ChainTreeDrafter",
    "CostModel",
    "Draft",
    "DraftSwitch",
    "Drafter",
    "FixedDraftLength",
    "Generation",
    "HybridTreeDrafter",
    "ModelDrafter",
    "ModelTreeDrafter",
    "NGramDrafter",
    "NGramTreeDrafter",
    "OnlineDraftChoice",
    "OnlineThreadChoice",
    "Sampling",
    "Stats",
    "StringDrafter",
    "TokenIntersectionDrafter",
    "TokenLevel",
    "TraversalVerification",
    "TreeCostModel",
    "TreeDraft",
    "TreeRules",
    "accepted_length_distribution",
    "autoregressive_generate",
    "batched_draft_then_score",
    "decode",
    "draft_then_score",
    "expected_tokens",
    "expected_tokens_per_pass",
    "optimal_k",
    "probabilities",
    "speculative_generate",
    "tree_generate",
    "walltime_improvement",
]
