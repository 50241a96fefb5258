"""Checks that need a CUDA device: `make test-gpu` (never part of `make test` or `make test-all`, which run on CPUs).

On a GPU the eager runtime runs cuBLAS and SDPA's kernels, and the compiled runtime runs inductor's Triton kernels
with frozen weights, over the same preallocated cache as on a CPU (specdec.runtime.compiled). These are the CPU
suite's exactness checks again on that device: greedy output equal to Hugging Face's own greedy generate on the same
device, token for token, compiled logits next to eager ones, and speculative sampling's chi-square test with its
power, drawing its random numbers on the GPU.
"""

import os

import pytest
import torch
from fakes import GREEDY_PROMPT, hf_greedy, largest_logit_difference, one_token_steps
from goodness_of_fit import N_SAMPLES, PASS, REJECT, chi_square_pvalue, sequence_index

from specdec import GREEDY, ModelDrafter, Sampling, autoregressive_generate, speculative_generate
from specdec.exact import sequence_distribution
from specdec.runtime.cached import CachedLM
from specdec.runtime.compiled import compile_model, compiled_forward, eager_model
from specdec.runtime.tiny import ARCHITECTURES, perturbed_copy, tiny_model

CUDA = os.environ.get("SPECDEC_GPU_TESTS_ON", "cuda")  # "cpu" rehearses these checks on a machine without a GPU
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(CUDA == "cuda" and not torch.cuda.is_available(),
                                                  reason="needs a CUDA device")]
N_NEW = 24
COMPILED_ARCHS = ("llama", "gemma3")  # a plain decoder, and one with sliding windows shorter than the output


def pair_on_gpu(arch: str, noise: float = 0.15):
    """A tiny target and a perturbed copy (built on the CPU, whose generator makes the noise), moved to the GPU."""
    target = tiny_model(arch, seed=0, scale=20.0)
    draft = perturbed_copy(target, noise)
    return target.to(CUDA), draft.to(CUDA)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_eager_greedy_on_the_gpu_equals_hf_greedy(arch):
    """Target-only and speculative greedy output on the GPU's eager runtime equal HF's greedy generate there."""
    greedy_equals_hf_greedy(*pair_on_gpu(arch))


def greedy_equals_hf_greedy(target, draft) -> torch.Tensor:
    """Target-only and speculative greedy output (k = 3, partly accepted) equal to HF's greedy generate on the GPU;
    that output after the prompt."""
    prompt = GREEDY_PROMPT.to(CUDA)
    expected = hf_greedy(target, prompt, N_NEW)
    assert torch.equal(autoregressive_generate(target, prompt, sampling=GREEDY, max_new_tokens=N_NEW).tokens, expected)
    out = speculative_generate(target, ModelDrafter(draft), prompt, k=3, sampling=GREEDY, max_new_tokens=N_NEW)
    assert torch.equal(out.tokens, expected)
    assert 0 < out.stats.acceptance_rate < 1
    return torch.cat([prompt[0], expected])[None]


@pytest.mark.parametrize("arch", COMPILED_ARCHS)
def test_compiled_greedy_on_the_gpu_equals_hf_greedy(arch):
    """The compiled runtime on the GPU: the same greedy output as HF's eager generate, passes padded to their
    buckets and cropped after partial acceptance; its logits equal the eager runtime's to float rounding."""
    target, draft = pair_on_gpu(arch)
    compile_model(target, widths=(1, 2, 4), capacity=64, autotune=False)
    sequence = greedy_equals_hf_greedy(target, draft)
    record, graphs = compiled_forward(target).record, compiled_forward(target).graphs
    assert record.seconds and record.eager_reason is None  # it did run compiled graphs
    if CUDA == "cuda":  # and replayed most passes as CUDA graphs
        assert graphs.failed is None and graphs.replayed > graphs.recorded > 0
    worst = largest_logit_difference(target, sequence)
    print(f"{arch}: largest |compiled - eager| logit on the GPU: {worst:.2e}")
    assert worst < 1e-3


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_speculative_sampling_on_the_gpu_keeps_the_target_distribution(compiled):
    """test_exactness.py's chi-square test (same pair, same power) with the GPU's generator drawing every random
    number: the output follows the target's distribution and not the draft's."""
    target = tiny_model("llama", seed=0, scale=6.0, vocab_size=5, n_layers=1).to(CUDA)
    draft = tiny_model("llama", seed=2, scale=6.0, vocab_size=5, n_layers=1).to(CUDA)
    if compiled:
        for model in (target, draft):
            compile_model(model, widths=(1, 2, 4), capacity=16, autotune=False)
    prompt, n, sampling = torch.tensor([[0, 3, 1]], device=CUDA), 3, Sampling(1.0)
    g = torch.Generator(device=CUDA).manual_seed(2)
    drafter = ModelDrafter(draft)
    counts = torch.zeros(5**n, dtype=torch.float64)
    for _ in range(N_SAMPLES):
        tokens = speculative_generate(target, drafter, prompt, k=2, sampling=sampling, max_new_tokens=n,
                                      generator=g).tokens
        counts[sequence_index(tokens.cpu(), 5)] += 1
    for model in (target, draft):
        eager_model(model)
    assert chi_square_pvalue(counts, sequence_distribution(target.cpu(), prompt.cpu(), n, sampling)) > PASS
    assert chi_square_pvalue(counts, sequence_distribution(draft.cpu(), prompt.cpu(), n, sampling)) < REJECT


@pytest.mark.skipif(CUDA != "cuda", reason="CUDA graphs need a CUDA device")
def test_two_caches_of_one_model_replay_their_own_cuda_graphs():
    """Passes of two caches of one compiled model, interleaved and replayed as CUDA graphs: each cache gets the
    logits it gets alone without CUDA graphs (a recording reads and writes its own cache's buffers)."""
    model = tiny_model("llama", seed=0, scale=20.0).to(CUDA)
    runtime = compile_model(model, widths=(1, 2, 4), capacity=64, autotune=False)
    graphs, prompts = runtime.graphs, [torch.tensor([[5, 9, 2, 7]]), torch.tensor([[3, 3, 8, 1, 6]])]
    runtime.graphs = None
    alone = [one_token_steps([CachedLM(model)], [prompt], 6)[0] for prompt in prompts]
    runtime.graphs = graphs
    together = one_token_steps([CachedLM(model) for _ in prompts], prompts, 6)
    eager_model(model)
    for mine, theirs in zip(together, alone):
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
    assert graphs.failed is None and graphs.replayed >= 2 * 4

