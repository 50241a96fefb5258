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

__all__ = [
    "GREEDY",
    "CostModel",
    "Draft",
    "Drafter",
    "Generation",
    "ModelDrafter",
    "NGramDrafter",
    "Sampling",
    "Stats",
    "accepted_length_distribution",
    "autoregressive_generate",
    "draft_then_score",
    "expected_tokens_per_pass",
    "optimal_k",
    "probabilities",
    "speculative_generate",
    "walltime_improvement",
]
