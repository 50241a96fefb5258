"""Exact oracles for tests and notebooks: output distributions of tiny models and toy pairs, by enumeration."""

from .chains import (
    fixed_round,
    histogram,
    sequence_distribution,
    sequence_index,
    target_sequence_distribution,
    total_variation,
)
from .traversal import (
    expected_accepted_traversal,
    traversal_outcomes,
    traversal_round,
    traversal_round_distribution,
)
from .trees import (
    Branching,
    Conditional,
    children_draws,
    drafted_trees,
    expected_accepted_tree_rules,
    top_ranked,
    toy_pair,
    toy_tree,
    tree_round,
    tree_round_distribution,
    wrong_iid_rule_with_original_q,
)

__all__ = [
    "Branching",
    "Conditional",
    "children_draws",
    "drafted_trees",
    "expected_accepted_traversal",
    "expected_accepted_tree_rules",
    "fixed_round",
    "histogram",
    "sequence_distribution",
    "sequence_index",
    "target_sequence_distribution",
    "top_ranked",
    "total_variation",
    "toy_pair",
    "toy_tree",
    "traversal_outcomes",
    "traversal_round",
    "traversal_round_distribution",
    "tree_round",
    "tree_round_distribution",
    "wrong_iid_rule_with_original_q",
]
