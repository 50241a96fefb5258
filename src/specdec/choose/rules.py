"""One factory for what decides each round's draft length: an int, "auto", a rule object or a set of candidates
(a DraftSwitch drafter with k="auto") becomes a rule, with an error naming the fix for anything else.

Rules decide and the loop applies: a rule returns a Choice (k, a tree's node budget, the candidate that drafts,
the thread count) from earlier rounds only, and specdec.decoding puts it into effect.
"""

from __future__ import annotations

from ..draft.switch import DraftSwitch
from .cost import CostModel, FixedDraftLength, Rule, check_draft_cost
from .online import OnlineDraftChoice
from .threads import OnlineThreadChoice
from .tree_cost import TreeCostModel

K_MAX = 8  # the longest draft k="auto" may choose when the caller does not say


def rule_for(k: int | str | Rule | None, drafter: object, *, k_max: int | None = None, trees: bool = False,
             max_nodes: int = 64, rows: int = 1, target: object = None) -> Rule:
    """What decides each round's draft length (a tree's depth and node budget) from the user's k: an int, a fixed
    k; None (trees only), as deep as the drafter likes; "auto", a fresh CostModel (TreeCostModel for trees)
    pricing drafts as the drafter's draft_cost says, or for a DraftSwitch of candidates an OnlineDraftChoice
    (which draft, and how long, every round); an object with choose and observe, used as given. k_max: the
    longest draft "auto" may choose (default 8; on a compiled `target`, at most what its graphs hold: compiled_k_max);
    rows: prompts decoded together."""
    if hasattr(k, "choose") and hasattr(k, "observe"):
        return checked_rule(k, drafter, trees, rows, target)
    if k == "auto":
        k_max = check_k_max(K_MAX if k_max is None else k_max)
        return auto_rule(drafter, k_max if trees else compiled_k_max(k_max, target), trees, max_nodes, rows)
    if k_max is not None:
        raise ValueError(f"k_max={k_max!r} bounds the draft length k='auto' chooses; with k={k!r} leave it out")
    if k is None and trees:
        return FixedDraftLength(None)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        shapes = "(tree depth per round) must be an int >= 1, 'auto', None" if trees else (
            "(draft tokens per round, gamma) must be an int >= 1, 'auto'")
        raise ValueError(f"k {shapes} or a rule (choose and observe, e.g. a CostModel), got {k!r}")
    return FixedDraftLength(k)


def check_k_max(k_max: object) -> int:
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
        raise ValueError(f"k_max (longest draft k='auto' may choose) must be an int >= 1, got {k_max!r}")
    return k_max


def compiled_k_max(k_max: int, target: object) -> int:
    """k_max, or less on a target that runs compiled (specdec.runtime.compiled): the longest chain whose pass, k + 1
    tokens a row, has a compiled graph. A wider pass runs eager, several steps on a CPU (docs/performance.md), so it
    does not pay; drafted in the warm-up it would also price every draft out, its time extrapolated to the narrow
    widths as a line. The choice stays exact whatever k_max is (the rule reads finished rounds only)."""
    from ..runtime.compiled import compiled_forward, runs_compiled

    widest = max(compiled_forward(target).widths) if runs_compiled(target) else 1
    return k_max if widest < 2 else min(k_max, widest - 1)


def auto_rule(drafter: object, k_max: int, trees: bool, max_nodes: int, rows: int) -> Rule:
    """k="auto": an OnlineDraftChoice over a DraftSwitch's candidates, else a cost model of the drafter."""
    if isinstance(drafter, DraftSwitch):
        if trees or rows > 1:
            raise ValueError("k='auto' with a DraftSwitch chooses a chain draft for one sequence: decode one prompt at "
                             "a time with chains, or give one of its candidates as the drafter")
        return OnlineDraftChoice(drafter, k_max)
    if trees:
        if rows > 1:
            raise ValueError("k='auto' for token trees prices one sequence's trees; for a batch give trees a fixed "
                             "depth (an int k, or None), or use chains with k='auto'")
        return TreeCostModel(k_max, check_draft_cost(drafter), max_nodes=max_nodes)
    return CostModel(k_max, check_draft_cost(drafter))


def checked_rule(rule: Rule, drafter: object, trees: bool, rows: int, target: object = None) -> Rule:
    """A rule given as an object: it must price the proposal shape, the drafter and the rows given, and choose no
    thread count for a compiled target (dynamo guards its graphs on the count they were built at: a round at another
    count would compile them all again)."""
    from ..runtime.compiled import runs_compiled

    if isinstance(rule, OnlineThreadChoice) and runs_compiled(target):
        raise ValueError("OnlineThreadChoice switches torch's thread count, and a compiled target's graphs hold for "
                         "the count they were built at: set the count once and choose with an OnlineDraftChoice")
    if getattr(rule, "trees", trees) != trees:
        wanted = "a TreeCostModel (it prices trees, not chains)" if trees else "a CostModel (it prices chains)"
        raise TypeError(f"{'tree_generate' if trees else 'speculative_generate'} needs {wanted}, got {type(rule).__name__}")
    if getattr(rule, "draft_cost", None) is not None:
        check_draft_cost(drafter, rule.draft_cost)
    if getattr(rule, "switch", drafter) is not drafter:
        raise ValueError(f"the {type(rule).__name__} selects in another DraftSwitch than the drafter given")
    if rows > 1 and not (isinstance(rule, FixedDraftLength) or (isinstance(rule, CostModel) and not rule.trees)):
        raise TypeError(f"{type(rule).__name__} chooses for one sequence; a batch takes a fixed k or a CostModel "
                        "(k='auto'), which prices passes over all rows")
    return rule
