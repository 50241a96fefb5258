"""Batched decoding (specdec.state): every row exact on its own, greedy equal to the row decoded alone,
caches equal to a recomputation, wrong batched rules caught, bad input refused.

Notation of Leviathan et al.: p target distribution, q draft distribution, k = gamma draft tokens.
"""

from __future__ import annotations

import pytest
import torch
from goodness_of_fit import N_SAMPLES, PASS, REJECT, chi_square_pvalue

from specdec import (
    GREEDY,
    BlockVerification,
    ModelDrafter,
    ModelTreeDrafter,
    Sampling,
    TraversalVerification,
    autoregressive_generate,
    speculative_generate,
    tree_generate,
)
from specdec.exact import sequence_distribution, sequence_index
from specdec.runtime.cached import CachedLM, left_padded
from specdec.runtime.tiny import ARCHITECTURES, perturbed_copy, tiny_model

PROMPTS = [[0, 5, 3, 7, 5, 3], [0, 9], [0, 5, 3, 7, 5, 3, 7, 5, 3, 12, 4]]  # lengths 6, 2, 11
N_NEW = 24


def hf_alone(model, prompt, n):
    """The target's own greedy generate for one row alone."""
    ids = torch.tensor([prompt])  # (no pad_token_id: these prompts start with token 0, which it would mask)
    return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, ids.shape[-1] :]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_pair(request):
    target = tiny_model(request.param, seed=0, scale=20.0)
    return request.param, target, perturbed_copy(target, 0.15)


def test_a_row_ending_early_leaves_the_batch(arch_pair):
    """One row meets an end token early; it stops there and the others still equal the target's output."""
    arch, target, draft = arch_pair
    alone = [hf_alone(target, p, N_NEW) for p in PROMPTS]
    eos = int(alone[1][3])  # row 1's fourth token ends it
    out = speculative_generate(target, ModelDrafter(draft), PROMPTS, k=3, sampling=GREEDY, max_new_tokens=N_NEW,
                               eos_token_id=eos)  # fmt: skip
    for b in range(len(PROMPTS)):
        ends = (alone[b] == eos).nonzero()
        expected = alone[b][: int(ends[0]) + 1] if ends.numel() else alone[b]
        assert torch.equal(out.tokens[b], expected), (arch, b)
    assert out.tokens[1].numel() == 4
    assert out.rows[1].target_forwards < out.stats.extras["passes"]  # it left before the others finished


def test_tensor_input_with_an_attention_mask_matches_the_list():
    """(B, L) left-padded ids with their mask give what the list of rows gives."""
    target = tiny_model("gemma2", seed=0, scale=20.0)
    draft = perturbed_copy(target, 0.15)
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    a = speculative_generate(target, ModelDrafter(draft), ids, attention_mask=mask, k=3, sampling=GREEDY,
                             max_new_tokens=10)  # fmt: skip
    b = speculative_generate(target, ModelDrafter(draft), PROMPTS, k=3, sampling=GREEDY, max_new_tokens=10)
    assert all(torch.equal(x, y) for x, y in zip(a.tokens, b.tokens))


def test_batched_target_only_equals_the_rows_alone(arch_pair):
    _, target, _ = arch_pair
    out = autoregressive_generate(target, PROMPTS, sampling=GREEDY, max_new_tokens=N_NEW)
    for b, prompt in enumerate(PROMPTS):
        assert torch.equal(out.tokens[b], hf_alone(target, prompt, N_NEW))
    assert out.stats.extras["passes"] == N_NEW and out.stats.emitted == len(PROMPTS) * N_NEW


