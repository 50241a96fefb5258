"""The compiled runtime (specdec.runtime.compiled): the same outputs as the eager runtime, on every architecture.

Each test compiles its own tiny models (never the session fixtures', which other tests run eager), with inductor's
default GEMMs (autotune=False): a few seconds per graph, cached on disk by inductor for the next run. The
autotuned C++ GEMM path is what the bench measures on the offline model (python -m experiments.bench bench=runtime).
"""

import copy
import gc
import logging
import weakref

import pytest
import torch
from fakes import GREEDY_PROMPT, hf_greedy, largest_logit_difference
from goodness_of_fit import PASS, REJECT, chi_square_pvalue, sample_counts

from specdec import (
    GREEDY,
    ModelDrafter,
    ModelTreeDrafter,
    Sampling,
    autoregressive_generate,
    speculative_generate,
    tree_generate,
)
from specdec.draft.head import DraftHead
from specdec.draft.head_drafter import HeadDrafter
from specdec.exact import sequence_distribution
from specdec.runtime.cached import CachedLM
from specdec.runtime.compiled import (
    PAD_GAIN,
    compile_model,
    compiled_forward,
    eager_model,
)
from specdec.runtime.inductor import graphs_built
from specdec.runtime.models import dynamic_int8_copy
from specdec.runtime.packed import unavailable_reason
from specdec.runtime.probes import build_graphs, time_buckets
from specdec.runtime.tiny import ARCHITECTURES, perturbed_copy, tiny_model
from specdec.train.head import teacher_pass

pytestmark = pytest.mark.xdist_group("inductor")  # one worker compiles: inductor's first compile in a process costs ~30 s cold
N_NEW = 24
WIDTHS = (1, 2, 4)
DYNAMIC_FAILS = {"gemma2"}  # one graph for every width fails to lower (soft-capped attention, torch 2.13)


def compiled_tiny(arch: str, dynamic_width: bool = False, **kwargs):
    model = tiny_model(arch, seed=0, scale=20.0, **kwargs)
    compile_model(model, widths=WIDTHS, capacity=64, autotune=False, dynamic_width=dynamic_width)
    return model


