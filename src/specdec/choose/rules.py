"""One factory for what decides each round's draft length: an int, "auto", a rule object or a set of
candidates becomes a rule, with an error naming the fix for anything else.
"""

from __future__ import annotations

from ..draft.switch import DraftSwitch
from .batch_cost import BatchCostModel
from .cost import CostModel, FixedDraftLength, Rule, check_draft_cost
from .online import OnlineDraftChoice
from .tree_cost import TreeCostModel


def draft_rule(k: int | str | Rule | None, k_max: int, drafter: object, trees: bool = False, max_nodes: int = 64,
               batch: bool = False) -> Rule:
    """What decides each round's draft length (a tree's depth and node budget) from the user's k: an int, a
    fixed k; None (trees only), as deep as the drafter likes; "auto", a fresh CostModel (TreeCostModel for
    trees) pricing drafts as the drafter's draft_cost says, or for a DraftSwitch of candidates an
    OnlineDraftChoice (which draft, and how long, every round); an object with choose and observe, used as given.
    batch: several prompts; "auto" is then a BatchCostModel (chains; trees take a fixed depth)."""
    if hasattr(k, "choose") and hasattr(k, "observe"):
        if getattr(k, "trees", trees) != trees:
            wanted = "a TreeCostModel (it prices trees, not chains)" if trees else "a CostModel (it prices chains)"
            raise TypeError(f"{'tree_generate' if trees else 'speculative_generate'} needs {wanted}, got {type(k).__name__}")
        if getattr(k, "draft_cost", None) is not None:
            check_draft_cost(drafter, k.draft_cost)
        if getattr(k, "switch", drafter) is not drafter:
            raise ValueError(f"the {type(k).__name__} selects in another DraftSwitch than the drafter given")
        return k
    if k == "auto" and batch:
        if trees:
            raise ValueError("k='auto' for token trees prices one sequence's trees; for a batch give trees a fixed "
                             "depth (an int k, or None), or use chains with k='auto'")
        return BatchCostModel(k_max, check_draft_cost(drafter))
    if k == "auto" and isinstance(drafter, DraftSwitch) and not trees:
        return OnlineDraftChoice(drafter, k_max)
    if k == "auto":
        model = TreeCostModel if trees else CostModel
        return model(k_max, check_draft_cost(drafter), **({"max_nodes": max_nodes} if trees else {}))
    if k is None and trees:
        return FixedDraftLength(None)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        shapes = "(tree depth per round) must be an int >= 1, 'auto', None" if trees else (
            "(draft tokens per round, gamma) must be an int >= 1, 'auto'")
        raise ValueError(f"k {shapes} or a rule (choose and observe, e.g. a CostModel), got {k!r}")
    return FixedDraftLength(k)


def check_batch_rule(rule: Rule) -> None:
    """A batch needs a rule that prices passes over several rows (or none: a fixed k)."""
    if not isinstance(rule, FixedDraftLength | BatchCostModel):
        raise TypeError(
            f"{type(rule).__name__} chooses k for one sequence; a batch takes a fixed k or k='auto' "
            "(a BatchCostModel, which prices passes over all rows)"
        )
