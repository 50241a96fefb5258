"""runtime.dynamic_width: one compiled graph takes every pass width up to the widest bucket as it is (the width an
unbacked size), instead of a graph per bucket with each pass padded to one: one graph built, no pass padded. Its
greedy outputs on every architecture: tests/test_compiled.py."""

import pytest
import torch
from fakes import GREEDY_PROMPT, hf_greedy

from specdec import GREEDY, autoregressive_generate
from specdec.auto.runtime import add_step_graph
from specdec.runtime.cached import CachedLM
from specdec.runtime.compiled import compile_model, compiled_forward, eager_model
from specdec.runtime.inductor import graphs_built
from specdec.runtime.tiny import tiny_model

pytestmark = pytest.mark.xdist_group("inductor")  # the worker of tests/test_compiled.py


def dynamic_tiny(arch: str, widest: int = 4):
    model = tiny_model(arch, seed=0, scale=20.0)
    compile_model(model, widths=(widest,), capacity=64, autotune=False, dynamic_width=True)
    return model


def test_one_graph_takes_every_width_unpadded(monkeypatch):
    """Passes of 1, 2, 3 and 4 tokens each run at their own width (no padded slot) in the one graph built for the
    first; a pass wider than the widest runs eager."""
    target = dynamic_tiny("llama")
    runtime = compiled_forward(target)
    assert [runtime.bucket(w) for w in (1, 2, 3, 4, 5)] == [1, 2, 3, 4, None]
    lm = CachedLM(target)
    lm.forward(GREEDY_PROMPT[:, :3])  # into an empty cache: eager
    graphs = graphs_built()
    lm.forward(GREEDY_PROMPT[:, 3:5])
    assert graphs_built() == graphs + 1
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)  # from here a recompile raises
    end = 5
    for width in (1, 3, 4, 2, 1):
        logits = lm.forward(GREEDY_PROMPT[:, end:end + width] if end + width <= 8 else GREEDY_PROMPT[:, :width])
        end += width
        assert logits.shape[1] == width and lm.slots == end
        assert all(int(layer.filled) == end for layer in lm.cache.layers)  # no padded slot kept
    assert graphs_built() == graphs + 1
    assert lm.forward(GREEDY_PROMPT[:, :5]).shape[1] == 5  # wider than every bucket: eager, no graph
    assert graphs_built() == graphs + 1
    assert set(runtime.record.seconds) == {(1, 4)}  # one graph of one row, every width up to 4 (runtime.md: 1x1-4)
    eager_model(target)


@pytest.mark.exhaustive  # compiles a Gemma 2
def test_where_one_graph_for_every_width_fails_a_graph_per_bucket_runs(caplog):
    """Gemma 2 (torch 2.13): the first pass runs eager, later ones padded to the bucket's graph; one logged line."""
    target = dynamic_tiny("gemma2")
    expected = hf_greedy(target, GREEDY_PROMPT, 8)
    with caplog.at_level("WARNING", logger="specdec.runtime.compiled"):
        out = autoregressive_generate(target, GREEDY_PROMPT, sampling=GREEDY, max_new_tokens=8).tokens
    runtime = compiled_forward(target)
    assert torch.equal(out, expected) and not runtime.dynamic_width and not runtime.eager
    assert set(runtime.record.seconds) == {(1, 4)}  # steps padded to the one bucket
    assert [r.message for r in caplog.records if "a graph per bucket" in r.message] != []
    eager_model(target)


def test_no_step_graph_is_added_where_one_graph_takes_every_width():
    model = tiny_model("llama", seed=0)
    compiled = compile_model(model, widths=(8,), capacity=32, dynamic_width=True)  # nothing built before a pass
    add_step_graph("always", compiled, model)
    assert compiled.widths == (8,) and compiled.bucket(1) == 1
    eager_model(model)
