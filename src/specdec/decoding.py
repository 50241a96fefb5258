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
rules (specdec.verify.token.TokenLevel and BlockVerification for chains, specdec.verify.tree.TreeRules and
specdec.verify.traversal.TraversalVerification for trees) emit the
target's distribution for any proposal fixed before p is seen, so the whole output is exact.

The loop state is one `Sequence` (the tokens so far, what is left of the budget, whether it ended),
or for several prompts a specdec.state.Batch of rows of different lengths; the loop reads and extends
it only through their common methods, with the batch's counterparts of the cache (BatchedLM), the
drafter (one proposal per row), the proposal (RowProposals: one target pass for all rows) and the
acceptance rule (PerRow: each row accepted on its own). specdec.state says why every row stays exact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from .checks import batch_rows, batched, check_batch, check_generation_args
from .choose.cost import Choice, Rule
from .choose.rules import check_batch_rule, draft_rule
from .draft.base import Drafter, Proposal, share_cache
from .draft.batch import batch_drafter
from .draft.proposal import Draft, RowProposals
from .draft.tree import empty_tree, prune_tree
from .metrics import BatchGeneration, Generation, Stats
from .runtime.batch_cache import BatchedLM
from .runtime.cached import CachedLM
from .runtime.masks import check_tree_backend
from .runtime.timing import stopwatch
from .sampling import DEFAULT_SAMPLING, Sampling
from .state import Batch, Sequence
from .stopping import EosSet
from .verify.rows import PerRow
from .verify.token import TokenLevel
from .verify.tree import TreeRules


class AcceptanceRule(Protocol):
    """How a scored proposal is accepted: the accepted node ids (path order) and the target's next token."""

    trees: bool  # True: the statistics keep each pass's tree size and depth

    def accept(self, p: torch.Tensor, proposal: Proposal, generator: torch.Generator | None
               ) -> tuple[list[int], torch.Tensor]: ...


@dataclass
class Round:
    """One finished round, as the rule and the statistics observe it."""

    choice: Choice
    proposed: Proposal  # what the drafter returned
    verified: Proposal  # what the target scored (a tree cut to the chosen node budget)
    path: list[int]  # accepted node ids of `verified`, in path order
    overlaps: torch.Tensor  # (observed,) beta = sum_x min(p, q) on the output path, on the device
    seconds: dict[str, float]  # "draft", "verify"
    # A batch round: proposed and verified are RowProposals, path and overlaps lists with one entry per row.

    @property
    def depth(self) -> int:
        return max(self.verified.depths(), default=0)

    def overlap_total(self) -> torch.Tensor:
        parts = self.overlaps if isinstance(self.overlaps, list) else [self.overlaps]
        return sum((part.sum() for part in parts), torch.zeros(()))


def prefill(target: CachedLM, drafter: Drafter, sequence: torch.Tensor) -> None:
    """Cache the prompt but its last token; the drafter starts the sequence (reading the target's cache if it can)."""
    target.prefill(sequence)
    share_cache(drafter, target)
    drafter.start(sequence)


def propose(
    drafter: Drafter, state: Sequence | Batch, choice: Choice, sampling: Sampling, vocab: int,
    generator: torch.Generator | None, trees: bool = False,
) -> Proposal | RowProposals:
    """The drafter's proposal of length (depth) choice.k, or up to the room left for k=None; k = 0 calls no
    drafter (the round is a plain target step). A batch: one proposal per row, each cut to its row's room."""
    if isinstance(state, Batch):
        if choice.k == 0:
            empty = empty_tree if trees else Draft.empty
            return RowProposals([empty(vocab, row.device) for row in state.tokens])
        k = state.room() if choice.k is None else choice.k
        proposals = drafter.propose(state.tokens, k, sampling, vocab, generator)
        return RowProposals([fit(r, room) for r, room in zip(proposals.rows, state.rooms())], proposals.forwards)
    if choice.k == 0:
        return Draft.empty(vocab, state.tokens.device)
    return drafter.propose(state.tokens, state.room() if choice.k is None else choice.k, sampling, vocab, generator)


def fit(proposal: Proposal, room: int) -> Proposal:
    """A row's proposal no deeper than the room left in its budget."""
    if max(proposal.depths(), default=0) <= room:
        return proposal
    if isinstance(proposal, Draft):
        return Draft(proposal.tokens[:room], proposal.q[:room], proposal.forwards)
    return prune_tree(proposal, room, proposal.size)


def cut(proposal: Proposal | RowProposals, choice: Choice, max_nodes: int) -> Proposal | RowProposals:
    """The proposal cut to the chosen node budget (prune_tree), refused when wider than the pass limit."""
    if isinstance(proposal, RowProposals):
        return proposal.map(lambda row: cut(row, choice, max_nodes))
    verified = proposal if choice.nodes is None else prune_tree(proposal, choice.k, choice.nodes)
    if verified.size > max_nodes:
        raise ValueError(
            f"the proposal has {verified.size} tokens but the pass limit is max_nodes={max_nodes}: lower the "
            "drafter's node budget or raise max_nodes"
        )
    return verified