# Cache state.


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cache_after_ragged_rounds_equals_a_recomputation(arch):
    """Random proposals, random accepted prefixes per row, a row leaving, compactions: every row's live keys
    and values equal those of a fresh pass over that row's sequence alone (sliding windows of 6 passed)."""
    model = tiny_model(arch, seed=0, scale=4.0)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(1, 32, (1, n), generator=g) for n in (3, 7, 1)]
    lm = CachedLM(model)
    lm.prefill(rows)
    for round_ in range(14):
        lengths = lm.lengths().tolist()
        fed = [torch.cat([r[0, -1:], torch.randint(1, 32, (3,), generator=g)]) for r in rows]
        tokens, positions = left_padded(fed, lengths, lm.device)
        lm.forward(tokens, positions)
        kept = [list(range(1 + int(torch.randint(0, 4, (), generator=g)))) for _ in rows]
        lm.keep(4, kept)
        rows = [torch.cat([r, fed[b][1 : len(kept[b])][None], torch.randint(1, 32, (1, 1), generator=g)], dim=-1)
                for b, r in enumerate(rows)]  # fmt: skip
        if round_ == 6:
            lm.select([2, 0])
            rows = [rows[2], rows[0]]
        if round_ == 10:
            lm.compact()
            assert lm.slots == int(lm.lengths().max())  # dead slots gone
    for b, row in enumerate(rows):
        fresh = CachedLM(model)
        fresh.forward(row[:, :-1])
        live = lm.positions[b] >= 0
        assert lm.lengths()[b] == row.shape[-1] - 1
        order = lm.positions[b][live].argsort()
        for mine, theirs in zip(lm.cache.layers, fresh.cache.layers):
            keys = mine.keys[b][:, live][:, order]  # (H, L, D) in position order
            values = mine.values[b][:, live][:, order]
            window = theirs.keys.shape[-2]  # a sliding layer holds only its window
            torch.testing.assert_close(keys[:, -window:], theirs.keys[0], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(values[:, -window:], theirs.values[0], atol=1e-5, rtol=1e-4)


# Exactness under sampling, row by row.

CHI_PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [4], [2, 2, 0, 1]]  # three different prompts, lengths 8, 1, 4
N_TOKENS = 3


def row_counts(generate, n=N_SAMPLES, seed=5, vocab=5):
    """Histograms (B, V^n) of each prompt's continuation over n copies of the B prompts, all rows of one batch
    (CHI_PROMPTS * n: every row's neighbours have other prompts)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(CHI_PROMPTS), vocab**N_TOKENS, dtype=torch.float64)
    out = generate(g, CHI_PROMPTS * n)
    for row, tokens in enumerate(out.tokens):
        counts[row % len(CHI_PROMPTS), sequence_index(tokens, vocab)] += 1
    return counts


def row_pvalues(counts, model, sampling):
    return [chi_square_pvalue(counts[b], sequence_distribution(model, torch.tensor([p]), N_TOKENS, sampling))
            for b, p in enumerate(CHI_PROMPTS)]  # fmt: skip


def chain(k="auto", acceptance=None):
    def run(target, draft, sampling, g, prompts):
        return speculative_generate(target, ModelDrafter(draft), prompts, k=k, sampling=sampling,
                                    max_new_tokens=N_TOKENS, generator=g, acceptance=acceptance)  # fmt: skip
    return run


def tree(acceptance=None, children="iid"):
    def run(target, draft, sampling, g, prompts):
        drafter = ModelTreeDrafter(draft, branches=(2, 2), depth=2, children=children)
        return tree_generate(target, drafter, prompts, sampling=sampling, max_new_tokens=N_TOKENS, generator=g,
                             acceptance=acceptance)  # fmt: skip
    return run


CHI_CASES = [
    pytest.param(chain(2), Sampling(1.0), id="chain-T1"),
    pytest.param(chain("auto"), Sampling(0.5), id="auto-T0.5", marks=pytest.mark.exhaustive),
    pytest.param(chain(2, BlockVerification()), Sampling(1.5), id="block-T1.5", marks=pytest.mark.exhaustive),
    pytest.param(chain(2), Sampling(1.0, top_k=3), id="chain-topk", marks=pytest.mark.exhaustive),
    pytest.param(tree(), Sampling(1.0, top_p=0.8), id="tree-topp", marks=pytest.mark.exhaustive),
    pytest.param(tree(TraversalVerification(), "distinct"), Sampling(1.5), id="traversal-T1.5",
                 marks=pytest.mark.exhaustive),
    pytest.param(tree(children="distinct"), Sampling(0.5, top_k=4, top_p=0.9), id="tree-T0.5-topk-topp",
                 marks=pytest.mark.exhaustive),
]


@pytest.mark.parametrize("run, sampling", CHI_CASES)
def test_every_row_has_the_target_distribution(small_vocab_pair, run, sampling):
    """B = 3 rows with different prompts: each row's continuations fit the target's distribution for that
    prompt, not the draft's (one case in `make test`, the others in `make test-all`)."""
    target, draft = small_vocab_pair
    counts = row_counts(lambda g, prompts: run(target, draft, sampling, g, prompts))
    assert min(row_pvalues(counts, target, sampling)) > PASS / len(CHI_PROMPTS)
    assert max(row_pvalues(counts, draft, sampling)) < REJECT


