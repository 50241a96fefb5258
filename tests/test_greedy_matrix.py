"""Temperature 0: speculative output equals the target's own greedy output, token for token.

One matrix of what can run together: proposer (chain and tree drafters: model copies that agree fully, partly or
little, a draft reading the target's cache, n-gram lookups, a draft head, a switch between candidates, drafts with
another vocabulary) x acceptance rule (token level and block for chains, tree rules and traversal for trees) x
draft length (short, long, or chosen every round: "auto") x rows (one prompt, a batch of three ragged ones) x runtime
(eager, compiled) x architecture (every tiny architecture, sliding windows shorter than the output). Each case
compares with Hugging Face's greedy generate of the same target, row by row.

`make test` runs SLICE, where every value of every axis occurs, every architecture meets chains, trees, a batch and
a draft reading its cache, and every proposer meets both of its rules and both draft lengths; `make test-all` runs
the whole product (`exhaustive`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch
from fakes import GREEDY_PROMPT, RandomClock, hf_greedy

from specdec import (
    GREEDY,
    BlockVerification,
    ChainTreeDrafter,
    CostModel,
    DraftSwitch,
    HybridTreeDrafter,
    ModelDrafter,
    ModelTreeDrafter,
    NGramDrafter,
    NGramTreeDrafter,
    OnlineDraftChoice,
    StringDrafter,
    TokenIntersectionDrafter,
    TokenLevel,
    TraversalVerification,
    TreeCostModel,
    TreeRules,
    speculative_generate,
    tree_generate,
)
from specdec.draft.head import DraftHead
from specdec.draft.head_drafter import HeadDrafter, HeadTreeDrafter
from specdec.runtime.compiled import compile_model
from specdec.runtime.tiny import ARCHITECTURES, perturbed_copy, tiny_model

N_NEW = 16  # longer than every sliding window (6): rollback and compaction across the window
N_SWITCH = 40  # a switch's online choice probes every candidate within these
BATCH = [GREEDY_PROMPT[0].tolist(), [0, 9], [0, 5, 3, 7, 5, 3, 7, 5, 3, 12, 4]]  # lengths 6, 2, 11
K_MAX = 8  # "auto": k_max + 1 > the window
DRAFT_LENGTHS = {"short": (1, 2), "long": (6, None)}  # (chains: k, trees: the depth cap; None: the drafter's own tree)


# ---------------------------------------------------------------- the models of a case


def head(target) -> DraftHead:
    """A random one-layer draft head over the even tokens (a reduced draft vocabulary)."""
    torch.manual_seed(0)
    return DraftHead(target, layers=1, vocab=torch.arange(0, target.config.vocab_size, 2))


def cross_vocab_tokenizers(vocab_size: int):
    """The target's tokenizer (one character per token) and a draft's that shares only part of it: the last four
    characters missing, two merges added; and the draft's vocabulary size."""
    from test_cross_vocab import toy_tokenizer

    chars = [chr(ord("!") + i) for i in range(vocab_size)]
    draft_vocab = chars[:-4] + ['!"', '"!']
    return toy_tokenizer(chars, []), toy_tokenizer(draft_vocab, [("!", '"'), ('"', "!")]), len(draft_vocab)


class Models:
    """Each worker's tiny models, built at their first use: eager and compiled targets (the same weights; the eager
    one never compiles), drafts, and Hugging Face's greedy generate of each prompt alone."""

    def __init__(self):
        self.built: dict = {}

    def once(self, key, build):
        if key not in self.built:
            self.built[key] = build()
        return self.built[key]

    def target(self, arch: str, runtime: str = "eager"):
        return self.once((arch, runtime), lambda: target_on(arch, runtime))

    def draft(self, arch: str, noise: float):
        return self.once((arch, noise), lambda: perturbed_copy(self.target(arch), noise))

    def reference(self, arch: str, rows: int, n: int) -> list[torch.Tensor]:
        return self.once((arch, "greedy", rows, n), lambda: [hf_greedy(self.target(arch), p[None], n)
                                                             for p in prompts_of(rows)])


def target_on(arch: str, runtime: str):
    model = tiny_model(arch, seed=0, scale=20.0)
    if runtime == "compiled":
        compile_model(model, widths=(4, 8), capacity=64, autotune=False)  # few graphs: shorter passes padded to 4
    return model


def prompts_of(rows: int) -> list[torch.Tensor]:
    return [torch.tensor(p) for p in ([GREEDY_PROMPT[0].tolist()] if rows == 1 else BATCH)]


@pytest.fixture(scope="module")
def models() -> Models:
    return Models()


# ---------------------------------------------------------------- proposers

