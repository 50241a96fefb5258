"""One decoding loop for every proposal shape: chains (Leviathan et al. 2023) and token trees alike.

Notation of Leviathan et al.: p target distribution, q draft distribution, k = gamma draft tokens.

    prefill                 cache the prompt but its last token in the target (and the drafter)
    repeat until the budget or an end-of-sequence token:
        choose              the rule fixes k (a tree: depth and node budget) from earlier rounds only
        propose             the drafter drafts x ~ q: a chain (specdec.draft.proposal.Draft) or a tree
        score               one target pass over the proposal: p at every node
        accept              the acceptance rule walks it: accepted path and the target's next token
        commit              both caches keep the sequence but its last token (a crop, or a compaction)
        observe             the rule and the statistics see the finished round

The split follows vLLM's speculative decoding (proposer, scorer, rejection sampler): a new capability
is a class at one seam (a drafter, a rule, an acceptance rule), never a second loop. The acceptance
rules (specdec.verify.token.TokenLevel and specdec.verify.block.BlockVerification for chains,
specdec.verify.tree.TreeRules and specdec.verify.traversal.TraversalVerification for trees) emit the
target's distribution for any proposal fixed before p is seen, so the whole output is exact.

One shape: the state is a specdec.state.Batch of rows, and a single sequence is a batch of one. Every round
the drafter proposes for every active row (RowProposals), one target pass scores them all, each row is
accepted on its own by the rule, and the caches keep each row's path (one row crops; several mark dead
slots, specdec.runtime.cached). specdec.state says why every row stays exact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .checks import prompt_rows
from .choose.cost import Choice, Rule
from .choose.rules import rule_for
from .draft.base import Drafter, Proposal, check_rows, share_cache
from .draft.proposal import Draft, RowProposals
from .draft.tree import prune_tree
from .metrics import Generation, Stats, one_sequence
from .runtime.cached import CachedLM
from .runtime.masks import check_tree_backend
from .runtime.timing import stopwatch
from .sampling import DEFAULT_SAMPLING, Sampling
from .state import Batch
from .stopping import EosSet
from .verify.base import AcceptanceRule
from .verify.token import TokenLevel
from .verify.tree import TreeRules


@dataclass
class Round:
    """One finished round, as the rule and the statistics observe it (one entry per active row)."""

    choice: Choice
    proposed: RowProposals  # what the drafter returned
    verified: RowProposals  # what the target scored (a tree cut to the chosen node budget)
    path: list[list[int]]  # each row's accepted node ids of its proposal, in path order
    overlaps: list[torch.Tensor]  # each row's (observed,) beta = sum_x min(p, q) on its output path, on the device
    seconds: dict[str, float]  # "draft", "verify"
    timed: bool = True  # False: a graph compiled during the round (CachedLM.graphs_built): its seconds time
    # the compile (up to a minute), not the draft or the pass: rules learn its acceptance, not its times

    @property
    def depth(self) -> int:
        return self.verified.depth()


def prefill(target: CachedLM, drafter: Drafter, prompts: list[torch.Tensor]) -> None:
    """Cache every prompt but its last token; the drafter starts the rows (reading the target's cache or features
    if it can: offered first, so that the target keeps what the drafter reads from the prompt on)."""
    share_cache(drafter, target)
    target.prefill(prompts)
    drafter.start(prompts)


def apply_choice(choice: Choice, drafter: Drafter) -> None:
    """What the rule decided beyond k: the candidate that drafts (a DraftSwitch) and torch's thread count."""
    if choice.draft:
        drafter.use(choice.draft)
    if choice.threads is not None:
        torch.set_num_threads(choice.threads)


def propose(
    drafter: Drafter, state: Batch, choice: Choice, sampling: Sampling, vocab: int,
    generator: torch.Generator | None, trees: bool = False,
) -> RowProposals:
    """One proposal per row of length (depth) choice.k, or up to the room left for k=None, each cut to its row's
    room; k = 0 calls no drafter (the round is a plain target step)."""
    if choice.k == 0:
        return RowProposals.empty(len(state.order), vocab, state.tokens[0].device, trees)
    k = state.room() if choice.k is None else choice.k
    proposals = drafter.propose(state.tokens, k, sampling, vocab, generator)
    return RowProposals([fit(r, room) for r, room in zip(proposals.rows, state.rooms())], proposals.forwards)


