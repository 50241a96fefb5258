"""A draft head on the compiled runtime (specdec.draft.head_runtime): the same drafts as the eager head, so the
same outputs, and the target's distribution kept.

Every test compiles heads of its own (never a fixture's, which other tests run eager), with inductor's default
GEMMs (autotune=False: seconds per graph). The autotuned path is what the bench measures (docs/heads.md).
"""

from __future__ import annotations

import pytest
import torch
from fakes import GREEDY_PROMPT, hf_greedy
from goodness_of_fit import PASS, chi_square_pvalue, sample_counts

from specdec import GREEDY, Sampling, speculative_generate, tree_generate
from specdec.draft.head import DraftHead, load_head, save_head
from specdec.draft.head_drafter import HeadDrafter, HeadTreeDrafter
from specdec.draft.head_runtime import compile_head, compiled_head, padded_inputs
from specdec.exact import sequence_distribution
from specdec.runtime.packed import PackedLinear, unavailable_reason
from specdec.runtime.tiny import ARCHITECTURES, tiny_model

pytestmark = pytest.mark.xdist_group("inductor")  # one worker compiles: inductor's first compile in a process costs ~30 s cold
N_NEW = 20
needs_avx512 = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
CAPACITY = 64


def two_heads(target, tmp_path, vocab=None) -> tuple[DraftHead, DraftHead]:
    """The same trained-at-random head twice (one to compile, one to keep eager)."""
    torch.manual_seed(0)
    folder = save_head(DraftHead(target, layers=1, vocab=vocab), tmp_path).parent
    return load_head(folder, target), load_head(folder, target)


PROMPT = torch.tensor([[0, 3, 1]])


def drafts(target, head, sampling, seed=0, k=3):
    """Tokens and the accepted count of a speculative run, and every q the head reported."""
    reported = []

    class Recording(HeadDrafter):
        def propose_row(self, *args):
            draft = super().propose_row(*args)
            reported.append(draft.q)
            return draft

    out = speculative_generate(target, Recording(head), PROMPT, k=k, sampling=sampling, max_new_tokens=N_NEW,
                               generator=torch.Generator().manual_seed(seed))
    return out, reported


@pytest.mark.exhaustive  # make test: compiled heads against target-only (below) and over every sequence length
@pytest.mark.parametrize("sampling", [GREEDY, Sampling(1.0)], ids=["greedy", "T1"])
def test_a_compiled_head_drafts_what_the_eager_head_drafts(small_vocab_pair, tmp_path, sampling):
    target, _ = small_vocab_pair  # a few tokens: a random head's drafts are often accepted
    eager, compiled = two_heads(target, tmp_path)
    compile_head(compiled, capacity=CAPACITY)
    expected, expected_q = drafts(target, eager, sampling)
    out, q = drafts(target, compiled, sampling)
    assert torch.equal(out.tokens, expected.tokens) and out.stats.accepted == expected.stats.accepted
    assert len(q) == len(expected_q)
    assert out.stats.accepted > 0 or sampling.greedy  # at T=1 drafts are accepted: catch-ups of several positions
    for mine, theirs in zip(q, expected_q):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)
    graphs = compiled_head(compiled).record
    assert graphs.eager_reason is None and len(graphs.seconds) >= (1 if sampling.greedy else 2)  # widths ran


@needs_avx512
@pytest.mark.exhaustive  # make test: the compiled head above, PackedLinear on the compiled runtime in test_packed.py
@pytest.mark.parametrize("cpp_wrapper", [False, True], ids=["python", "cpp_wrapper"])
def test_a_packed_head_drafts_what_the_eager_head_drafts(small_vocab_pair, tmp_path, cpp_wrapper):
    target, _ = small_vocab_pair
    eager, compiled = two_heads(target, tmp_path)
    compile_head(compiled, capacity=CAPACITY, packed_rows=(1, 16), cpp_wrapper=cpp_wrapper)
    assert isinstance(compiled.out, PackedLinear) and isinstance(compiled.fc, PackedLinear)  # W_S is packed too
    expected, expected_q = drafts(target, eager, Sampling(1.0))
    out, q = drafts(target, compiled, Sampling(1.0))
    assert torch.equal(out.tokens, expected.tokens) and out.stats.accepted == expected.stats.accepted > 0
    for mine, theirs in zip(q, expected_q, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)
    assert compiled_head(compiled).record.eager_reason is None


@pytest.mark.parametrize("arch", [pytest.param(a, marks=() if a == "llama" else pytest.mark.exhaustive)
                                  for a in ARCHITECTURES])
def test_greedy_with_a_compiled_head_equals_target_only(arch, tmp_path):
    target = tiny_model(arch, seed=0, scale=20.0)
    head = two_heads(target, tmp_path)[0]
    compile_head(head, capacity=CAPACITY)
    expected = hf_greedy(target, GREEDY_PROMPT, N_NEW)
    chain = speculative_generate(target, HeadDrafter(head), GREEDY_PROMPT, k=3, sampling=GREEDY,
                                 max_new_tokens=N_NEW)
    tree = tree_generate(target, HeadTreeDrafter(head, branches=(2, 1), depth=3, nodes=5), GREEDY_PROMPT,
                         sampling=GREEDY, max_new_tokens=N_NEW)
    assert torch.equal(chain.tokens, expected) and torch.equal(tree.tokens, expected)
    assert not compiled_head(head).eager


@pytest.mark.exhaustive  # make test: the compiled head drafts the eager head's tokens and q (above), and the eager
# head keeps the target's distribution (tests/test_head.py)
def test_a_compiled_head_keeps_the_target_distribution(small_vocab_pair, tmp_path):
    target, _ = small_vocab_pair
    head = two_heads(target, tmp_path, vocab=torch.tensor([3, 0, 2]))[0]
    compile_head(head, capacity=CAPACITY)
    sampling = Sampling(1.0)

    def generate(g):
        return speculative_generate(target, HeadDrafter(head), PROMPT, k=2, sampling=sampling,
                                    max_new_tokens=3, generator=g).tokens

    counts = sample_counts(generate, 5, 3, seed=7)
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, 3, sampling)) > PASS


def test_padding_repeats_the_last_query_at_the_next_positions():
    features, tokens, positions = torch.randn(1, 3, 4), torch.tensor([[5, 6, 7]]), torch.tensor([[10, 11, 12]])
    padded = padded_inputs(features, tokens, positions, 4)
    assert torch.equal(padded[1], torch.tensor([[5, 6, 7, 7]])) and torch.equal(padded[2], torch.tensor([[10, 11, 12, 13]]))
    assert torch.equal(padded[0][:, 3], features[:, 2]) and torch.equal(padded[0][:, :3], features)


def test_one_head_graph_serves_every_sequence_length(tmp_path, monkeypatch):
    """The graphs built at load serve every draft: a graph guards on its inputs' dispatch keys (drafting runs in
    inference mode) and strides (the head reads slices of the target's features, whose strides carry the sequence's
    length); a guard that fails recompiles inside a timed draft (a minute per graph with autotune)."""
    target = tiny_model("llama", seed=0, scale=20.0)
    head = two_heads(target, tmp_path)[0]
    compile_head(head, capacity=CAPACITY).build()  # every width's graph, as a run builds them at load
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)  # a recompile raises RecompileError
    for n in (4, 12):
        out = speculative_generate(target, HeadDrafter(head), GREEDY_PROMPT, k=2, sampling=GREEDY, max_new_tokens=n)
        assert out.tokens.numel() == n
