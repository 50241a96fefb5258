"""Options of head drafting: q computed on the subset S alone, a head run in another dtype than its target
(bfloat16), chains that stop where the head is unsure (`confidence`). Each must leave speculative sampling exact."""

from __future__ import annotations

import pytest
import torch
from fakes import GREEDY_PROMPT
from goodness_of_fit import PASS, batch_counts, chi_square_pvalue

from specdec import GREEDY, Sampling, autoregressive_generate, speculative_generate
from specdec.draft.head import DraftHead, load_head, save_head
from specdec.draft.head_drafter import HeadDrafter, load_head_drafter
from specdec.exact import sequence_distribution
from specdec.runtime.tiny import ARCHITECTURES, tiny_model
from specdec.sampling import probabilities

PROMPT = torch.tensor([[0, 3, 1]])
N_TOKENS = 3

# make test: two architectures here (gemma3: sliding windows); head drafters on the others in test_greedy_matrix.py
SOME_ARCHS = pytest.mark.parametrize("arch_case", [pytest.param(a, marks=() if a in ("llama", "gemma3") else
                                                                pytest.mark.exhaustive) for a in ARCHITECTURES],
                                     indirect=True)  # fmt: skip


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(1.0), Sampling(0.7, top_p=0.9), Sampling(1.3, top_k=3)],
                         ids=["greedy", "T1", "T0.7-top_p0.9", "T1.3-top_k3"])
def test_q_on_the_subset_equals_the_processed_full_logits(sampling):
    target = tiny_model("llama", seed=0)
    torch.manual_seed(1)
    head = DraftHead(target, layers=1, vocab=torch.tensor([7, 2, 30, 11, 5, 19]))
    predicted = torch.randn(3, target.config.hidden_size)
    for width in (None, 20):  # 20: a logits width below some of S's ids (those are dropped, as logits() drops them)
        expected = probabilities(head.logits(predicted, width), sampling)
        torch.testing.assert_close(head.probabilities(predicted, sampling, width), expected)
        finite = torch.isfinite(head.logits(predicted, width)[0]).nonzero().flatten()
        assert sorted(head.draft_ids(width).tolist()) == finite.tolist()  # what drafting and trees draw from


@SOME_ARCHS
def test_a_bfloat16_head_on_a_float32_target_keeps_greedy_output(arch_case, tmp_path):
    _, target, _, expected = arch_case
    torch.manual_seed(0)
    folder = save_head(DraftHead(target, layers=1, vocab=torch.arange(0, 32, 2)), tmp_path).parent
    drafter = load_head_drafter(target, str(folder), dtype="bfloat16")
    assert {p.dtype for p in drafter.head.parameters()} == {torch.bfloat16}
    assert drafter.head.out_weight.dtype == torch.bfloat16 and target.dtype == torch.float32
    out = speculative_generate(target, drafter, GREEDY_PROMPT, k=3, sampling=GREEDY, max_new_tokens=expected.numel())
    assert torch.equal(out.tokens, expected)


def test_a_bfloat16_head_keeps_the_target_distribution(small_vocab_pair, tmp_path):
    target, _ = small_vocab_pair
    torch.manual_seed(0)
    folder = save_head(DraftHead(target, layers=1, vocab=torch.tensor([3, 0, 2])), tmp_path).parent
    drafter = HeadDrafter(load_head(folder, target, "bfloat16"))
    sampling = Sampling(1.0)

    def generate(g, n):
        return speculative_generate(target, drafter, PROMPT.expand(n, -1), k=2, sampling=sampling,
                                    max_new_tokens=N_TOKENS, generator=g).tokens

    counts = batch_counts(generate, 5, N_TOKENS, seed=5)
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) > PASS


@pytest.mark.parametrize("dtype", ["int8", "float128", torch.long])
def test_a_head_refuses_a_dtype_that_is_not_floating_point(dtype, tmp_path):
    target = tiny_model("llama", seed=0)
    folder = save_head(DraftHead(target, layers=1), tmp_path).parent
    with pytest.raises(ValueError, match="floating-point"):
        load_head(folder, target, dtype)


