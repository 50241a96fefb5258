"""The theory the measurements are compared with: expected tokens per pass, Thm 3.8, the optimal k.

Notation of Leviathan et al. (2023): alpha = E[sum_x min(p(x), q(x))] is the acceptance rate of one draft
token, k (their gamma) the draft length, c the cost of a draft step relative to a target step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def expected_tokens(acceptance: Sequence[float]) -> float:
    """E(k) = sum_{j=0..k} prod_{i<=j} a_i: expected tokens from one target pass over a chain of k =
    len(acceptance) draft tokens, a_i the probability that position i is accepted given that 1..i-1 were."""
    total, reach = 1.0, 1.0
    for a in acceptance:
        reach *= a
        total += reach
    return total


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha)  (Leviathan Eq. 1): expected_tokens with every a_i = alpha."""
    return expected_tokens([alpha] * k)


def accepted_length_distribution(alpha: float, k: int) -> list[float]:
    """P(n draft tokens accepted), n = 0..k, when each is accepted independently with prob. alpha."""
    return [alpha**n * (1.0 - alpha) for n in range(k)] + [alpha**k]


def walltime_improvement(
    alpha: float, c: float, k: int, pass_cost: float = 1.0, draft_cost: str = "per_token"
) -> float:
    """Expected speedup over target-only decoding (Leviathan Thm 3.8): E(k) / (k c + v).

    v = pass_cost is one verification pass over k + 1 tokens in target steps (Thm 3.8 assumes 1; on a CPU
    it is measured); draft_cost "per_call" (a lookup) pays c once per round instead of once per token.
    """
    return expected_tokens_per_pass(alpha, k) / round_cost(c, k, pass_cost, draft_cost)


def round_cost(c: float, k: int, pass_cost: float = 1.0, draft_cost: str = "per_token") -> float:
    """One round in target steps: k c + v for a draft model, c + v for a lookup (c per call)."""
    return (c if draft_cost == "per_call" else k * c) + pass_cost


def best_draft_length(acceptance: Sequence[float], cost: Callable[[int], float], shortest: int = 0) -> int:
    """The k in shortest..len(acceptance) maximising E(k) / cost(k) (tokens per unit of time); ties go to the
    shorter draft. k = 0 is a plain target step."""
    rates = {k: expected_tokens(acceptance[:k]) / cost(k) for k in range(shortest, len(acceptance) + 1)}
    return max(rates, key=lambda k: (rates[k], -k))


def optimal_k(
    alpha: float,
    c: float,
    k_max: int = 64,
    pass_cost: Callable[[int], float] = lambda width: 1.0,
    draft_cost: str = "per_token",
) -> int:
    """The draft length 1..k_max that maximises walltime_improvement (found numerically); pass_cost(w) is
    a pass over w tokens in target steps."""
    return best_draft_length([alpha] * k_max, lambda k: round_cost(c, k, pass_cost(k + 1), draft_cost), shortest=1)