def fit(proposal: Proposal, room: int) -> Proposal:
    """A row's proposal no deeper than the room left in its budget."""
    if max(proposal.depths(), default=0) <= room:
        return proposal
    if isinstance(proposal, Draft):
        return Draft(proposal.tokens[:room], proposal.q[:room], proposal.forwards)
    return prune_tree(proposal, room, proposal.size)


def cut(proposals: RowProposals, choice: Choice, max_nodes: int) -> RowProposals:
    """Every row's proposal cut to the chosen node budget (prune_tree), refused when wider than the pass limit."""
    verified = proposals if choice.nodes is None else proposals.map(lambda r: prune_tree(r, choice.k, choice.nodes))
    if verified.size > max_nodes:
        raise ValueError(
            f"the proposal has {verified.size} tokens but the pass limit is max_nodes={max_nodes}: lower the "
            "drafter's node budget or raise max_nodes"
        )
    return verified


def observe(stats: Stats, rule: Rule, round: Round, state: Batch, trees: bool) -> None:
    """The rule learns from the round; the statistics count it (and each row its share)."""
    stats.draft_forwards += round.verified.forwards
    state.record(stats, round, trees)
    chosen = round.depth if round.choice.k is None else round.choice.k
    stats.record_schedule(chosen, round.choice.prediction, state.produced(round), round.seconds, round.choice.draft,
                          round.choice.threads)
    rule.observe(round)


def decode(
    target: PreTrainedModel,
    drafter: Drafter,
    input_ids: torch.Tensor | list,
    *,
    attention_mask: torch.Tensor | None = None,
    rule: Rule,
    acceptance: AcceptanceRule,
    sampling: Sampling = DEFAULT_SAMPLING,
    max_new_tokens: int = 64,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    max_nodes: int = 64,
    cache: CachedLM | None = None,
    phase_times: bool = False,
) -> Generation:
    """Generate up to max_new_tokens after input_ids (1, L) with the target's exact distribution.

    Several prompts: input_ids (B, L) with attention_mask (1 token, 0 padding), or a list of token id rows;
    every row then accepts on its own and the Generation holds every row (generation[b]). Finished rows leave
    the batch.

    cache: the target's CachedLM to decode into (empty; e.g. one the caller preallocated), else a new one.
    phase_times: synchronize the device around the draft and verify phases of every round so that their
    times are exact; rules that read times (rule.clock) always get them. Off, a CUDA run's phase split is
    only indicative (the total is always synchronized); on a CPU it changes nothing.
    """
    prompts, single = prompt_rows(target, input_ids, attention_mask, max_new_tokens)
    check_rows(drafter, len(prompts))
    lm = target_cache(target, cache)
    vocab = min(lm.vocab_size, drafter.vocab_size or lm.vocab_size)
    stats = Stats()
    clock = rule.clock or time.perf_counter
    sync = lm.device if (phase_times or rule.clock is not None) else None
    threads = torch.get_num_threads()
    try:
        with stopwatch(stats.seconds, "total", lm.device):
            state = Batch(prompts, max_new_tokens, EosSet(eos_token_id), lm.device)  # its clock (each row's
            # latency) starts inside the total's, so no row ends after the call
            with stopwatch(stats.seconds, "prefill", lm.device):
                prefill(lm, drafter, state.tokens)
            while state.active:
                choice = rule.choose(state.room(), len(state.order), state.tokens)  # from past rounds and the
                # tokens so far (never this round's p); never past the budget
                apply_choice(choice, drafter)
                spent: dict[str, float] = {}
                graphs = lm.graphs_built
                with stopwatch(spent, "draft", sync, clock):
                    proposed = propose(drafter, state, choice, sampling, vocab, generator, acceptance.trees)
                    verified = cut(proposed, choice, max_nodes)
                with stopwatch(spent, "verify", sync, clock):
                    p = verified.score(lm, state.tokens, sampling, vocab)  # (n_b + 1, V) per row
                    paths, next_tokens = acceptance.accept_rows(p, verified, generator)
                    lm.keep(verified.size, paths)
                round = Round(choice, proposed, verified, paths, verified.overlaps(p, paths), spent,
                              timed=lm.graphs_built == graphs)
                observe(stats, rule, round, state, acceptance.trees)
                state.extend(verified.accepted(paths), next_tokens)
                state.retire(lm, drafter)
    finally:
        torch.set_num_threads(threads)  # a rule may have chosen other counts round by round
    result = state.result(stats)
    return one_sequence(result) if single else result