CHAINS = {  # name -> drafter(models, arch, target)
    "model": lambda m, arch, target: ModelDrafter(m.draft(arch, 0.15)),
    "model_same": lambda m, arch, target: ModelDrafter(m.target(arch)),  # accepts every token
    "model_far": lambda m, arch, target: ModelDrafter(m.draft(arch, 0.6)),
    "reads_target_cache": lambda m, arch, target: ModelDrafter(m.draft(arch, 0.15), reads_target_cache=True),
    "ngram": lambda m, arch, target: NGramDrafter(),
    "head": lambda m, arch, target: HeadDrafter(head(target)),
    "switch": lambda m, arch, target: DraftSwitch({
        "close": ModelDrafter(m.draft(arch, 0.05), reads_target_cache=True),
        "far": ModelDrafter(m.draft(arch, 0.3)),
        "ngram": NGramDrafter(),
    }),
}
TREES = {
    "model_top": lambda m, arch, target: ModelTreeDrafter(m.draft(arch, 0.15), branches=(3, 2), depth=5, nodes=14,
                                                       children="top"),
    "model_iid": lambda m, arch, target: ModelTreeDrafter(m.draft(arch, 0.15), branches=(2, 2), depth=5, children="iid"),
    "model_distinct": lambda m, arch, target: ModelTreeDrafter(m.draft(arch, 0.15), branches=(3,), depth=6,
                                                            children="distinct"),
    "ngram_trie": lambda m, arch, target: NGramTreeDrafter(matches=3, depth=6, nodes=12),
    "ngram_chain": lambda m, arch, target: ChainTreeDrafter(NGramDrafter(), k=4),
    "hybrid": lambda m, arch, target: HybridTreeDrafter(m.draft(arch, 0.15), NGramTreeDrafter(nodes=6), branches=(2,),
                                                     depth=4, children="distinct"),
    "tree_reads_target_cache": lambda m, arch, target: ModelTreeDrafter(m.draft(arch, 0.15), branches=(3, 2), depth=5,
                                                                     nodes=12, reads_target_cache=True),
    "chain_reads_target_cache": lambda m, arch, target: ChainTreeDrafter(
        ModelDrafter(m.draft(arch, 0.15), reads_target_cache=True), k=4),
    "hybrid_reads_target_cache": lambda m, arch, target: HybridTreeDrafter(
        m.draft(arch, 0.15), NGramTreeDrafter(nodes=4), branches=(2,), depth=4, reads_target_cache=True),
    "head_tree": lambda m, arch, target: HeadTreeDrafter(head(target), branches=(2, 2), depth=4, nodes=8),
}
CROSS = {"tli": TokenIntersectionDrafter, "string": StringDrafter}  # chains whose draft has another vocabulary
CHAIN_RULES = {"token": TokenLevel, "block": BlockVerification}
TREE_RULES = {"tree": TreeRules, "traversal": TraversalVerification}
AGREES = {"model", "model_same", "reads_target_cache", "switch", "model_top", "model_iid", "model_distinct", "hybrid",
          "tree_reads_target_cache", "chain_reads_target_cache", "hybrid_reads_target_cache"}  # drafts get accepted


@dataclass(frozen=True)
class Case:
    proposer: str
    rule: str
    k: str  # "short", "long" or "auto" (DRAFT_LENGTHS)
    rows: int  # 1 or len(BATCH)
    runtime: str  # "eager" or "compiled"
    arch: str

    @property
    def trees(self) -> bool:
        return self.proposer in TREES

    @property
    def n_new(self) -> int:
        return N_SWITCH if self.proposer == "switch" else N_NEW

    @property
    def id(self) -> str:
        return f"{self.proposer}-{self.rule}-{self.k}-rows{self.rows}-{self.runtime}-{self.arch}"


COMPILED_ARCHS = ("llama", "gemma2")  # the compiled runtime's cases: a plain and a sliding-window architecture (each
# compiled graph costs seconds; tests/test_compiled.py compares compiled and eager on every architecture)


def runnable(case: Case) -> bool:
    """What can run together (compiled: on COMPILED_ARCHS): a tree rule with a tree drafter; traversal with trees whose siblings are drawn
    (no "top" children, no deterministic lookups); the other vocabulary on one eager row (its drafters keep
    per-sequence state); on a batch "auto" only for chains of one drafter (the rules that choose a tree shape or a
    candidate choose for one sequence)."""
    if case.rule not in (TREE_RULES if case.trees else CHAIN_RULES):
        return False
    if case.rule == "traversal" and case.proposer not in ("model_iid", "model_distinct", "hybrid"):
        return False
    if case.proposer in CROSS and (case.runtime == "compiled" or case.rows > 1):
        return False
    if case.runtime == "compiled" and case.arch not in COMPILED_ARCHS:
        return False
    return not (case.rows > 1 and case.k == "auto" and (case.trees or case.proposer == "switch"))


AXES = {
    "proposer": [*CHAINS, *CROSS, *TREES],
    "rule": [*CHAIN_RULES, *TREE_RULES],
    "k": ["short", "long", "auto"],
    "rows": [1, len(BATCH)],
    "runtime": ["eager", "compiled"],
    "arch": list(ARCHITECTURES),
}
PRODUCT = [c for c in itertools.starmap(Case, itertools.product(*AXES.values())) if runnable(c)]


