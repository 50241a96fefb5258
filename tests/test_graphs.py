"""CUDA graphs over compiled passes (specdec.runtime.graphs): what is recorded, when a recording replays, and that a
replay gives what the pass gives.

A CPU has no CUDA graphs, so here a recording's "graph" replays by running the recorded call again on the
recording's own input tensors and writing the recording's own output tensors, as a CUDA graph does. Everything
else (the keys, the input refills, the output copies, the recordings kept per cache) is the module's own code on a
compiled tiny model. tests/test_gpu.py runs the real CUDA graphs on a GPU.
"""

import gc
import weakref

import pytest
import torch
from fakes import GREEDY_PROMPT, one_token_steps

from specdec import GREEDY, ModelDrafter, autoregressive_generate, speculative_generate
from specdec.runtime.cached import CachedLM, logits_width
from specdec.runtime.compiled import compile_model, compiled_forward, eager_model
from specdec.runtime.graphs import CudaGraphs, Recording, cache_addresses, static_copy
from specdec.runtime.tiny import perturbed_copy, tiny_model

pytestmark = pytest.mark.xdist_group("inductor")  # one worker compiles (as tests/test_compiled.py)
N_NEW = 24


class ReplayByRunning:
    """A recorded call that replays by running again on the recording's inputs, into the recording's outputs."""

    def __init__(self, forward, inputs: list, cache, outputs: tuple):
        self.forward, self.inputs, self.outputs = forward, inputs, outputs
        self.cache = weakref.ref(cache)  # as a CUDA graph, which holds the buffers' addresses, not the cache

    def replay(self) -> None:
        for out, new in zip(self.outputs, self.forward(*self.inputs, self.cache())):
            out.copy_(new)


class GraphsOnCPU(CudaGraphs):
    """CudaGraphs with ReplayByRunning for CUDA graphs: first passes on the one stream, outputs allocated up front."""

    def __init__(self, forward, model):
        super().__init__(forward)
        self.widths = logits_width(model), model.config.hidden_size

    def first_pass(self, *inputs):
        return self.forward(*inputs)

    def record(self, small: tuple, cache) -> Recording:
        static = [static_copy(x) for x in small]
        rows, width = small[0].shape
        outputs = tuple(torch.full((rows, width, n), float("nan")) for n in self.widths)
        return Recording(ReplayByRunning(self.forward, static, cache, outputs), static, outputs)


@pytest.fixture(scope="module")
def target():
    model = tiny_model("llama", seed=0, scale=20.0)
    eager = autoregressive_generate(model, GREEDY_PROMPT, sampling=GREEDY, max_new_tokens=N_NEW).tokens
    runtime = compile_model(model, widths=(1, 2, 4), capacity=64, autotune=False)
    runtime.graphs = GraphsOnCPU(runtime.compiled, model)
    yield model, eager
    eager_model(model)


def test_replayed_passes_decode_what_the_passes_decode(target):
    """Target-only and speculative greedy output (k = 3, partly accepted: passes of 1, 2 and 4 tokens after crops)
    with every repeated pass replayed equals eager greedy output; most passes were replays."""
    model, eager = target
    graphs = model_graphs(model)
    out = autoregressive_generate(model, GREEDY_PROMPT, sampling=GREEDY, max_new_tokens=N_NEW)
    assert torch.equal(out.tokens, eager)
    spec = speculative_generate(model, ModelDrafter(perturbed_copy(model, 0.15)), GREEDY_PROMPT, k=3,
                                sampling=GREEDY, max_new_tokens=N_NEW)
    assert torch.equal(spec.tokens, eager) and 0 < spec.stats.acceptance_rate < 1
    assert graphs.replayed > 2 * graphs.recorded > 0


def test_each_cache_replays_its_own_recordings(target):
    """Two caches of one model, their passes interleaved: each gets the logits it gets alone (a recording holds
    its cache's buffers, and what a replay returns is not overwritten by the next), and a cache's recordings go
    with it."""
    model, _ = target
    graphs = model_graphs(model)
    prompts = [torch.tensor([[5, 9, 2, 7]]), torch.tensor([[3, 3, 8, 1, 6]])]
    runtime = compiled_forward(model)
    runtime.graphs = None  # each alone, without recordings
    alone = [one_token_steps([CachedLM(model)], [prompt], 6)[0] for prompt in prompts]
    runtime.graphs = graphs
    first, second = CachedLM(model), CachedLM(model)
    together = one_token_steps([first, second], prompts, 6)
    for mine, theirs in zip(together, alone):
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
    gc.collect()
    held, caches = len(graphs.by_cache), [weakref.ref(lm.cache) for lm in (first, second)]
    assert all(cache() in graphs.by_cache for cache in caches)
    del first, second
    gc.collect()
    assert all(cache() is None for cache in caches) and len(graphs.by_cache) == held - 2


def test_a_cache_that_reallocates_records_again(target):
    """A cache grown past its capacity holds new buffers: its passes record again instead of replaying into the
    old ones."""
    model, _ = target
    graphs = model_graphs(model)
    lm = CachedLM(model)
    lm.forward(torch.arange(1, 9)[None] % 10)
    for _ in range(3):
        lm.forward(torch.tensor([[4]]))
    before, recorded = cache_addresses(lm.cache), graphs.recorded
    more = lm.cache.layers[0].capacity  # as many tokens more: past the buffer, eager (wider than a bucket)
    lm.forward(torch.arange(1, more + 1)[None] % 10)
    assert cache_addresses(lm.cache) != before
    for _ in range(2):  # the first compiles the graph of the larger buffer, the second records it
        lm.forward(torch.tensor([[4]]))
    assert graphs.recorded == recorded + 1


def model_graphs(model) -> GraphsOnCPU:
    return compiled_forward(model).graphs