# make test: llama on bucketed graphs; one graph for every width in tests/test_dynamic_width.py
@pytest.mark.parametrize("dynamic_width", [False, pytest.param(True, marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize("arch", [pytest.param(a, marks=[] if a == "llama" else pytest.mark.exhaustive)
                                  for a in ARCHITECTURES])
def test_compiled_greedy_equals_eager_greedy(arch, dynamic_width):
    """Target-only and speculative greedy output on the compiled runtime equal HF's eager greedy output; the logits
    of a compiled pass equal the eager ones to float rounding (Gemma 3: sliding windows shorter than the output).
    With dynamic_width, steps and passes of 1-4 tokens run on one graph (tests/test_dynamic_width.py), except where
    it fails to lower (DYNAMIC_FAILS: a graph per bucket)."""
    target = compiled_tiny(arch, dynamic_width=dynamic_width)
    expected = hf_greedy(target, GREEDY_PROMPT, N_NEW)  # HF's generate: its own eager forward
    assert torch.equal(autoregressive_generate(target, GREEDY_PROMPT, sampling=GREEDY, max_new_tokens=N_NEW).tokens,
                       expected)
    out = speculative_generate(target, ModelDrafter(perturbed_copy(target, 0.15)), GREEDY_PROMPT, k=3,
                               sampling=GREEDY, max_new_tokens=N_NEW)
    assert torch.equal(out.tokens, expected)
    assert 0 < out.stats.acceptance_rate < 1  # partial acceptance: crops after compiled passes are exercised
    assert compiled_forward(target).record.seconds  # it did run compiled
    assert compiled_forward(target).record.eager_reason is None
    assert compiled_forward(target).dynamic_width == (dynamic_width and arch not in DYNAMIC_FAILS)
    assert largest_logit_difference(target, torch.cat([GREEDY_PROMPT[0], expected])[None]) < 1e-4


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
@pytest.mark.exhaustive  # make test: tests/test_packed.py (llama, 2 layers)
@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a not in ("mixtral", "gpt_neox")])  # mixtral: no graph
# at all (its routing); gpt_neox: its attention is not `self_attn`, so its layers are traced one by one
def test_decoder_layers_are_traced_once_and_stamped_out(arch):
    """With packed linears (unfrozen weights, as runtime=auto runs) a graph traces the decoder layer once per kind of
    layer and stamps that trace out for the others (specdec.runtime.regions): fewer traces than layers, the same
    greedy output as HF's eager generate, logits equal to float rounding; eager_model gives the layers back their own
    forward."""
    from torch._dynamo.utils import compilation_time_metrics

    target = tiny_model(arch, seed=0, scale=20.0, n_layers=6)
    before = {key: len(compilation_time_metrics.get(key, []))
              for key in ("invoke_subgraph_trace", "invoke_subgraph_reuse_stamp_out")}
    compile_model(target, widths=(4,), capacity=64, packed_rows=(1, 4), dynamic_width=True)  # as runtime=auto
    assert compiled_forward(target).regions
    expected = hf_greedy(target, GREEDY_PROMPT, N_NEW)
    assert torch.equal(autoregressive_generate(target, GREEDY_PROMPT, sampling=GREEDY, max_new_tokens=N_NEW).tokens,
                       expected)
    out = speculative_generate(target, ModelDrafter(perturbed_copy(target, 0.15)), GREEDY_PROMPT, k=3,
                               sampling=GREEDY, max_new_tokens=N_NEW)
    assert torch.equal(out.tokens, expected)
    assert compiled_forward(target).regions and compiled_forward(target).record.eager_reason is None
    traces, stamps = (len(compilation_time_metrics.get(key, [])) - count for key, count in before.items())
    graphs = len(compiled_forward(target).record.seconds)
    assert graphs >= 1 and traces <= 2 * graphs and stamps >= 4 * graphs, (graphs, traces, stamps)
    assert largest_logit_difference(target, torch.cat([GREEDY_PROMPT[0], expected])[None]) < 1e-4
    eager_model(target)
    assert all("forward" not in vars(layer) for layer in target.model.layers)


def test_a_layers_keywords_enter_its_region_as_flat_positional_values():
    """flat_keywords turns a decoder layer's keywords into a names string and flat values (a tuple's items marked
    with their count), which dynamo matches to a recorded region without a pytree flatten; keywords_of gives back
    the same keywords; a keyword holding a dict or a list is left to the keyword call."""
    from specdec.runtime.regions import flat_keywords, keywords_of

    cos, sin, mask = torch.randn(1, 3, 8), torch.randn(1, 3, 8), torch.zeros(1, 1, 3, 64)
    kwargs = {"attention_mask": mask, "position_embeddings": (cos, sin), "position_ids": None, "use_cache": True}
    names, values = flat_keywords(kwargs)
    assert names == "attention_mask,position_embeddings:2,position_ids,use_cache"
    assert len(values) == 5 and all(a is b for a, b in zip(values, (mask, cos, sin, None, True)))
    back = keywords_of(names, values)
    assert list(back) == list(kwargs) and back["position_embeddings"][1] is sin and back["attention_mask"] is mask
    assert keywords_of(*flat_keywords({})) == {}
    assert flat_keywords({"position_embeddings": {"global": (cos, sin)}}) is None
    assert flat_keywords({"ids": [1, 2]}) is None


def test_a_draft_head_reads_the_compiled_targets_features():
    """The compiled graphs return the last hidden state next to the logits: a draft head drafts from the features
    of compiled passes (steps, padded passes, the eager prefill), which equal the eager runtime's, and its greedy
    output is the target's."""
    target = compiled_tiny("llama")
    torch.manual_seed(0)
    head = DraftHead(target, layers=1, vocab=torch.arange(0, 32, 2))
    lm = CachedLM(target)
    out = speculative_generate(target, HeadDrafter(head), GREEDY_PROMPT, k=2, sampling=GREEDY, max_new_tokens=N_NEW,
                               cache=lm)
    assert torch.equal(out.tokens, hf_greedy(target, GREEDY_PROMPT, N_NEW))
    assert (1, 4) in compiled_forward(target).record.seconds  # passes of k + 1 = 3 tokens, padded to 4
    sequence = torch.cat([GREEDY_PROMPT[0], out.tokens])
    eager_model(target)
    torch.testing.assert_close(lm.row_features()[0], teacher_pass(target, sequence)[0][: lm.length], atol=1e-4,
                               rtol=1e-4)


def test_a_graph_compiles_under_the_benchs_forward_clock():
    """The bench's clock hooks every model's forward; the compiled runtime calls forward without hooks (one traced
    into the graph made the compile fail and the model run eager for good), and the clock times its passes."""
    from specdec.runtime.study import ForwardClock

    target = compiled_tiny("llama")
    runtime = compiled_forward(target)
    clock = ForwardClock({"target": target})
    ids = torch.cat([GREEDY_PROMPT, GREEDY_PROMPT], dim=1)
    lm = CachedLM(target)
    lm.forward(ids[:, :5])  # wider than every bucket: eager, through the runtime
    lm.forward(ids[:, 5:6])  # compiled first here, under the clock
    lm.forward(ids[:, 6:8])
    assert runtime.record.eager_reason is None and {(1, 1), (1, 2)} <= set(runtime.record.seconds)
    assert clock.calls == {"target": 3} and clock.seconds["target"] > 0
    clock.remove()
    assert "run" not in vars(runtime) and runtime.compiled.__name__ != "timed"
    lm.forward(ids[:, 8:9])
    assert clock.calls == {"target": 3}


def test_a_prompts_last_logits_alone_are_those_of_the_whole_pass():
    """A pass wider than every bucket runs eager; asked for its last position only (a prompt's prefill), the output
    layer runs over that row alone (logits_to_keep): the whole pass's last logits, the cache filled alike."""
    target = compiled_tiny("llama")
    prompt = torch.cat([GREEDY_PROMPT, GREEDY_PROMPT], dim=1)  # 12 tokens: wider than every bucket
    whole, last = CachedLM(target), CachedLM(target)
    logits = whole.forward(prompt)
    rows = []
    hook = target.lm_head.register_forward_hook(lambda module, inputs, out: rows.append(inputs[0].shape[-2]))
    assert last.forward(prompt, last_only=True).shape == (1, 1, logits.shape[-1])
    hook.remove()
    assert rows == [1]  # the output layer ran over the last position alone
    torch.testing.assert_close(last.forward(prompt[:, :5]), whole.forward(prompt[:, :5]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(CachedLM(target).forward(prompt, last_only=True), logits[:, -1:], rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_a_pass_is_padded_to_its_bucket_and_the_padding_cropped():
    target = compiled_tiny("llama")
    lm = CachedLM(target)
    lm.forward(GREEDY_PROMPT[:, :3])
    runtime = compiled_forward(target)
    assert runtime.bucket(3) == 4 and runtime.bucket(5) is None
    logits = lm.forward(GREEDY_PROMPT[:, 3:6])  # 3 tokens: the 4-wide graph
    assert logits.shape[:2] == (1, 3) and lm.slots == 6
    assert all(int(layer.filled) == 6 for layer in lm.cache.layers)
    assert (1, 4) in runtime.record.seconds


def test_the_cheapest_measured_bucket_is_chosen():
    target = compiled_tiny("llama")
    runtime = compiled_forward(target)
    runtime.pass_ms = {1: 10.0, 2: 30.0, 4: 20.0}
    assert runtime.bucket(2) == 4  # a 2-token pass is cheaper padded to 4 here
    assert runtime.bucket(1) == 1
    runtime.pass_ms = {1: 10.0, 2: 9.8, 4: 9.6}  # within timing noise: no padding
    assert runtime.bucket(1) == 1 and runtime.bucket(2) == 2
    runtime.pass_ms = {1: 10.0, 2: 30.0}  # a bucket never timed is never chosen over a timed one
    assert runtime.bucket(2) == 2 and runtime.bucket(3) == 4


@pytest.mark.exhaustive  # make test: the choice of bucket (test_the_cheapest_measured_bucket_is_chosen) and padding
def test_buckets_are_timed_at_load_and_a_pass_pads_to_the_cheapest():
    """time_buckets fills pass_ms with every bucket's time; a 2-token pass then runs in the cheapest bucket that holds
    it, and padded to 4 the greedy output is still HF's eager one."""
    target = compiled_tiny("llama")
    build_graphs(target)
    runtime = compiled_forward(target)
    pass_ms = time_buckets(target, context=8, repeats=3)
    assert set(pass_ms) == set(WIDTHS) and all(ms > 0 for ms in pass_ms.values()) and runtime.pass_ms == pass_ms
    cheapest = min((w for w in WIDTHS if w >= 2), key=lambda w: (pass_ms[w], w))
    padded = pass_ms[cheapest] < (1 - PAD_GAIN) * pass_ms[2]  # measured clearly cheaper than its own bucket
    assert runtime.bucket(2) == (cheapest if padded else 2)
    runtime.pass_ms = {1: 1.0, 2: 3.0, 4: 2.0}  # as measured on a CPU whose 2-row GEMM is the slower
    shapes, graph = [], runtime.compiled
    runtime.compiled = lambda *inputs: shapes.append(tuple(inputs[0].shape)) or graph(*inputs)
    runtime.direct = None  # every pass through runtime.compiled, which the lambda watches (padding comes before)
    expected = hf_greedy(target, GREEDY_PROMPT, N_NEW)
    out = speculative_generate(target, ModelDrafter(perturbed_copy(target, 0.15)), GREEDY_PROMPT, k=1,
                               sampling=GREEDY, max_new_tokens=N_NEW)
    assert torch.equal(out.tokens, expected) and 0 < out.stats.acceptance_rate < 1
    assert (1, 4) in shapes and (1, 2) not in shapes  # every 2-token pass ran in the 4-wide graph
    assert time_buckets(eager_tiny := tiny_model("llama", seed=0)) == {} and compiled_forward(eager_tiny) is None


def test_the_compiler_runs_under_the_runtime_settings():
    """Freezing is read from inductor's global config before torch.compile's options apply: every compiled call that
    may compile (the first of a shape, and any whose guards are all checked) runs with the runtime's settings patched
    in. A call of a shape seen before checks only the guards that tell graphs apart, where dynamo refuses to
    recompile: it runs without the patch (a config patch costs about 0.1 ms a call)."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.eval_frame import _is_skip_guard_eval_unsafe_stance

    target = compiled_tiny("llama")
    runtime = compiled_forward(target)
    seen = []

    def spy(*args):
        seen.append((_is_skip_guard_eval_unsafe_stance(), inductor_config.freezing, inductor_config.cpp.weight_prepack))
        return runtime.run(*args)

    runtime.compiled = spy
    lm = CachedLM(target)
    lm.forward(GREEDY_PROMPT[:, :2])  # into an empty cache: eager
    lm.forward(GREEDY_PROMPT[:, 2:3])  # a first step: compiles
    lm.forward(GREEDY_PROMPT[:, 3:4])  # a step again: the guarded path
    lm.forward(GREEDY_PROMPT[:, 4:6])  # a first 2-token pass: compiles
    may_compile = [settings for guarded, *settings in seen if not guarded]
    assert len(may_compile) == 2 and {tuple(s) for s in may_compile} == {(True, False)}  # autotune=False: frozen,
    # no MKLDNN prepacking
    assert [guarded for guarded, *_ in seen] == [False, True, False]
    assert (inductor_config.freezing, inductor_config.cpp.weight_prepack) != (True, False)  # restored after


@pytest.mark.exhaustive  # make test keeps the rule's side (tests/test_cost_model.py)
def test_a_round_that_compiles_a_graph_teaches_k_auto_no_times():
    """A graph compiles (or loads from disk) at its first pass: seconds to a minute, timed as that round's pass. The
    loop marks such a round untimed, and k="auto" learns its acceptance but not its times (it took a 56 s compile
    for the cost of a plain step and drafted where plain steps were faster)."""
    from specdec.choose.cost import CostModel

    target = compiled_tiny("llama")
    rule, rounds, recorded = CostModel(k_max=3), [], []
    observe, record_pass = rule.observe, rule.record_pass
    rule.observe = lambda r: (rounds.append(r.timed), observe(r))[1]
    rule.record_pass = lambda *a: (recorded.append(a), record_pass(*a))[1]
    out = speculative_generate(target, ModelDrafter(perturbed_copy(target, 0.15)), GREEDY_PROMPT, k=rule,
                               sampling=GREEDY, max_new_tokens=N_NEW)
    assert torch.equal(out.tokens, hf_greedy(target, GREEDY_PROMPT, N_NEW))
    untimed = rounds.count(False)
    assert 1 <= untimed <= len(WIDTHS)  # at most one first pass per bucket
    assert len(recorded) == len(rounds) - untimed  # no pass time from a compiling round

    fresh = compiled_tiny("llama")
    build_graphs(fresh)  # what experiments.run does when it loads a model: every bucket now
    assert set(compiled_forward(fresh).record.seconds) == {(1, w) for w in WIDTHS}
    graphs = graphs_built()
    speculative_generate(fresh, ModelDrafter(perturbed_copy(fresh, 0.15)), GREEDY_PROMPT, k="auto",
                         sampling=GREEDY, max_new_tokens=N_NEW)
    assert graphs_built() == graphs  # no pass compiled


@pytest.mark.exhaustive  # make test keeps the compiled chain's greedy equality (llama)
def test_a_graph_built_at_another_thread_count_counts_as_a_compile():
    """Dynamo guards a graph on torch's thread count: a pass at another count compiles it again, which
    graphs_built counts and the cache reports (CachedLM.graphs_built, what the decoding loop reads), so that
    no rule learns a pass time from that pass."""
    target = compiled_tiny("llama")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        build_graphs(target)
        lm = CachedLM(target)
        lm.forward(GREEDY_PROMPT[:, :3])  # the first pass allocates the cache, eager
        graphs, reported = graphs_built(), lm.graphs_built
        lm.forward(GREEDY_PROMPT[:, 3:4])
        assert graphs_built() == graphs and lm.graphs_built == reported  # a built graph, at its thread count
        torch.set_num_threads(2)
        lm.forward(GREEDY_PROMPT[:, 4:5])
        assert graphs_built() == graphs + 1 and lm.graphs_built == reported + 1
    finally:
        torch.set_num_threads(threads)


@pytest.mark.exhaustive  # make test: the compiled batch of trees in tests/test_greedy_matrix.py
@pytest.mark.parametrize("dynamic_width", [False, True])
def test_batches_and_trees_on_the_compiled_runtime(dynamic_width):
    """Several rows (dead slots, position masks) and token trees (ancestry masks) on the compiled runtime, with a
    graph per bucket or one for every width (tests/test_dynamic_width.py)."""
    target = compiled_tiny("llama", dynamic_width=dynamic_width)
    draft = perturbed_copy(target, 0.15)
    prompts = [GREEDY_PROMPT, GREEDY_PROMPT[:, :4]]
    out = speculative_generate(target, ModelDrafter(draft), prompts, k=2, sampling=GREEDY, max_new_tokens=12)
    for prompt, tokens in zip(prompts, out.tokens):
        assert torch.equal(tokens, hf_greedy(target, prompt, 12))
    tree = tree_generate(target, ModelTreeDrafter(draft, branches=(2,), depth=2, nodes=3), GREEDY_PROMPT, sampling=GREEDY,
                         max_new_tokens=12)
    assert torch.equal(tree.tokens, hf_greedy(target, GREEDY_PROMPT, 12))


def test_a_model_that_cannot_compile_runs_eager_with_one_line(caplog):
    """torch's dynamic int8 layers do not trace: the copy runs eager, says why once, and decodes as before."""
    model = dynamic_int8_copy(tiny_model("llama", seed=0, scale=20.0))
    expected = autoregressive_generate(model, GREEDY_PROMPT, sampling=GREEDY, max_new_tokens=8).tokens
    runtime = compile_model(model, widths=WIDTHS, capacity=64, autotune=False)
    with caplog.at_level(logging.WARNING, logger="specdec.runtime.compiled"):
        out = autoregressive_generate(model, GREEDY_PROMPT, sampling=GREEDY, max_new_tokens=8).tokens
        again = autoregressive_generate(model, GREEDY_PROMPT, sampling=GREEDY, max_new_tokens=8).tokens
    assert torch.equal(out, expected) and torch.equal(again, expected)
    assert runtime.eager and "runs eager" in caplog.text
    assert len([r for r in caplog.records if "runs eager" in r.message]) == 1
    assert CachedLM(model).compiled is None  # later caches take the eager runtime's plain path


def test_bad_settings_are_refused():
    model = tiny_model("llama", seed=0)
    with pytest.raises(ValueError, match="widths must be >= 1"):
        compile_model(model, widths=(), capacity=64)
    with pytest.raises(ValueError, match="capacity=8 must hold"):
        compile_model(model, widths=(1, 8), capacity=8)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        compile_model(model)


@pytest.mark.exhaustive  # compiles a pair; the greedy checks above run the compiled path in `make test`
@pytest.mark.parametrize("k", [1, 2])
def test_speculative_sampling_on_the_compiled_runtime_keeps_the_target_distribution(k):
    """The chi-square test of test_exactness.py, on compiled copies of its pair (same seeds, same power)."""
    target = tiny_model("llama", seed=0, scale=6.0, vocab_size=5, n_layers=1)
    draft = tiny_model("llama", seed=2, scale=6.0, vocab_size=5, n_layers=1)
    for model in (target, draft):
        compile_model(model, widths=(1, 2, 4), capacity=16, autotune=False)
    prompt, n, sampling = torch.tensor([[0, 3, 1]]), 3, Sampling(1.0)
    drafter = ModelDrafter(draft)

    def generate(g):
        return speculative_generate(target, drafter, prompt, k=k, sampling=sampling, max_new_tokens=n,
                                    generator=g).tokens

    counts = sample_counts(generate, 5, n, seed=k)
    eager_model(target), eager_model(draft)
    assert chi_square_pvalue(counts, sequence_distribution(target, prompt, n, sampling)) > PASS
    assert chi_square_pvalue(counts, sequence_distribution(draft, prompt, n, sampling)) < REJECT


def test_one_graph_serves_every_cache_and_sequence_length(monkeypatch):
    """A graph guards on its inputs' dispatch keys and strides: a cache's fill count must be the same kind of tensor
    wherever the cache was made (a timing helper makes them in inference mode, a decoding loop outside), and a pass
    sliced out of a longer sequence must not carry that sequence's stride, or new caches and lengths recompile."""
    target = compiled_tiny("llama")
    CachedLM(target).forward(GREEDY_PROMPT)  # the prefill runs eager; then one compiled step each
    first = CachedLM(target)
    first.forward(GREEDY_PROMPT[:, :5])
    first.forward(GREEDY_PROMPT[:, 5:6])
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)  # from here a recompile raises
    with torch.inference_mode():
        inside = CachedLM(target)
    inside.forward(GREEDY_PROMPT[:, :5])
    inside.forward(GREEDY_PROMPT[:, 5:6])
    inside.crop(5)  # outside inference mode
    longer = CachedLM(target)  # a step sliced out of a longer sequence (another stride): the same graph too
    ids = torch.cat([GREEDY_PROMPT, GREEDY_PROMPT], dim=1)
    longer.forward(ids[:, :9])
    assert longer.forward(ids[:, 9:10]).shape[1] == 1


def test_a_call_seen_before_calls_its_graph_directly_with_the_same_bits(monkeypatch):
    """After a pass through dynamo, a pass with inputs of the same key calls its graph directly
    (specdec.runtime.direct): the same logits and the same cache, bit for bit, as the same passes through dynamo;
    a key never seen (another width, a new cache's first pass) still goes through dynamo."""
    target = compiled_tiny("llama")
    runtime = compiled_forward(target)
    widths = [1, 2, 1, 4, 1, 3, 1]

    def passes() -> tuple[list[torch.Tensor], CachedLM]:
        lm, at, logits = CachedLM(target), 9, []
        lm.forward(GREEDY_PROMPT[:, :at])
        for width in widths:
            logits.append(lm.forward(torch.arange(at, at + width)[None] % target.config.vocab_size))
            at += width
        return logits, lm

    through, dynamo_lm = passes()  # the first time every key goes through dynamo
    assert runtime.direct and all(runtime.direct.values())  # each key bound to its graph
    steps = CachedLM(target)  # steps past the first 64 slots: new keys (a wider window), the same graph and call
    steps.forward(GREEDY_PROMPT[:, :9])
    for at in range(9, 80):
        steps.forward(torch.tensor([[at % target.config.vocab_size]]))
    assert len({id(call) for call in runtime.direct.values()}) < len(runtime.direct)
    monkeypatch.setattr(runtime, "through_dynamo", None)  # from here a call through dynamo raises
    direct, direct_lm = passes()
    assert all(torch.equal(a, b) for a, b in zip(through, direct))
    for ours, theirs in zip(direct_lm.cache.layers, dynamo_lm.cache.layers):
        assert torch.equal(ours.key_buffer, theirs.key_buffer) and torch.equal(ours.filled, theirs.filled)
    two = CachedLM(target)  # two rows: a key never seen goes through dynamo
    two.forward(GREEDY_PROMPT[:, :9].repeat(2, 1))  # (a prompt wider than every bucket runs eager)
    with pytest.raises(TypeError, match="not callable"):
        two.forward(torch.zeros(2, 1, dtype=torch.long))


def test_a_dropped_compiled_model_is_freed_and_a_copy_runs_eager():
    """The runtime lives on its model (specdec.runtime.compiled.Runtimes): dropping the model frees both, where a
    registry of models would keep every compiled model of a sweep or a bench alive; a copy of a compiled model is
    eager until it is compiled itself."""
    model = tiny_model("llama", seed=0)
    compile_model(model, widths=(1,))  # lazy: nothing compiles before a pass
    assert compiled_forward(model) is not None and compiled_forward(copy.deepcopy(model)) is None
    dropped = weakref.ref(model)
    del model
    gc.collect()
    assert dropped() is None
