"""Wrong batched rules are caught (cutting rows to the shortest, one draw shared by all rows), k for a batch from measured costs, bad batches refused."""

from __future__ import annotations

import pytest
import torch
from goodness_of_fit import N_SAMPLES, PASS, REJECT, chi_square_pvalue
from test_batch import N_TOKENS, row_counts, row_pvalues

from specdec import (
    CostModel,
    DraftSwitch,
    ModelDrafter,
    NGramDrafter,
    NGramTreeDrafter,
    Sampling,
    TokenLevel,
    TreeCostModel,
    speculative_generate,
    tree_generate,
)
from specdec.checks import batch_rows
from specdec.exact import sequence_distribution
from specdec.runtime.tiny import tiny_model
from specdec.sampling import sample
from specdec.verify.token import residual


class CutToShortest(TokenLevel):
    """Wrong: every row cut to the batch's shortest accepted length, keeping the token it drew after its own
    accepted length (no new draw at the cut)."""

    def accept_rows(self, p, proposals, generator):
        paths, tokens = super().accept_rows(p, proposals, generator)
        shortest = min(map(len, paths))
        return [path[:shortest] for path in paths], tokens


class SharedDraws(TokenLevel):
    """Wrong: one acceptance uniform per draft position, shared by every row."""

    def accept_rows(self, p, proposals, generator):
        r = torch.rand(proposals.size, generator=generator)
        paths, tokens = [], []
        for p_b, draft in zip(p, proposals.rows):
            k = draft.size
            i = torch.arange(k)
            n = int((r[:k] < p_b[i, draft.tokens] / draft.q[i, draft.tokens]).long().cumprod(0).sum())
            nxt = residual(p_b[n], draft.q[n]) if n < k else p_b[k]
            paths.append(list(range(n)))
            tokens.append(sample(nxt[None], generator))
        return paths, tokens


def with_rule(acceptance):
    """speculative_generate with a rule whose accept_rows replaces the token-level rule's (each row on its own)."""

    def run(target, draft, prompts, sampling, g):
        return speculative_generate(target, ModelDrafter(draft), prompts, k=2, sampling=sampling,
                                    max_new_tokens=N_TOKENS, generator=g, acceptance=acceptance())
    return run


@pytest.mark.exhaustive  # `make test-all`; make test keeps the batch chi-square cases of test_batch.py
def test_cutting_rows_to_the_shortest_is_caught(small_vocab_pair):
    target, draft = small_vocab_pair
    run = with_rule(CutToShortest)
    counts = row_counts(lambda g, prompts: run(target, draft, prompts, Sampling(1.0), g))
    assert min(row_pvalues(counts, target, Sampling(1.0))) < REJECT


def joint_first_tokens(run, target, draft, n=N_SAMPLES, vocab=5):
    """Counts (V * V,) of the first tokens of rows 2i and 2i + 1 of one batch of 2n rows with the same prompt, and
    their exact joint if independent."""
    prompt = [1, 2, 3, 1]
    out = run(target, draft, [prompt] * (2 * n), Sampling(1.0), torch.Generator().manual_seed(3))
    first = torch.stack([tokens[0] for tokens in out.tokens]).view(n, 2)
    counts = torch.bincount(first[:, 0] * vocab + first[:, 1], minlength=vocab * vocab).double()
    p = sequence_distribution(target, torch.tensor([prompt]), 1, Sampling(1.0))  # (V,)
    return counts, (p[:, None] * p[None, :]).flatten()


def test_one_draw_shared_by_all_rows_is_caught_and_per_row_draws_are_not(small_vocab_pair):
    """Shared uniforms keep each row's marginal exact but couple the rows: two rows with one prompt then
    disagree with independent target samples; the token-level rule's own per-row draws do not."""
    target, draft = small_vocab_pair
    counts, independent = joint_first_tokens(with_rule(SharedDraws), target, draft)
    assert chi_square_pvalue(counts, independent) < REJECT
    counts, independent = joint_first_tokens(with_rule(TokenLevel), target, draft)
    assert chi_square_pvalue(counts, independent) > PASS


def test_auto_k_stops_speculating_where_the_pass_costs_its_width():
    """Fake costs: a pass costs its total token count, a draft step is nearly free and a_i = 0.9. At one row
    drafting pays; at 16 rows, where a pass over R (k + 1) tokens costs R (k + 1), E(k) / C(k) is largest at
    k = 0 once the pass's width dominates."""
    model = CostModel(k_max=6, draft_cost="per_token")
    for rows in (1, 16):
        for width in (1, 2, 3, 5, 7):
            model.record_pass(rows * width, 0.001 * (10 if rows == 1 else rows * width))
        model.record_draft(1, 1e-5, rows)
    model.overlap_sum, model.overlap_weight = [0.9 * 50] * 6, [50.0] * 6
    assert model.choose(20, rows=1).k >= 3
    assert model.choose(20, rows=16).k == 0


def test_bad_batches_are_refused():
    target = tiny_model("llama")
    ids = torch.tensor([[0, 1, 2], [0, 3, 4]])
    with pytest.raises(ValueError, match="attention mask has shape"):
        speculative_generate(target, ModelDrafter(target), ids, attention_mask=torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="batch size 0"):
        speculative_generate(target, ModelDrafter(target), [])
    with pytest.raises(ValueError, match="padding between tokens"):
        batch_rows(ids, torch.tensor([[1, 0, 1], [1, 1, 1]]))
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        batch_rows([[1, 2], []])
    switch = DraftSwitch({"model": ModelDrafter(target), "ngram": NGramDrafter()})
    with pytest.raises(ValueError, match="k='auto' with a DraftSwitch chooses a chain draft for one sequence"):
        speculative_generate(target, switch, ids, k="auto")
    with pytest.raises(ValueError, match="k='auto' for token trees"):
        tree_generate(target, NGramTreeDrafter(), ids, k="auto")
    with pytest.raises(ValueError, match="exceeds the model's context"):
        speculative_generate(target, ModelDrafter(target), ids, max_new_tokens=300)
    with pytest.raises(TypeError, match="TreeCostModel chooses for one sequence"):
        tree_generate(target, NGramTreeDrafter(), ids, k=TreeCostModel(4, "per_call"))