def observe(stats: Stats, rule: Rule, round: Round, state: Sequence | Batch, trees: bool) -> None:
    """The rule learns from the round; the statistics count it (a batch: each row's share too)."""
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
) -> Generation | BatchGeneration:
    """Generate up to max_new_tokens after input_ids (1, L) with the target's exact distribution.

    Several prompts: input_ids (B, L) with attention_mask (1 token, 0 padding), or a list of token id rows;
    every row then accepts on its own (specdec.state) and a BatchGeneration comes back. Finished rows leave
    the batch; rule then must be a batch's (FixedDraftLength, or BatchCostModel for k="auto").

    cache: the target's CachedLM to decode into (empty; e.g. one the caller preallocated), else a new one.
    phase_times: synchronize the device around the draft and verify phases of every round so that their
    times are exact; rules that read times (rule.clock) always get them. Off, a CUDA run's phase split is
    only indicative (the total is always synchronized); on a CPU it changes nothing.
    """
    many = batched(input_ids, attention_mask)
    if many:
        prompts = batch_rows(input_ids, attention_mask)
        check_batch(target, prompts, max_new_tokens)
        check_batch_rule(rule)
        lm = BatchedLM(target)
        drafter = batch_drafter(drafter)
        acceptance = acceptance if isinstance(acceptance, PerRow) else PerRow(acceptance)  # a batched rule as given
    else:
        check_generation_args(target, input_ids, max_new_tokens)
        lm = cache if cache is not None else CachedLM(target)
        if lm.model is not target or lm.length:
            raise ValueError("cache must be an empty CachedLM of the target (CachedLM(target), or after its reset())")
    vocab = min(lm.vocab_size, drafter.vocab_size or lm.vocab_size)
    eos = EosSet(eos_token_id)
    state = Batch(prompts, max_new_tokens, eos, lm.device) if many else Sequence(input_ids.to(lm.device),
                                                                                     max_new_tokens, eos)
    stats = Stats()
    overlap_total = torch.zeros((), device=lm.device)
    clock = rule.clock or time.perf_counter
    sync = lm.device if (phase_times or rule.clock is not None) else None
    with stopwatch(stats.seconds, "total", lm.device):
        with stopwatch(stats.seconds, "prefill", lm.device):
            prefill(lm, drafter, state.tokens)
        while state.active:
            if many:
                rule.rows = len(state.order)  # the batch's cost model prices passes over the rows still active
            choice = rule.choose(state.room())  # from past rounds; never past the budget
            spent: dict[str, float] = {}
            with stopwatch(spent, "draft", sync, clock):
                proposed = propose(drafter, state, choice, sampling, vocab, generator, acceptance.trees)
                verified = cut(proposed, choice, max_nodes)
            with stopwatch(spent, "verify", sync, clock):
                p = verified.score(lm, state.tokens, sampling, vocab)  # (n+1, V); a batch: one per row
                path, next_token = acceptance.accept(p, verified, generator)
                lm.keep(verified.size, path)
            round = Round(choice, proposed, verified, path, verified.overlaps(p, path), spent)
            observe(stats, rule, round, state, acceptance.trees)
            overlap_total += round.overlap_total().to(overlap_total.device)
            state.extend(accepted_tokens(verified, path, lm.device), next_token)
            state.retire(lm, drafter)
    if many:
        stats.overlap_sum = float(overlap_total)
        return state.result(stats)
    return state.result(stats, overlap_total)


def accepted_tokens(verified: Proposal | RowProposals, path, device: torch.device):
    """The accepted tokens of the round (a batch: one tensor per row)."""
    if isinstance(verified, RowProposals):
        return verified.accepted(path)
    return verified.tokens[path].to(device)


def speculative_generate(
    target: PreTrainedModel,
    drafter: Drafter,
    input_ids: torch.Tensor,
    *,
    k: int | str | Rule = 4,
    k_max: int = 8,
    acceptance: AcceptanceRule | None = None,
    **options,
) -> Generation:
    """Speculative sampling over chains of draft tokens (Leviathan's Algorithm 1): decode with the token-level
    rule, or another rule for chains (acceptance=specdec.BlockVerification()). k: draft tokens per round
    (gamma); "auto" chooses 0..k_max each round with a fresh CostModel; a rule (a CostModel instance) is used
    as given and keeps its measurements across calls. Several prompts (a list, or (B, L) with
    attention_mask): every row accepts on its own, one k per round for all rows. options: decode's."""
    rule = draft_rule(k, k_max, drafter, batch=batched(input_ids, options.get("attention_mask")))
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
    k_max: int = 8,
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
    rule = draft_rule(k, k_max, drafter, trees=True, max_nodes=max_nodes,
                      batch=batched(input_ids, options.get("attention_mask")))
    check_tree_backend(target)
    acceptance = acceptance or TreeRules()
    if not acceptance.trees:
        raise ValueError(f"{type(acceptance).__name__} verifies chains; tree_generate verifies token trees: use "
                         "TreeRules (token level) or TraversalVerification (block verification carried to trees)")
    return decode(target, drafter, input_ids, rule=rule, acceptance=acceptance, max_nodes=max_nodes, **options)
