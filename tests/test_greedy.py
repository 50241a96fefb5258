"""Temperature 0: speculative output equals the target's own greedy output, token for token.

Every architecture of the model catalogue, each with its own cache type; sliding windows shorter
than the generation so that rollback across the window is exercised; drafts that agree partly, not
at all, and fully; and the offline SmolLM2 pair on real prompts.
"""

import pytest
import torch
from fakes import GREEDY_PROMPT, hf_greedy

from specdec import (
    GREEDY,
    ModelDrafter,
    ModelTreeDrafter,
    NGramDrafter,
    autoregressive_generate,
    speculative_generate,
    tree_generate,
)
from specdec.choose.cost import Choice, FixedDraftLength
from specdec.runtime.tiny import ARCHITECTURES, perturbed_copy, tiny_model
from specdec.sampling import Sampling, draw, probabilities, sample

PROMPT = GREEDY_PROMPT
N_NEW = 30


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_target(request):
    return request.param, tiny_model(request.param, seed=0, scale=20.0)


def test_autoregressive_equals_hf_greedy(arch_target):
    _, target = arch_target
    ours = autoregressive_generate(target, PROMPT, sampling=GREEDY, max_new_tokens=N_NEW).tokens
    assert torch.equal(ours, hf_greedy(target, PROMPT, N_NEW))


def test_mixed_acceptance_is_exercised():
    """The 'close' drafts accept some but not all tokens, so crop-after-partial-acceptance is covered."""
    target = tiny_model("llama", seed=0, scale=20.0)
    out = speculative_generate(target, ModelDrafter(perturbed_copy(target, 0.15)), PROMPT, k=3,
                               sampling=GREEDY, max_new_tokens=N_NEW)
    assert 0.0 < out.stats.acceptance_rate < 1.0


PROMPTS = [
    (
        "Summarize in one sentence: The committee met on Tuesday to review the budget. After a long debate, "
        "the committee approved the budget with two changes to the maintenance line."
    ),
    "What is the capital of France? Answer in one word.",
    "Write a Python function that returns the square of a number.",
]


@pytest.mark.slow
@pytest.mark.parametrize("prompt", [pytest.param(p, marks=pytest.mark.exhaustive) if i != 1 else p
                                    for i, p in enumerate(PROMPTS)])  # make test: the shortest answer
def test_offline_pair_greedy_equals_target_greedy(smollm2, prompt):
    from specdec.runtime.models import encode_prompt

    target, tokenizer, draft = smollm2
    ids = encode_prompt(tokenizer, prompt)
    reference = target.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[-1] :]
    eos = tokenizer.eos_token_id
    for drafter in (ModelDrafter(draft), NGramDrafter()):
        out = speculative_generate(target, drafter, ids, k=4, sampling=GREEDY, max_new_tokens=24, eos_token_id=eos)
        assert torch.equal(out.tokens, reference), type(drafter).__name__


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "qwen2"])
@pytest.mark.parametrize("k", [5, 8])
def test_one_token_prompt_with_verification_longer_than_the_window(arch, k):
    """No prefill, so the first verification pass (k + 1 >= window 6) must already record past states."""
    target = tiny_model(arch, seed=0, scale=4.0, vocab_size=16)
    prompt = torch.tensor([[0]])
    out = speculative_generate(target, ModelDrafter(perturbed_copy(target, 0.5)), prompt, k=k, sampling=GREEDY,
                               max_new_tokens=20)
    assert torch.equal(out.tokens, hf_greedy(target, prompt, 20))
    assert out.stats.accepted < out.stats.drafted  # rejections, hence crops, happened


class PlainStepFirst(FixedDraftLength):
    """k = 0 (a plain target step, no drafter call) in the first round, then k."""

    def __init__(self, k: int):
        super().__init__(k)
        self.rounds = 0

    def choose(self, limit: int, rows: int = 1, tokens=None) -> Choice:
        self.rounds += 1
        return Choice(0) if self.rounds == 1 else super().choose(limit)


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gemma3", "qwen2"])
def test_plain_step_right_after_a_prompt_longer_than_the_window(arch):
    """The draft has only prefilled a prompt past its window (no past states recorded yet) when a k = 0 round
    rolls it back to where it already is: a no-op, not transformers' refusal to crop a full window (found
    with Gemma 3 270M, k=auto, a 542-token prompt)."""
    target = tiny_model(arch, seed=0, scale=4.0, vocab_size=16)
    prompt = (torch.arange(20) % 16)[None]  # (1, 20), window 6
    out = speculative_generate(target, ModelDrafter(perturbed_copy(target, 0.3)), prompt, k=PlainStepFirst(3),
                               sampling=GREEDY, max_new_tokens=12)  # fmt: skip
    assert torch.equal(out.tokens, hf_greedy(target, prompt, 12))
    assert out.stats.chosen_k[0] == 0 and out.stats.drafted > 0


@pytest.mark.slow
@pytest.mark.exhaustive  # the real Gemma 3 270M (240 MB, loaded once per session): `make test-all`
def test_gemma3_with_real_weights_past_its_window_equals_target_greedy(gemma3):
    """Gemma 3 270M, five sliding-window layers (512 tokens) to each full one: a 542-token prompt and 40 new
    tokens, so every round verifies and rolls back across the window; chains at k = 4, a model tree and
    k="auto" all emit the target's own greedy continuation."""
    target, tokenizer, draft = gemma3
    assert target.config.sliding_window == 512 and "full_attention" in target.config.layer_types
    ids = tokenizer("The history of the printing press begins in the fifteenth century. " * 45,
                    return_tensors="pt").input_ids  # fmt: skip
    assert ids.shape[-1] > target.config.sliding_window
    reference = hf_greedy(target, ids, 40)
    runs = {
        "chain": speculative_generate(target, ModelDrafter(draft), ids, k=4, sampling=GREEDY, max_new_tokens=40),
        "auto": speculative_generate(target, ModelDrafter(draft), ids, k="auto", sampling=GREEDY, max_new_tokens=40),
        "tree": tree_generate(target, ModelTreeDrafter(draft, branches=(2,), depth=4, nodes=8), ids, sampling=GREEDY,
                              max_new_tokens=40),
    }  # fmt: skip
    for name, out in runs.items():
        assert torch.equal(out.tokens, reference), name
        assert out.stats.accepted > 0, name


def test_draw_is_what_sample_draws_from_the_processed_distribution():
    """draw: greedy, the argmax that sample draws from the one-hot (whatever the uniform); sampled, sample itself."""
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    for seed in range(3):
        drawn = sample(probabilities(logits, GREEDY), torch.Generator().manual_seed(seed))
        assert torch.equal(draw(logits, GREEDY, torch.Generator().manual_seed(seed)), drawn)
    hot = Sampling(temperature=1.0)
    assert torch.equal(draw(logits, hot, torch.Generator().manual_seed(7)),
                       sample(probabilities(logits, hot), torch.Generator().manual_seed(7)))