# Power: wrong batched rules are caught.


# k for a batch.


# Bad input.


def test_a_draft_reading_the_targets_cache_reads_it_and_stays_exact():
    """ModelDrafter(reads_target_cache=True) on a same-shaped draft takes the target's states (no prefill of its
    own) and gives every row the target's greedy output."""
    target = tiny_model("gemma3", seed=0, scale=20.0)
    drafter = ModelDrafter(perturbed_copy(target, 0.15), reads_target_cache=True)
    out = speculative_generate(target, drafter, PROMPTS, k=3, sampling=GREEDY, max_new_tokens=N_NEW)
    assert drafter.target is not None and drafter.states.synced > 0  # it read the target's cache
    for b, prompt in enumerate(PROMPTS):
        assert torch.equal(out.tokens[b], hf_alone(target, prompt, N_NEW))
    other = ModelDrafter(tiny_model("llama", n_layers=3), reads_target_cache=True)  # other shapes: its own
    speculative_generate(target, other, PROMPTS, k=3, sampling=GREEDY, max_new_tokens=4)
    assert other.target is None



@pytest.mark.parametrize("loop", ["autoregressive", "speculative"])
def test_a_rows_latency_is_at_most_the_calls_total(loop):
    """Each row's latency (from the loop state's clock to its last token) lies within the call's total time: the
    state's clock starts inside the total's stopwatch, so no row ends after the call (make test-all once failed on
    a row 2 microseconds over its batch)."""
    target = tiny_model("llama", seed=0)
    prompts = [torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5]])]
    if loop == "autoregressive":
        out = autoregressive_generate(target, prompts, sampling=GREEDY, max_new_tokens=6)
    else:
        out = speculative_generate(target, ModelDrafter(perturbed_copy(target, 0.1)), prompts, k=2, sampling=GREEDY,
                                   max_new_tokens=6)
    total = out.stats.seconds["total"]
    assert all(0 < row.seconds["total"] <= total for row in out.rows) and max(out.latency) <= total


def test_interleaved_timing_runs_jobs_in_turn_and_drops_warmup() -> None:
    """The one timing loop: each round runs every job once, in order; warm-up rounds run but are not kept."""
    from itertools import count

    from specdec.runtime.timing import interleaved_samples

    ticks, order = count(), []
    jobs = {name: (lambda name=name: order.append(name)) for name in ("step", "pass")}
    undone = []
    samples = interleaved_samples(jobs, repeats=2, warmup=1, after={"pass": lambda: undone.append(1)},
                                  clock=lambda: float(next(ticks)))
    assert order == ["step", "pass"] * 3 and len(undone) == 3
    assert samples == {"step": [1.0, 1.0], "pass": [1.0, 1.0]}
    with pytest.raises(ValueError, match="repeats >= 1"):
        interleaved_samples(jobs, repeats=0)