class Recording(HeadDrafter):
    """Counts the drafts it proposes by length."""

    lengths: list[int]

    def propose_row(self, sequence, k, sampling, vocab_size, generator):
        draft = super().propose_row(sequence, k, sampling, vocab_size, generator)
        self.lengths.append(draft.size)
        return draft


def test_a_confident_chain_keeps_greedy_output_and_stops_where_the_head_is_unsure():
    target = tiny_model("llama", seed=0, scale=20.0)
    torch.manual_seed(0)
    head = DraftHead(target, layers=1, vocab=torch.arange(0, 32, 2))
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    expected = autoregressive_generate(target, prompt, sampling=GREEDY, max_new_tokens=24).tokens
    drafter = Recording(head, confidence=0.25)
    drafter.lengths = []
    out = speculative_generate(target, drafter, prompt, k=3, sampling=GREEDY, max_new_tokens=24)
    assert torch.equal(out.tokens, expected)
    assert {0, 1, 2, 3} <= set(drafter.lengths)  # chains of k = 3 cut at every length, and whole
    assert out.stats.draft_forwards == sum(drafter.lengths)


def test_a_confident_chain_keeps_the_target_distribution(small_vocab_pair):
    target, _ = small_vocab_pair
    torch.manual_seed(0)
    drafter = Recording(DraftHead(target, layers=1, vocab=torch.tensor([3, 0, 2])), confidence=0.42)
    drafter.lengths = []
    sampling = Sampling(1.0)

    def generate(g, n):
        return speculative_generate(target, drafter, PROMPT.expand(n, -1), k=2, sampling=sampling,
                                    max_new_tokens=N_TOKENS, generator=g).tokens

    counts = batch_counts(generate, 5, N_TOKENS, seed=5)
    assert {0, 1} <= set(drafter.lengths)  # chains of k = 2 cut before their first and their second token
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) > PASS


@pytest.mark.parametrize("confidence", [-0.1, 1.0])
def test_a_confidence_outside_0_1_is_refused(confidence):
    target = tiny_model("llama", seed=0)
    with pytest.raises(ValueError, match="confidence"):
        HeadDrafter(DraftHead(target, layers=1), confidence=confidence)


@SOME_ARCHS
def test_a_head_cut_to_its_most_frequent_tokens_drafts_from_them_and_stays_exact_greedily(arch_case, tmp_path):
    _, target, _, expected = arch_case
    torch.manual_seed(0)
    ranked = torch.tensor([6, 2, 30, 11, 5, 19, 0, 8])  # most frequent first
    folder = save_head(DraftHead(target, layers=1, vocab=ranked), tmp_path).parent
    drafter = load_head_drafter(target, str(folder), vocab=3)
    assert drafter.head.vocab.tolist() == [6, 2, 30] and drafter.head.out_weight.shape[0] == 3
    torch.testing.assert_close(drafter.head.out_weight, target.get_output_embeddings().weight[[6, 2, 30]])
    out = speculative_generate(target, drafter, GREEDY_PROMPT, k=3, sampling=GREEDY, max_new_tokens=expected.numel())
    assert torch.equal(out.tokens, expected)


def test_a_cut_that_the_head_cannot_make_is_refused(tmp_path):
    target = tiny_model("llama", seed=0)
    ranked = save_head(DraftHead(target, layers=1, vocab=torch.tensor([4, 1, 7])), tmp_path / "ranked").parent
    whole = save_head(DraftHead(target, layers=1), tmp_path / "whole").parent
    for folder, n, message in ((ranked, 4, "1..3"), (ranked, 0, "1..3"), (whole, 2, "whole vocabulary")):
        with pytest.raises(ValueError, match=message):
            load_head(folder, target, vocab=n)
