"""The compiled runtime's attention (specdec.runtime.attention) and its guards: the same logits, faster."""

from __future__ import annotations

import pytest
import torch

from specdec.runtime.attention import GROUPED, as_shipped, use_grouped_attention
from specdec.runtime.cached import CachedLM
from specdec.runtime.compiled import compile_model, eager_model
from specdec.runtime.tiny import ARCHITECTURES, tiny_model

pytestmark = pytest.mark.xdist_group("inductor")  # the worker of tests/test_compiled.py: inductor starts cold once


def ragged_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of a two-row pass of 4 tokens after 8 (4D masks: the path grouped attention takes)."""
    lm = CachedLM(model)
    lm.forward(tokens[:, :8])
    return lm.forward(tokens[:, 8:])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_grouped_attention_gives_the_same_logits(arch):
    model = tiny_model(arch)
    tokens = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        shipped = ragged_logits(model, tokens)
        sdpa = model.config._attn_implementation == "sdpa"  # gemma2 runs eager attention (its soft-capping)
        switched = use_grouped_attention(model)
        grouped = ragged_logits(model, tokens)
    assert switched == sdpa == (model.config._attn_implementation == GROUPED)
    assert torch.equal(grouped, shipped)


def test_as_shipped_gives_back_the_models_own_attention_and_linears():
    model = tiny_model("llama")
    compile_model(model, widths=(1,), packed_rows=None)
    assert model.config._attn_implementation == GROUPED
    with as_shipped(model):
        assert model.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == GROUPED
    eager_model(model)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.exhaustive  # two models compiled (30 s of make test's one inductor worker); make test-all keeps it
def test_two_models_of_one_shape_keep_their_own_graphs_and_no_guard_on_their_buffers():
    """The compiled runtime skips the guards its graphs share: two models with graphs of the same shapes, called in
    turn, must still each run their own. Dynamo keeps the graphs of one code object together and checks a call
    against them: each model's runtime compiles its own copy of the forward's code, so a call is looked up among its
    own model's graphs only; and its guards leave out the model's buffers (the packed kernel's panels), which stay
    put while it is on the runtime. (One test: both halves compile the same graphs.)"""
    from types import SimpleNamespace

    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from specdec.runtime.inductor import skip_buffer_guards

    models = [tiny_model("llama", seed=seed) for seed in (1, 2)]
    tokens = torch.randint(0, 32, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        eager = [ragged_chain(model, tokens) for model in models]
        runtimes = [compile_model(model, widths=(2,)) for model in models]  # one graph each: 1-token passes padded
        for _ in range(2):  # the second round: every graph exists, guards skipped
            compiled = [ragged_chain(model, tokens) for model in models]
            for ours, reference in zip(compiled, eager):
                torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(eager[0], eager[1])
    codes = [runtime.compiled._torchdynamo_orig_callable.__func__.__code__ for runtime in runtimes]
    assert codes[0] is not codes[1]
    assert [len(_debug_get_cache_entry_list(code)) for code in codes] == [1, 1]  # each model its own graph
    buffer = next(models[0].buffers())
    entries = [SimpleNamespace(guard_type="TENSOR_MATCH", value=buffer),
               SimpleNamespace(guard_type="TENSOR_MATCH", value=tokens),
               SimpleNamespace(guard_type="ID_MATCH", value=buffer)]
    assert skip_buffer_guards(models[0])(entries) == [False, True, True]
    for model in models:
        eager_model(model)


def ragged_chain(model, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of passes of 1 and 2 tokens (the compiled buckets) after a 6-token prompt."""
    lm = CachedLM(model)
    lm.forward(tokens[:, :6])
    return torch.cat([lm.forward(tokens[:, 6:7]), lm.forward(tokens[:, 7:9])], dim=1)


def test_the_cpp_wrapper_runs_the_same_graphs():
    """runtime.cpp_wrapper: the graph's calls compiled to C++ give the eager logits (the packed kernel's op among
    them where the CPU has AVX-512), on the default runtime's one graph for every width."""
    from specdec.runtime.packed import unavailable_reason

    model = tiny_model("llama", seed=4)
    tokens = torch.randint(0, 32, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        eager = ragged_chain(model, tokens)
        runtime = compile_model(model, widths=(2,), cpp_wrapper=True, dynamic_width=True,
                                packed_rows=None if unavailable_reason() else (1, 2))
        compiled = ragged_chain(model, tokens)
    assert runtime.options["cpp_wrapper"] is True and not runtime.eager and len(runtime.record.seconds) == 1
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
    eager_model(model)


def test_attention_reads_a_window_of_the_cache(monkeypatch):
    """On the compiled runtime a pass attends over the slots in use rounded up to WINDOW, not the whole buffer: the
    windows grow with the sequence, one graph per width serves them all, and the logits are the eager ones."""
    from specdec.runtime.compiled import WINDOW

    model, windows = tiny_model("llama", seed=6), []

    def windows_seen():
        runtime = compile_model(model, widths=(1, 4), capacity=4 * WINDOW)
        graph = runtime.compiled
        runtime.compiled = lambda *inputs: windows.append(inputs[2].shape[-1]) or graph(*inputs)

    eager, compiled, _ = passes_eager_then_compiled(model, 2 * WINDOW + 30, windows_seen, 3, monkeypatch)
    assert sorted(set(windows)) == [WINDOW, 2 * WINDOW, 3 * WINDOW]
    assert compile_model(model, widths=(1,), capacity=4 * WINDOW, window=0).window(10, 4 * WINDOW) == 4 * WINDOW
    for ours, reference in zip(compiled, eager):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)
    eager_model(model)


def passes_eager_then_compiled(model, length: int, compile, compiling: int, monkeypatch):
    """A random sequence of `length` tokens as a 10-token prompt then passes of 4: its logits eager, then on a fresh
    cache after compile() (the first `compiling` passes may compile; a recompile after them raises); and that
    cache."""
    tokens = torch.randint(0, 32, (1, length), generator=torch.Generator().manual_seed(length))
    steps = [(0, 10), *((start, start + 4) for start in range(10, length, 4))]
    with torch.no_grad():
        lm = CachedLM(model)
        eager = [lm.forward(tokens[:, a:b]) for a, b in steps]
        compile()
        lm = CachedLM(model)
        compiled = [lm.forward(tokens[:, a:b]) for a, b in steps[:compiling]]  # compiles the 4-wide graph
        monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)  # from here a recompile raises
        compiled += [lm.forward(tokens[:, a:b]) for a, b in steps[compiling:]]
    return eager, compiled, lm.cache


