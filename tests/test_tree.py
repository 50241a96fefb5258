"""Token trees: mask and positions, KV-cache compaction, greedy equality, clear errors, exactness.

Greedy: every tree drafter reproduces the target's own greedy output on the seven tiny architectures,
sliding windows (shorter than the generation) included. Compaction: after a tree pass and keeping one
path, the cache gives the logits of a recomputation from scratch. Sampling: whole continuations follow
the target's distribution (chi-square against exact enumeration, goodness_of_fit), and the same
test rejects a tree whose distinct children are verified with the i.i.d. rule and the original q.
"""

import pytest
import torch
from fakes import GREEDY_PROMPT, hf_greedy
from goodness_of_fit import PASS, REJECT, batch_counts, chi_square_pvalue, in_make_test, sample_counts

from specdec import (
    GREEDY,
    HybridTreeDrafter,
    ModelTreeDrafter,
    NGramTreeDrafter,
    Sampling,
    TreeDraft,
    tree_generate,
)
from specdec.draft.base import RowDrafter
from specdec.draft.proposal import RowProposals
from specdec.draft.tree import check_tree
from specdec.exact import sequence_distribution
from specdec.runtime.cached import CachedLM
from specdec.runtime.tiny import perturbed_copy, tiny_model
from specdec.verify.tree import DETERMINISTIC, DISTINCT, IID

PROMPT = GREEDY_PROMPT
N_NEW = 30


def hand_tree(tokens, parents, vocab=32, mode=DETERMINISTIC):
    ids = torch.tensor(tokens)
    q = torch.nn.functional.one_hot(ids, vocab).float()
    return TreeDraft(ids, torch.tensor(parents), q, torch.full((len(tokens),), mode))


# ---------------------------------------------------------------- mask and positions


# ---------------------------------------------------------------- compaction equals recomputation


# ---------------------------------------------------------------- greedy equality


def test_model_tree_branches_and_accepts_off_the_first_branch():
    """The top-2 tree of a far draft accepts its second root child in some rounds: branching pays."""
    target = tiny_model("llama", seed=0, scale=20.0)
    drafter = ModelTreeDrafter(perturbed_copy(target, 0.6), branches=(2,), depth=3, children="top")
    out = tree_generate(target, drafter, PROMPT, sampling=GREEDY, max_new_tokens=N_NEW)
    assert torch.equal(out.tokens, hf_greedy(target, PROMPT, N_NEW))
    assert max(out.stats.tree_nodes) > max(out.stats.tree_depths)  # really a tree


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "qwen2"])
def test_one_token_prompt_with_a_tree_wider_than_the_window(arch):
    """No prefill; the first pass (1 + 10 nodes) is longer than the window (6)."""
    target = tiny_model(arch, seed=0, scale=4.0, vocab_size=16)
    prompt = torch.tensor([[0]])
    drafter = ModelTreeDrafter(perturbed_copy(target, 0.5), branches=(3, 2), depth=8, nodes=10)
    out = tree_generate(target, drafter, prompt, sampling=GREEDY, max_new_tokens=20)
    assert torch.equal(out.tokens, hf_greedy(target, prompt, 20))


def test_ngram_trie_merges_matches_latest_first():
    seq = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2]])
    tree = NGramTreeDrafter(max_ngram=2, min_ngram=2, matches=2, depth=3, nodes=16).propose_row(seq, 3, GREEDY, 8, None)
    # "1 2" occurs at 3 (then 4 1 2) and at 0 (then 3 1 2): two branches, the later match first
    assert tree.tokens.tolist() == [4, 1, 2, 3, 1, 2]
    assert tree.parents.tolist() == [-1, 0, 1, -1, 3, 4]
    assert (tree.modes == DETERMINISTIC).all() and torch.equal(tree.q.argmax(-1), tree.tokens)
    small = NGramTreeDrafter(max_ngram=2, min_ngram=1, matches=4, depth=3, nodes=4).propose_row(seq, 3, GREEDY, 8, None)
    assert small.size == 4


# ---------------------------------------------------------------- clear errors


def test_empty_tree_is_refused_by_the_check_and_scored_as_a_plain_step():
    empty = TreeDraft(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0, 32),
                      torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="tree is empty"):
        check_tree(empty)
    lm = CachedLM(tiny_model("llama"))
    lm.prefill([PROMPT])
    (p,) = RowProposals([empty]).score(lm, [PROMPT], GREEDY, 32)
    assert p.shape == (1, 32) and lm.length == PROMPT.shape[-1]  # the root alone: a plain step


@pytest.mark.parametrize("parents", [[-1, 2, 0], [-1, 0, 5], [-1, -2, 0], [-1, 1, 0]])
def test_parent_out_of_range_or_not_topological(parents):
    lm = CachedLM(tiny_model("llama"))
    lm.prefill([PROMPT])
    with pytest.raises(ValueError, match="parent must be -1"):
        RowProposals([hand_tree([1, 2, 3], parents)]).score(lm, [PROMPT], GREEDY, 32)


def test_tree_wider_than_the_pass_limit():
    target = tiny_model("llama", seed=0, scale=20.0)
    drafter = ModelTreeDrafter(target, branches=(3, 2), depth=4, nodes=12)
    with pytest.raises(ValueError, match="pass limit is max_nodes=8"):
        tree_generate(target, drafter, PROMPT, sampling=GREEDY, max_new_tokens=10, max_nodes=8)


