"""Hugging Face generate as a method next to ours (specdec.hf): plain, assisted and prompt lookup give the target's
greedy output; a batch is plain generate, left-padded, each row cut at its first end token."""

import pytest
import torch
from fakes import GREEDY_PROMPT

from specdec import GREEDY, HFOptions, autoregressive_generate, hf_generate
from specdec.runtime.tiny import perturbed_copy, tiny_model

N_NEW = 8


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, scale=20.0)


@pytest.mark.parametrize("options", [
    HFOptions(),
    HFOptions(assistant=True, num_assistant_tokens=3, schedule="constant", confidence_threshold=0.0),
    HFOptions(prompt_lookup=3),
])  # fmt: skip
def test_greedy_equals_the_targets_greedy(target, options):
    expected = autoregressive_generate(target, GREEDY_PROMPT, sampling=GREEDY, max_new_tokens=N_NEW).tokens
    out = hf_generate(target, GREEDY_PROMPT, sampling=GREEDY, max_new_tokens=N_NEW, seed=0, eos_token_id=[],
                      options=options, draft=perturbed_copy(target, 0.1))  # fmt: skip
    assert torch.equal(out.tokens, expected) and out.stats.emitted == N_NEW and out.stats.seconds["total"] > 0


def test_a_batch_is_plain_generate_with_each_rows_own_tokens(target):
    prompts = [GREEDY_PROMPT, GREEDY_PROMPT[:, :4]]
    out = hf_generate(target, prompts, sampling=GREEDY, max_new_tokens=N_NEW, seed=0, eos_token_id=[])
    for b, ids in enumerate(prompts):
        expected = autoregressive_generate(target, ids, sampling=GREEDY, max_new_tokens=N_NEW).tokens
        assert torch.equal(out.tokens[b], expected)
    assert len(out.rows) == 2 and out.stats.extras["rows"] == 2
    with pytest.raises(ValueError, match="do not take a batch"):
        hf_generate(target, prompts, sampling=GREEDY, max_new_tokens=N_NEW, seed=0, eos_token_id=[],
                    options=HFOptions(prompt_lookup=3))  # fmt: skip
