"""The runtime study (specdec.runtime.study.runtime_study): pass costs by runtime profile, next to the memory bound."""

import pytest
import torch

from specdec import GREEDY, autoregressive_generate
from specdec.runtime.compiled import compile_model, compiled_forward
from specdec.runtime.inductor import graphs_built
from specdec.runtime.study import RuntimeProfile, runtime_study
from specdec.runtime.tiny import tiny_model


@pytest.mark.xdist_group("inductor")  # the worker of tests/test_compiled.py
def test_the_runtime_study_starts_from_the_eager_model():
    """bench=runtime's eager profile times the eager forward even where the bench loaded the target on the compiled
    runtime (runtime=auto does for a real-sized target on an AVX-512 CPU): no graph is built while it runs."""
    model = tiny_model("llama", seed=0)
    compile_model(model, widths=(4,), capacity=64, dynamic_width=True)  # as loaded; nothing compiles before a pass
    loops = {"ar": lambda m, ids: autoregressive_generate(m, ids, sampling=GREEDY, max_new_tokens=4).tokens}
    graphs = graphs_built()
    result = runtime_study(model, [torch.arange(1, 13)[None]], {"eager": RuntimeProfile({"name": "eager"})}, loops,
                           max_width=2, repeats=1, n=4, eos=[])
    assert graphs_built() == graphs and compiled_forward(model) is None
    assert set(result["profiles"]["eager"]["pass_cost"]) == {1, 2}
    assert result["profiles"]["eager"]["ar_tokens_per_s"] > 0 and result["profiles"]["eager"]["outputs_equal_eager_target_only"]