def test_a_cache_grown_past_its_capacity_keeps_its_graphs(monkeypatch):
    """A sequence that outgrows the preallocated cache (a long prompt, a long answer) gets a larger buffer and the
    same graphs: the buffer's length is a dynamic dimension, so nothing compiles inside the generation, and the
    logits stay the eager ones."""
    from specdec.runtime.compiled import WINDOW

    model = tiny_model("llama", seed=8)
    eager, compiled, cache = passes_eager_then_compiled(  # traced with a window narrower than the buffer
        model, 3 * WINDOW + 6, lambda: compile_model(model, widths=(1, 4), capacity=2 * WINDOW), 2, monkeypatch)
    assert cache.layers[0].capacity >= 3 * WINDOW  # grown
    for ours, reference in zip(compiled, eager):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)
    eager_model(model)


def test_a_prompt_on_an_empty_cache_runs_as_causal_sdpa(monkeypatch):
    """A mask that lets query i see exactly slots 0..i (a prompt's pass on an empty cache) runs as SDPA's is_causal
    over the first n slots, without the blocks the mask hides, and gives the masked result; any other mask (a cache
    with slots before the prompt, a sliding window, two rows, one query) keeps the mask."""
    from specdec.runtime import attention

    n, K = 40, 64
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 4, n, 16, generator=g), torch.randn(1, 2, K, 16, generator=g), torch.randn(1, 2, K, 16, generator=g)
    causal = torch.zeros(1, 1, n, K, dtype=torch.bool)
    causal[0, 0, :, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    after_prefix = torch.roll(causal, 3, dims=-1) | (torch.arange(K) < 3)  # 3 cached slots first
    window = causal & (torch.arange(n)[:, None] - torch.arange(K)[None, :] < 8)  # a sliding window of 8
    assert attention.causal_prompt(causal)
    assert not any(attention.causal_prompt(m) for m in (after_prefix, window, causal.repeat(2, 1, 1, 1),
                                                        causal[:, :, :1], causal.float()))
    module = torch.nn.Module()
    out, _ = attention.grouped_sdpa(module, q, k, v, causal)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=1e-5, atol=1e-6)
    calls = []
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append((a, kw)) or a[0])
    attention.grouped_sdpa(module, q, k, v, causal)
    attention.grouped_sdpa(module, q, k, v, window)
    (args, kwargs), (_, masked) = calls
    assert kwargs["is_causal"] and kwargs["attn_mask"] is None and args[1].shape[2] == n
    assert not masked["is_causal"] and masked["attn_mask"] is window