def target_cache(target: PreTrainedModel, cache: CachedLM | None) -> CachedLM:
    """The caller's empty cache of the target, or a new one."""
    if cache is None:
        return CachedLM(target)
    if cache.model is not target or cache.slots:
        raise ValueError("cache must be an empty CachedLM of the target (CachedLM(target), or after its reset())")
    return cache


def speculative_generate(
    target: PreTrainedModel,
    drafter: Drafter,
    input_ids: torch.Tensor,
    *,
    k: int | str | Rule = 4,
    k_max: int | None = None,
    acceptance: AcceptanceRule | None = None,
    **options,
) -> Generation:
    """Speculative sampling over chains of draft tokens (Leviathan's Algorithm 1): decode with the token-level
    rule, or another rule for chains (acceptance=specdec.BlockVerification()). k: draft tokens per round
    (gamma); "auto" chooses 0..k_max (default 8; on a compiled target at most its widest graph's chain) each
    round with a fresh CostModel; a rule (a CostModel instance) is used as given and keeps its measurements
    across calls. Several prompts (a list, or (B, L) with attention_mask): every row accepts on its own, one k
    per round for all rows. options: decode's."""
    rule = rule_for(k, drafter, k_max=k_max, rows=rows_of(input_ids, options.get("attention_mask")), target=target)
    acceptance = acceptance or TokenLevel()
    if acceptance.trees:
        raise ValueError(f"{type(acceptance).__name__} verifies token trees; speculative_generate verifies chains")
    return decode(target, drafter, input_ids, rule=rule, acceptance=acceptance, **options)


def tree_generate(
    target: PreTrainedModel,
    drafter: Drafter,
    input_ids: torch.Tensor,
    *,
    k: int | str | Rule | None = None,
    k_max: int | None = None,
    max_nodes: int = 64,
    acceptance: AcceptanceRule | None = None,
    **options,
) -> Generation:
    """Speculative sampling over token trees: decode with the exact tree rules (or another rule for trees,
    acceptance=specdec.TraversalVerification()), one draft tree per target pass (at most max_nodes nodes); an
    empty tree is a plain target step.

    k: None (default): the drafter's own tree, as deep as the budget allows; an int: trees of depth at most
    k; "auto": each round a depth 0..k_max and a node budget <= max_nodes chosen by a fresh TreeCostModel
    from measured costs and past acceptance (the drafter is cut to them, see prune_tree); a rule (a
    TreeCostModel instance) is used as given and keeps its measurements across calls. "auto" needs a drafter
    with a draft_cost attribute ("per_token" or "per_call"). options: decode's.
    """
    if max_nodes < 1:
        raise ValueError(f"max_nodes (tree nodes per target pass) must be >= 1, got {max_nodes}")
    rule = rule_for(k, drafter, k_max=k_max, trees=True, max_nodes=max_nodes,
                    rows=rows_of(input_ids, options.get("attention_mask")))
    check_tree_backend(target)
    acceptance = acceptance or TreeRules()
    if not acceptance.trees:
        raise ValueError(f"{type(acceptance).__name__} verifies chains; tree_generate verifies token trees: use "
                         "TreeRules (token level) or TraversalVerification (block verification carried to trees)")
    return decode(target, drafter, input_ids, rule=rule, acceptance=acceptance, max_nodes=max_nodes, **options)


def rows_of(input_ids: torch.Tensor | list, attention_mask: torch.Tensor | None) -> int:
    """How many prompts a call decodes (a (1, L) tensor: one)."""
    if isinstance(input_ids, torch.Tensor):
        return input_ids.shape[0] if input_ids.dim() == 2 else 1
    return len(input_ids)
