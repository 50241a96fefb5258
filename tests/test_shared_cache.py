"""A draft that reads the target's KV cache (ModelDrafter(reads_target_cache=True)).

The draft's own states for the prompt and the accepted tokens are replaced by the target's, cast to the
draft's dtype, so the draft runs one-token steps only. Speculative sampling is exact for whatever q the
draft samples from, so the output must keep the target's distribution (chi-square in test_exactness.py)
and, at temperature 0, equal the target's greedy output on every architecture; a target cache the draft
cannot read (sliding windows, other shapes) leaves the draft computing its own states.
"""

import pytest
import torch

from specdec import GREEDY, ModelDrafter, autoregressive_generate, speculative_generate
from specdec.cached import CachedLM
from specdec.drafters import append_states, can_read_cache
from specdec.tiny import ARCHITECTURES, perturbed_copy, tiny_model

PROMPT = torch.tensor([[0, 5, 3, 7, 5, 3]])
N_NEW = 24


def draft_widths(model) -> list[int]:
    """Token counts of every forward of model from now on (a forward hook on its embedding)."""
    widths: list[int] = []
    model.get_input_embeddings().register_forward_hook(lambda m, args, out: widths.append(args[0].shape[-1]))
    return widths


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("k", [1, 3, "auto"])
def test_greedy_output_is_the_targets_with_a_draft_reading_the_target_cache(arch, k):
    target = tiny_model(arch, seed=0, scale=20.0)
    drafter = ModelDrafter(perturbed_copy(target, 0.15), reads_target_cache=True)
    expected = autoregressive_generate(target, PROMPT, sampling=GREEDY, max_new_tokens=N_NEW).tokens
    out = speculative_generate(target, drafter, PROMPT, k=k, sampling=GREEDY, max_new_tokens=N_NEW)
    assert torch.equal(out.tokens, expected), arch
    if k != "auto":  # k=auto may learn that drafting does not pay on a tiny model
        assert out.stats.accepted > 0  # the draft was used, not only plain steps


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


def test_a_sliding_window_target_cache_is_not_read():
    target = tiny_model("mistral", seed=0, scale=20.0)
    drafter = ModelDrafter(perturbed_copy(target, 0.15), reads_target_cache=True)
    widths = draft_widths(drafter.model)
    speculative_generate(target, drafter, PROMPT, k=3, sampling=GREEDY, max_new_tokens=N_NEW)
    assert drafter.target is None and max(widths) > 1  # it computed its own states


def test_other_shapes_are_not_read():
    target = tiny_model("llama", seed=0)
    assert not can_read_cache(CachedLM(tiny_model("llama", seed=1, n_layers=1)), CachedLM(target))
    assert can_read_cache(CachedLM(perturbed_copy(target, 0.1)), CachedLM(target))


def test_the_drafter_reads_only_the_cache_offered_before_its_start():
    """A loop that offers no cache (e.g. a tree loop) gets a drafter computing its own states."""
    target = tiny_model("llama", seed=0, scale=20.0)
    drafter = ModelDrafter(perturbed_copy(target, 0.15), reads_target_cache=True)
    speculative_generate(target, drafter, PROMPT, k=3, sampling=GREEDY, max_new_tokens=4)
    drafter.start(PROMPT)
    assert drafter.target is None and drafter.lm.length == PROMPT.shape[-1] - 1


def test_copied_states_are_the_targets_cast_to_the_draft_dtype():
    target = tiny_model("llama", seed=0)
    theirs, mine = CachedLM(target), CachedLM(perturbed_copy(target, 0.1).to(torch.bfloat16))
    theirs.prefill(PROMPT)
    append_states(mine, theirs, 0)
    assert mine.length == theirs.length == PROMPT.shape[-1] - 1
    for a, b in zip(mine.cache.layers, theirs.cache.layers):
        assert a.keys.dtype == torch.bfloat16
        assert torch.equal(a.keys, b.keys.to(torch.bfloat16)) and torch.equal(a.values, b.values.to(torch.bfloat16))
    theirs.forward(torch.tensor([[4, 2]]))
    append_states(mine, theirs, mine.length)  # only the new positions are appended
    assert mine.length == theirs.length
    assert torch.equal(mine.cache.layers[0].keys[..., -2:, :], theirs.cache.layers[0].keys[..., -2:, :].bfloat16())


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])  # gpt_neox's config has no head_dim field
def test_a_draft_of_another_width_is_not_read(arch):
    """Same architecture and layer count, other hidden size: its attention could not take the target's keys."""
    target = tiny_model(arch, seed=0)
    wider = tiny_model(arch, seed=0, hidden_size=64, intermediate_size=128)
    assert not can_read_cache(CachedLM(wider), CachedLM(target))
    assert not can_read_cache(CachedLM(tiny_model("gemma", seed=0)), CachedLM(target))  # another architecture
