"""runtime=auto (the default): the compiled runtime where it measured faster and its compile pays back, else eager,
with the reason said (specdec.auto.runtime.eager_reason)."""

from types import SimpleNamespace

import pytest
import torch

from specdec.auto import runtime as auto_runtime
from specdec.auto.runtime import (
    AUTO_MIN_NEW_TOKENS,
    RuntimeOptions,
    add_step_graph,
    compiles,
    draft_cache_dtype,
    eager_reason,
    put_on_runtime,
    runtimes_markdown,
)
from specdec.runtime.compiled import compile_model, compiled_forward, eager_model
from specdec.runtime.tiny import tiny_model

AUTO = RuntimeOptions("auto", widths=(16,), dynamic_width=True)  # conf/runtime/auto.yaml, the packed kernel left out


@pytest.fixture
def packed_kernel_here(monkeypatch):
    """Answer 'the packed kernel runs here' (or not), whatever this machine's CPU."""
    from specdec.runtime import packed

    def answer(runs: bool):
        monkeypatch.setattr(packed, "unavailable_reason", lambda: None if runs else "it needs AVX-512 (here: AVX2)")
    return answer


def test_auto_compiles_a_real_sized_target_for_a_long_output(packed_kernel_here):
    packed_kernel_here(True)
    assert eager_reason("cpu", AUTO_MIN_NEW_TOKENS) is None and compiles(AUTO, "cpu", AUTO_MIN_NEW_TOKENS)
    assert not compiles(RuntimeOptions("eager"), "cpu", 128) and compiles(RuntimeOptions("compiled"), "cpu", 4)


@pytest.mark.parametrize("device, max_new_tokens, runs, reason", [
    ("cuda", 128, True, "compiles on a CPU only"),
    ("cpu", 128, False, "packed kernel runs, and it needs AVX-512"),
    ("cpu", 8, True, "max_new_tokens=8 is too few"),
])  # fmt: skip
def test_auto_runs_eager_and_says_why(packed_kernel_here, device, max_new_tokens, runs, reason):
    packed_kernel_here(runs)
    assert reason in eager_reason(device, max_new_tokens) and not compiles(AUTO, device, max_new_tokens)


@pytest.mark.xdist_group("inductor")  # the worker of tests/test_compiled.py: inductor's first compile costs most
def test_auto_leaves_a_toy_model_eager_and_compiles_when_no_reason_is_left(packed_kernel_here, monkeypatch, caplog):
    """A toy target is too small to pay a compile: it stays on the eager runtime, and the log says so. With that
    criterion lifted, the same call puts it on the compiled runtime (auto's profile: one graph of 1-16 tokens)."""
    packed_kernel_here(True)
    model = tiny_model("llama", seed=0)
    with caplog.at_level("INFO", logger="specdec.auto.report"):
        put_on_runtime(model, AUTO, device="cpu", max_new_tokens=128)  # a toy graph, quick to compile
    assert compiled_forward(model) is None and "too small to pay a compile" in caplog.text
    monkeypatch.setattr(auto_runtime, "AUTO_MIN_WEIGHTS_MB", 0)
    put_on_runtime(model, AUTO, device="cpu", max_new_tokens=128)
    assert compiled_forward(model).widths == (16,) and compiled_forward(model).dynamic_width
    eager_model(model)


@pytest.mark.parametrize("mode, cost, widths", [
    ("auto", 1.47, (1, 8)),  # an 8-row pass measured at 1.47 one-row passes (the 2-core Xeon): steps get their own graph
    ("auto", 1.02, (8,)),  # 8 rows at one row's cost: steps pad to 8, one graph
    ("auto", None, (8,)),  # no packed linears to measure
    ("always", None, (1, 8)),
    ("never", 3.0, (8,)),
])  # fmt: skip
def test_step_graph_adds_a_one_token_graph_where_the_wide_pass_costs_more(monkeypatch, caplog, mode, cost, widths):
    model = tiny_model("llama", seed=0)
    compiled = compile_model(model, widths=(8,), capacity=32)  # no graph is built before a pass runs
    measured = []
    monkeypatch.setattr(auto_runtime, "row_cost", lambda m, rows: measured.append(rows) or cost)
    with caplog.at_level("INFO", logger="specdec.auto.report"):
        add_step_graph(mode, compiled, model)
    assert compiled.widths == widths and measured == ([8] if mode == "auto" else [])
    assert ("runtime.step_graph=auto" in caplog.text) == (mode == "auto")
    eager_model(model)


def test_runtime_md_shows_one_graph_for_every_width_and_the_cuda_graphs():
    model = tiny_model("llama", seed=0)
    runtime = compile_model(model, widths=(4,), capacity=64, dynamic_width=True)  # lazy: nothing compiles here
    try:
        runtime.record.seconds[(1, 4)] = 1.5
        runtime.graphs = SimpleNamespace(recorded=3, replayed=9, failed=None)
        report = runtimes_markdown({"target": runtime})
        assert "| 1x1-4 |" in report and "target: CUDA graphs, 3 passes recorded, 9 replayed" in report
    finally:
        eager_model(model)



def test_runtime_options_refuse_what_the_compiled_runtime_cannot_take():
    with pytest.raises(ValueError, match="widths must be a non-empty list"):
        RuntimeOptions("compiled", widths=())
    with pytest.raises(ValueError, match="widths must be an integer >= 1, got 0"):
        RuntimeOptions("compiled", widths=(1, 0))
    with pytest.raises(ValueError, match="capacity=16 must hold two"):
        RuntimeOptions("compiled", widths=(1, 16), capacity=16)
    with pytest.raises(ValueError, match=r"packed_rows must be null or \[first, last\]"):
        RuntimeOptions("compiled", packed_rows=(5,))
    with pytest.raises(ValueError, match="packed_rows must be an integer >= 5, got 2"):
        RuntimeOptions("compiled", packed_rows=(5, 2))
    assert RuntimeOptions("compiled", packed_rows=(1, 16)).packed_rows == (1, 16)
    with pytest.raises(ValueError, match="draft_cache must be one of bfloat16, model, got 'int8'"):
        RuntimeOptions("compiled", draft_cache="int8")


def test_a_float32_copy_keeps_the_targets_states_in_bfloat16_where_the_kernel_runs(monkeypatch):
    """runtime.draft_cache: bfloat16 for a float32 copy; the copy's own dtype when told (model) and for a bfloat16 copy.
    compile_model keeps it where our attention kernel reads the cache, and drops it for attention other than SDPA's
    and where the kernel does not run."""
    from specdec.runtime import compiled

    model = tiny_model("llama")
    assert draft_cache_dtype(model, "bfloat16") == torch.bfloat16
    assert draft_cache_dtype(model, "model") is None
    assert draft_cache_dtype(model.to(torch.bfloat16), "bfloat16") is None
    model.float()
    for attention, kernel, kept in [("sdpa", True, torch.bfloat16), ("eager", True, None), ("sdpa", False, None)]:
        model.config._attn_implementation = attention  # eager: attention that is not the kernel's
        monkeypatch.setattr(compiled, "window_kernel", lambda kernel=kernel: kernel)
        assert compile_model(model, cache_dtype=torch.bfloat16).cache_dtype == kept, (attention, kernel)
        eager_model(model)
