"""A draft that reads the target's KV cache (ModelDrafter(reads_target_cache=True)).

The draft's own states for the prompt and the accepted tokens are replaced by the target's, cast to the
draft's dtype, so the draft runs one-token steps only. Speculative sampling is exact for whatever q the
draft samples from, so the output must keep the target's distribution (chi-square in test_exactness.py)
and, at temperature 0, equal the target's greedy output on every architecture; a target cache the draft
cannot read (sliding windows, other shapes) leaves the draft computing its own states.
"""

import pytest
import torch
from goodness_of_fit import PASS, REJECT, chi_square_pvalue, sample_counts

from specdec import (
    GREEDY,
    ModelDrafter,
    Sampling,
    speculative_generate,
    tree_generate,
)
from specdec.draft.model import ModelTreeDrafter, can_read_cache
from specdec.exact import sequence_distribution
from specdec.runtime.cached import CachedLM
from specdec.runtime.tiny import perturbed_copy, tiny_model

PROMPT = torch.tensor([[0, 5, 3, 7, 5, 3]])
N_NEW = 24
TREE_PROMPT = torch.tensor([[0, 3, 1, 0, 3]])  # 5-token vocabulary (small_vocab_pair)


def draft_widths(model) -> list[int]:
    """Token counts of every forward of model from now on (a forward hook on its embedding)."""
    widths: list[int] = []
    model.get_input_embeddings().register_forward_hook(lambda m, args, out: widths.append(args[0].shape[-1]))
    return widths


def test_a_full_attention_draft_reads_the_cache_and_runs_one_token_steps_only():
    target = tiny_model("llama", seed=0, scale=20.0)
    draft = perturbed_copy(target, 0.15).to(torch.bfloat16)
    widths = draft_widths(draft)
    drafter = ModelDrafter(draft, reads_target_cache=True)
    out = speculative_generate(target, drafter, PROMPT, k=3, sampling=GREEDY, max_new_tokens=N_NEW)
    assert drafter.target is not None
    assert widths and set(widths) == {1}  # no prefill, no catch-up pass
    assert out.stats.draft_forwards == len(widths)
    own = draft_widths(draft)
    speculative_generate(target, ModelDrafter(draft), PROMPT, k=3, sampling=GREEDY, max_new_tokens=N_NEW)
    assert max(own) == PROMPT.shape[-1] - 1  # without it, the draft prefills the prompt itself


def test_a_sliding_window_target_cache_is_read_too():
    """Every cache layer keeps all its states (a window is a mask), so a copy of a sliding-window target reads
    the target's cache as well: one-token steps only, and the target's greedy output."""
    target = tiny_model("mistral", seed=0, scale=20.0)
    drafter = ModelDrafter(perturbed_copy(target, 0.15), reads_target_cache=True)
    widths = draft_widths(drafter.model)
    out = speculative_generate(target, drafter, PROMPT, k=3, sampling=GREEDY, max_new_tokens=N_NEW)
    assert drafter.target is not None and set(widths) == {1}
    assert torch.equal(out.tokens, target.generate(PROMPT, max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                                                   do_sample=False)[0, PROMPT.shape[-1] :])


def test_other_shapes_are_not_read():
    target = tiny_model("llama", seed=0)
    assert not can_read_cache(CachedLM(tiny_model("llama", seed=1, n_layers=1)), CachedLM(target))
    assert can_read_cache(CachedLM(perturbed_copy(target, 0.1)), CachedLM(target))


def test_the_drafter_reads_only_the_cache_offered_before_its_start():
    """A loop that offers no cache (e.g. a tree loop) gets a drafter computing its own states."""
    target = tiny_model("llama", seed=0, scale=20.0)
    drafter = ModelDrafter(perturbed_copy(target, 0.15), reads_target_cache=True)
    speculative_generate(target, drafter, PROMPT, k=3, sampling=GREEDY, max_new_tokens=4)
    drafter.start([PROMPT])
    assert drafter.target is None and drafter.lm.length == PROMPT.shape[-1] - 1


def test_copied_states_are_the_targets_cast_to_the_draft_dtype():
    target = tiny_model("llama", seed=0)
    theirs, mine = CachedLM(target), CachedLM(perturbed_copy(target, 0.1).to(torch.bfloat16))
    theirs.prefill([PROMPT])
    mine.copy_from(theirs, 0)
    assert mine.length == theirs.length == PROMPT.shape[-1] - 1
    for a, b in zip(mine.cache.layers, theirs.cache.layers):
        assert a.keys.dtype == torch.bfloat16
        assert torch.equal(a.keys, b.keys.to(torch.bfloat16)) and torch.equal(a.values, b.values.to(torch.bfloat16))
    theirs.forward(torch.tensor([[4, 2]]))
    mine.copy_from(theirs, mine.length)  # only the new positions are appended
    assert mine.length == theirs.length
    assert torch.equal(mine.cache.layers[0].keys[..., -2:, :], theirs.cache.layers[0].keys[..., -2:, :].bfloat16())


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])  # gpt_neox's config has no head_dim field
def test_a_draft_of_another_width_is_not_read(arch):
    """Same architecture and layer count, other hidden size: its attention could not take the target's keys."""
    target = tiny_model(arch, seed=0)
    wider = tiny_model(arch, seed=0, hidden_size=64, intermediate_size=128)
    assert not can_read_cache(CachedLM(wider), CachedLM(target))
    assert not can_read_cache(CachedLM(tiny_model("gemma", seed=0)), CachedLM(target))  # another architecture


def test_a_model_tree_reading_the_target_cache_runs_no_prefill():
    target = tiny_model("llama", seed=0, scale=20.0)
    draft = perturbed_copy(target, 0.15).to(torch.bfloat16)
    widths = draft_widths(draft)
    drafter = ModelTreeDrafter(draft, branches=(2,), depth=4, nodes=8, reads_target_cache=True)
    out = tree_generate(target, drafter, PROMPT, sampling=GREEDY, max_new_tokens=N_NEW)
    assert drafter.states.target is not None and out.stats.accepted > 0
    assert max(widths) <= 2  # the root's step feeds the last token (and, after a full accept, nothing older)


def test_a_model_tree_reading_the_target_cache_keeps_the_target_distribution(small_vocab_pair):
    target, draft = small_vocab_pair
    sampling = Sampling(1.0)
    drafter = ModelTreeDrafter(draft, branches=(3,), depth=2, nodes=8, children="distinct", reads_target_cache=True)

    def generate(g):  # one row: a tree reads the target's cache on a single sequence
        return tree_generate(target, drafter, TREE_PROMPT, sampling=sampling, max_new_tokens=3, generator=g).tokens

    counts = sample_counts(generate, 5, 3, seed=13)
    assert drafter.states.target is not None
    assert chi_square_pvalue(counts, sequence_distribution(target, TREE_PROMPT, 3, sampling)) > PASS
    assert chi_square_pvalue(counts, sequence_distribution(draft, TREE_PROMPT, 3, sampling)) < REJECT
