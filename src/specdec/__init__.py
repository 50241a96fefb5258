"""specdec: speculative sampling (Leviathan et al. 2023) next to the article's draft-then-score."""

from .auto import Prepared, RuntimeOptions, prepare
from .autoregressive import autoregressive_generate
from .choose.cost import CostModel, FixedDraftLength
from .choose.online import OnlineDraftChoice
from .choose.threads import OnlineThreadChoice
from .choose.tree_cost import TreeCostModel
from .decoding import decode, speculative_generate, tree_generate
from .draft.base import ChainTreeDrafter, Drafter
from .draft.cross_vocab import StringDrafter, TokenIntersectionDrafter
from .draft.model import HybridTreeDrafter, ModelDrafter, ModelTreeDrafter
from .draft.ngram import NGramDrafter, NGramTreeDrafter
from .draft.proposal import Draft
from .draft.switch import DraftSwitch
from .draft.tree import TreeDraft
from .hf import HFOptions, hf_generate
from .metrics import Generation, Stats
from .naive import batched_draft_then_score, draft_then_score
from .sampling import GREEDY, Sampling, probabilities
from .theory import (
    accepted_length_distribution,
    expected_tokens,
    expected_tokens_per_pass,
    optimal_k,
    walltime_improvement,
)
from .verify.block import BlockVerification
from .verify.token import TokenLevel
from .verify.traversal import TraversalVerification
from .verify.tree import TreeRules

__all__ = [
    "GREEDY",
    "BlockVerification",
    "ChainTreeDrafter",
    "CostModel",
    "Draft",
    "DraftSwitch",
    "Drafter",
    "FixedDraftLength",
    "Generation",
    "HFOptions",
    "HybridTreeDrafter",
    "ModelDrafter",
    "ModelTreeDrafter",
    "NGramDrafter",
    "NGramTreeDrafter",
    "OnlineDraftChoice",
    "OnlineThreadChoice",
    "Prepared",
    "RuntimeOptions",
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
    "hf_generate",
    "optimal_k",
    "prepare",
    "probabilities",
    "speculative_generate",
    "tree_generate",
    "walltime_improvement",
]