def slice_of_the_product() -> set[Case]:
    """`make test`'s cases: each proposer with each of its rules and both draft lengths, on one row and eager,
    the architectures taken in turn; every architecture with a chain and a tree on a batch and with drafts reading
    its cache; the compiled runtime with a batch of small trees on llama: passes of one to three tokens, padded to the
    compiled target's narrower bucket (one graph). Chains on the compiled runtime: a model's in
    tests/test_compiled.py, a head's in tests/test_head_runtime.py."""
    chosen, turn = set(), itertools.cycle(ARCHITECTURES)
    for case in PRODUCT:
        if case.rows == 1 and case.runtime == "eager" and case.arch == "llama":
            chosen.add(Case(case.proposer, case.rule, case.k, 1, "eager", next(turn)))
    for arch in ARCHITECTURES:
        chosen |= {Case("model", "token", "auto", len(BATCH), "eager", arch),
                   Case("model_top", "tree", "long", len(BATCH), "eager", arch),
                   Case("reads_target_cache", "token", "long", 1, "eager", arch),
                   Case("tree_reads_target_cache", "tree", "auto", 1, "eager", arch)}
    chosen.add(Case("chain_reads_target_cache", "tree", "short", len(BATCH), "compiled", "llama"))
    return chosen


SLICE = slice_of_the_product()


def rule_of(case: Case, drafter):
    """The draft-length rule: a fixed k (DRAFT_LENGTHS), or one chosen every round from measured costs (a clock with
    random increments, so that the choice varies)."""
    if case.k != "auto":
        return DRAFT_LENGTHS[case.k][case.trees]
    if case.proposer == "switch":
        return OnlineDraftChoice(drafter, k_max=6, clock=RandomClock(1), probe_every=2, probe_most=4)
    model = TreeCostModel if case.trees else CostModel
    return model(k_max=K_MAX, draft_cost=drafter.draft_cost, clock=RandomClock())


def generate(case: Case, target, drafter, prompts):
    loop = tree_generate if case.trees else speculative_generate
    acceptance = {**CHAIN_RULES, **TREE_RULES}[case.rule]()
    return loop(target, drafter, prompts, k=rule_of(case, drafter), sampling=GREEDY, max_new_tokens=case.n_new,
                acceptance=acceptance)


def setup(case: Case, models: Models):
    """The case's target, a function that builds a fresh drafter, and the target's greedy output of each prompt."""
    target = models.target(case.arch, case.runtime)
    if case.proposer in CROSS:  # the target's 32 tokens read as characters, a draft over 30 tokens of another tokenizer
        target_tokenizer, draft_tokenizer, draft_vocab = cross_vocab_tokenizers(target.config.vocab_size)
        draft = models.once("cross draft", lambda: tiny_model("llama", seed=3, scale=20.0, vocab_size=draft_vocab))
        drafter = lambda: CROSS[case.proposer](draft, draft_tokenizer, target_tokenizer)
    else:
        drafter = lambda: {**CHAINS, **TREES}[case.proposer](models, case.arch, target)
    return target, drafter, models.reference(case.arch, case.rows, case.n_new)


def marks_of(case: Case) -> list:
    marks = [] if case in SLICE else [pytest.mark.exhaustive]
    if case.runtime == "compiled":
        marks.append(pytest.mark.xdist_group("inductor"))  # one worker compiles (tests/test_compiled.py)
    return marks


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=marks_of(c)) for c in PRODUCT])
def test_greedy_output_is_the_targets(case: Case, models: Models):
    target, drafter, expected = setup(case, models)
    ids = prompts_of(case.rows) if case.rows > 1 else prompts_of(1)[0][None]
    out = generate(case, target, drafter(), ids)
    tokens = out.tokens if case.rows > 1 else [out.tokens]
    for row, (mine, theirs) in enumerate(zip(tokens, expected, strict=True)):
        assert torch.equal(mine, theirs), (case.id, row)
    stats = out.stats
    if case.k != "auto" and case.proposer in AGREES:
        assert stats.accepted > 0  # the draft took part, not only plain steps
    if case.proposer == "model_same" and case.k != "auto":
        assert stats.acceptance_rate == 1.0
    if case.k == "auto" and case.rows == 1 and case.proposer != "switch":
        assert len(set(stats.chosen_k)) >= 2 and len(stats.chosen_k) == stats.target_forwards  # k really varied
        if case.trees:
            assert all(depth <= k for depth, k in zip(stats.tree_depths, stats.chosen_k))
    if case.proposer == "switch" and case.k == "auto":
        assert len({d for d in stats.chosen_draft if d}) == 3  # every candidate drafted
    if case.rule == "block" and case.k != "auto":  # at temperature 0 block accepts what the token-level rule does
        token = speculative_generate(target, drafter(), ids, k=rule_of(case, None), sampling=GREEDY,
                                     max_new_tokens=case.n_new)
        assert stats.accepted_per_round == token.stats.accepted_per_round


def test_the_slice_covers_every_value_of_every_axis():
    for axis, values in AXES.items():
        assert {getattr(c, axis) for c in SLICE} == set(values), axis
    assert SLICE <= set(PRODUCT)