def test_a_batch_of_one_prompt_twice_gives_it_twice():
    target = tiny_model("llama")
    alone = tree_generate(target, NGramTreeDrafter(), PROMPT, sampling=GREEDY, max_new_tokens=4).tokens
    out = tree_generate(target, NGramTreeDrafter(), PROMPT.repeat(2, 1), sampling=GREEDY, max_new_tokens=4)
    assert all(torch.equal(t, alone) for t in out.tokens)


def test_backend_without_4d_mask_is_refused():
    target = tiny_model("llama")
    target.config._attn_implementation = "flash_attention_2"  # only the name is read before any forward
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        tree_generate(target, NGramTreeDrafter(), PROMPT, sampling=GREEDY, max_new_tokens=4)


def test_bad_drafter_settings():
    with pytest.raises(ValueError, match="children must be one of"):
        ModelTreeDrafter(tiny_model("llama"), children="beam")
    with pytest.raises(ValueError, match="min_ngram"):
        NGramTreeDrafter(max_ngram=1, min_ngram=2)


# ---------------------------------------------------------------- exactness at sequence level

N_TOKENS = 3
REPEATING = torch.tensor([[0, 3, 1, 2, 3, 1, 2, 4, 3, 1]])  # n-gram matches exist


N_PASS = 500  # samples for a right rule (it passes at any count); the power test below uses N_SAMPLES


def model_tree(children, branches=(3,), hybrid=None):
    """3 new tokens: a round drafts at most depth 2 (tree_generate never drafts past the budget); hybrid: an
    n-gram trie next to the model tree (HybridTreeDrafter)."""
    options = {"branches": branches, "depth": 2, "nodes": 8, "children": children}
    return lambda draft: ModelTreeDrafter(draft, **options) if hybrid is None else HybridTreeDrafter(
        draft, hybrid, **options)


EXACT_CASES = [
    pytest.param(lambda d: NGramTreeDrafter(matches=3, depth=2, nodes=8), Sampling(1.0), id="ngram-T1"),
    pytest.param(lambda d: NGramTreeDrafter(matches=3, depth=2, nodes=8), Sampling(0.5, top_k=3), id="ngram-T0.5-topk"),
    pytest.param(model_tree("top", (3, 2)), Sampling(1.0), id="top-T1"),
    pytest.param(model_tree("top"), Sampling(1.5, top_p=0.8), id="top-T1.5-topp"),
    pytest.param(model_tree("iid"), Sampling(1.0), id="iid-T1"),
    pytest.param(model_tree("iid", (2, 2)), Sampling(0.5), id="iid-T0.5"),
    pytest.param(model_tree("distinct", (3, 2)), Sampling(1.5), id="distinct-T1.5"),
    pytest.param(model_tree("distinct"), Sampling(1.0, top_k=3), id="distinct-topk"),
    pytest.param(model_tree("distinct"), Sampling(1.0, top_p=0.8), id="distinct-topp"),
    pytest.param(
        model_tree("distinct", hybrid=NGramTreeDrafter(matches=2, depth=2, nodes=4)),
        Sampling(1.0),
        id="hybrid-T1",
    ),
]


# make test: distinct children in the loop through tests/test_shared_cache.py's tree (depth 2, T = 1), and exactly
# enumerated in tests/test_tree_accept.py; i.i.d. and hybrid children in the loop through test_tree_auto.py
@pytest.mark.parametrize("make, sampling", in_make_test(EXACT_CASES, ("ngram-T1", "top-T1")))
def test_tree_matches_target_distribution(small_vocab_pair, make, sampling):
    target, draft = small_vocab_pair
    drafter = make(draft)

    def generate(g, n):
        return tree_generate(target, drafter, REPEATING.expand(n, -1), sampling=sampling,
                             max_new_tokens=N_TOKENS, generator=g).tokens

    counts = batch_counts(generate, 5, N_TOKENS, seed=5, n=N_PASS)
    assert chi_square_pvalue(counts, sequence_distribution(target, REPEATING, N_TOKENS, sampling)) > PASS


class OriginalQ(RowDrafter):
    """A deliberately wrong tree: distinct children relabelled i.i.d. and given the original q row."""

    def __init__(self, drafter):
        self.drafter, self.vocab_size = drafter, drafter.vocab_size

    def start_row(self, prompt):
        self.drafter.start([prompt])

    def propose_row(self, *args):
        tree = self.drafter.propose_row(*args)
        q = tree.q.clone()
        for parent in set(tree.parents.tolist()):
            kids = (tree.parents == parent).nonzero().flatten()
            q[kids] = tree.q[kids[0]]
        return TreeDraft(tree.tokens, tree.parents, q, torch.where(tree.modes == DISTINCT, IID, tree.modes))


@pytest.mark.exhaustive  # make test: test_tree_accept.py rejects this wrong rule on sampled rounds, and exactly
def test_chi_square_rejects_iid_rule_on_distinct_children(small_vocab_pair):
    target, draft = small_vocab_pair
    sampling = Sampling(1.0)
    drafter = OriginalQ(ModelTreeDrafter(draft, branches=(3,), depth=2, nodes=8, children="distinct"))

    def generate(g):  # one row: OriginalQ wraps one row's drafter
        return tree_generate(target, drafter, REPEATING, sampling=sampling, max_new_tokens=N_TOKENS, generator=g).tokens

    counts = sample_counts(generate, 5, N_TOKENS, seed=5)
    assert chi_square_pvalue(counts, sequence_distribution(target, REPEATING, N_TOKENS, sampling)) < REJECT
