"""Batch-invariant target passes (runtime.invariant with packed linears and one graph for every width): a position's
logits have the same bits whether it is computed alone (a decode step) or inside a verification pass of any width up
to 16, in bfloat16 as in float32. Greedy speculative output then equals greedy target-only output on that runtime
bit for bit, whatever k, for chains, trees and batches.

On SmolLM2-135M in bfloat16 the same check fails without it (SDPA's and oneDNN's products sum in an order that
depends on the number of rows): the exhaustive test shows both."""

import pytest
import torch
from fakes import GREEDY_PROMPT

from specdec import (
    GREEDY,
    BlockVerification,
    ModelDrafter,
    ModelTreeDrafter,
    autoregressive_generate,
    speculative_generate,
    tree_generate,
)
from specdec.runtime.cached import CachedLM
from specdec.runtime.compiled import compile_model, eager_model
from specdec.runtime.packed import unavailable_reason
from specdec.runtime.tiny import perturbed_copy, tiny_model

pytestmark = [pytest.mark.xdist_group("inductor"),  # the worker of tests/test_compiled.py
              pytest.mark.exhaustive,  # each test compiles (make test keeps the kernel's own check, test_packed.py)
              pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))]  # fmt: skip
WIDEST = 16


def on_invariant_runtime(model, invariant: bool = True):
    """The model on the compiled runtime as runtime=auto runs it, attention in one order a row (invariant) or by
    chunks of slots (kernels/window_attention.cpp)."""
    compile_model(model, widths=(WIDEST,), capacity=256, dynamic_width=True, packed_rows=(1, WIDEST),
                  invariant=invariant)  # fmt: skip
    return model


def first_position_logits(model, prompt: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The logits of tokens' first position after prompt (1, L), in passes of tokens[:w] for w = 1..len(tokens)."""
    lm = CachedLM(model)
    lm.forward(prompt)
    start, out = lm.length, []
    for width in range(1, tokens.shape[-1] + 1):
        out.append(lm.forward(tokens[:, :width])[0, 0].clone())
        lm.crop(start)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_positions_logits_have_the_same_bits_in_a_step_and_in_every_pass_width(dtype):
    model = on_invariant_runtime(tiny_model("llama", seed=0, scale=20.0).to(dtype))
    tokens = torch.randint(0, model.config.vocab_size, (1, WIDEST), generator=torch.Generator().manual_seed(1))
    logits = first_position_logits(model, GREEDY_PROMPT, tokens)
    assert all(torch.equal(logits[0], other) for other in logits), [torch.equal(logits[0], o) for o in logits]
    eager_model(model)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # a plain decoder; sliding windows shorter than the output
def test_greedy_speculative_output_is_target_onlys_on_the_invariant_runtime(arch, dtype):
    """Chains of several k, block verification, a tree and a batch of three ragged rows, against target-only on the
    same runtime."""
    target = on_invariant_runtime(tiny_model(arch, seed=0, scale=20.0).to(dtype))
    draft = perturbed_copy(target, 0.15)
    batch = [GREEDY_PROMPT[0], torch.tensor([0, 9]), torch.tensor([0, 5, 3, 7, 5, 3, 7, 5, 3, 12, 4])]
    for prompts in (GREEDY_PROMPT, batch):
        expected = autoregressive_generate(target, prompts, sampling=GREEDY, max_new_tokens=20).tokens
        runs = [speculative_generate(target, ModelDrafter(draft), prompts, k=k, sampling=GREEDY, max_new_tokens=20)
                for k in (1, 4, 8)]  # fmt: skip
        runs.append(speculative_generate(target, ModelDrafter(draft), prompts, k=4, acceptance=BlockVerification(),
                                         sampling=GREEDY, max_new_tokens=20))  # fmt: skip
        runs.append(tree_generate(target, ModelTreeDrafter(draft, branches=(2, 2), depth=4, nodes=8), prompts, k=4,
                                  sampling=GREEDY, max_new_tokens=20))  # fmt: skip
        for out in runs:
            rows = out.tokens if isinstance(prompts, list) else [out.tokens]
            for mine, theirs in zip(rows, expected if isinstance(prompts, list) else [expected], strict=True):
                assert torch.equal(mine, theirs)
            assert out.stats.accepted > 0
    eager_model(target)


def test_smollm2_in_bfloat16_is_batch_invariant_with_the_window_kernel_and_not_with_sdpa():
    """The check has power: with SDPA in the compiled passes (the runtime's attention where there is no AVX-512),
    some pass width rounds the position differently on the Xeon (AMX); where SDPA is invariant too, only the kernel's
    invariance is checked and the test says so by skipping."""
    from specdec.runtime.models import load_model

    tokens = torch.randint(0, 49152, (1, WIDEST), generator=torch.Generator().manual_seed(1))
    prompt = torch.randint(0, 49152, (1, 40), generator=torch.Generator().manual_seed(0))
    same = {}
    for invariant in (True, False):
        model = on_invariant_runtime(load_model("offline:smollm2-135m-instruct", dtype="bfloat16"), invariant)
        for module in model.modules():  # invariant=False: SDPA, not the chunked kernel
            if hasattr(module, "window_kernel"):
                module.window_kernel = invariant
        logits = first_position_logits(model, prompt, tokens)
        same[invariant] = [torch.equal(logits[0], other) for other in logits]
        eager_model(model)
    assert all(same[True])
    if all(same[False]):  # SDPA's bf16 products are width-dependent on some CPUs only (the Xeon's, with AMX)
        pytest.skip("SDPA's bfloat16 passes were batch-invariant on this CPU too (as on a 2-core EPYC without AMX): the "
                    "check's power is shown where they are not")
