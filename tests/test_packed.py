"""The packed small-row kernel (specdec.runtime.packed): x @ W^T to float rounding, each row's result independent of
the pass's width, and a model on it gives the eager model's greedy output on the compiled runtime.

The kernel needs AVX-512; on other CPUs these tests are skipped and the runtime keeps inductor's linears (tested
below through the config's one logged line)."""

import logging
import os
import shutil

import pytest
import torch
from fakes import GREEDY_PROMPT, hf_greedy

from specdec import GREEDY, ModelDrafter, speculative_generate
from specdec.runtime.compiled import compile_model, compiled_forward
from specdec.runtime.fused import fuse_projections
from specdec.runtime.models import load_model
from specdec.runtime.packed import (
    PackedInt8Linear,
    PackedLinear,
    PanelEmbedding,
    all_packed,
    load_kernel,
    ninja_on_path,
    pack_linears,
    row_cost,
    unavailable_reason,
    unpack_linears,
)
from specdec.runtime.tiny import perturbed_copy, tiny_model

needs_avx512 = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


@pytest.fixture(scope="module")
def kernel():
    load_kernel()  # built once per machine into the specdec cache (about 45 s), loaded afterwards
    return torch.ops.specdec


@needs_avx512
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,n,k", [(1, 48, 16), (3, 100, 37), (8, 96, 64), (9, 7, 5), (17, 130, 48)])
def test_packed_product_equals_the_matrix_product(kernel, rows, n, k, dtype):
    """Any rows (tiles of 8 and a rest), outputs that fill no whole panel of 48 (masked stores), odd widths; bfloat16
    weights are widened exactly and summed in float32."""
    torch.manual_seed(rows)
    x, weight = torch.randn(rows, k), torch.randn(n, k).to(dtype)
    packed = kernel.pack(weight)
    y = kernel.packed_mm(x, packed, n)
    assert packed.dtype == dtype and y.shape == (rows, n) and y.is_contiguous() and y.dtype == torch.float32
    torch.testing.assert_close(y, x @ weight.float().T, atol=1e-4, rtol=1e-4)


@needs_avx512
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_result_does_not_depend_on_the_pass_width(kernel, dtype):
    """Each output sums over k in the same order whatever the rows: a token's outputs in a pass of any width 1..16
    are bit for bit those of a one-token step (inductor's and oneDNN's GEMMs differ by shape)."""
    torch.manual_seed(0)
    x, weight = torch.randn(16, 200), torch.randn(150, 200).to(dtype)
    packed = kernel.pack(weight)
    alone = torch.cat([kernel.packed_mm(x[row:row + 1], packed, 150) for row in range(16)])
    for width in range(1, 17):
        assert torch.equal(kernel.packed_mm(x[:width], packed, 150), alone[:width]), width


@needs_avx512
def test_wrong_inputs_fail_with_a_message(kernel):
    packed = kernel.pack(torch.randn(10, 8))
    with pytest.raises(RuntimeError, match="width"):
        kernel.packed_mm(torch.randn(2, 9), packed, 10)
    with pytest.raises(RuntimeError, match="N does not match"):
        kernel.packed_mm(torch.randn(2, 8), packed, 60)
    with pytest.raises(ValueError, match="first, last"):
        pack_linears(tiny_model("llama", seed=0), (0, 4))


@needs_avx512
@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("gemma3", True)])
def test_packed_linears_keep_the_model_and_hold_each_weight_once(arch, tied):
    """Every float32 weight lives as panels only, every pass of it (a long prompt's too) takes the kernel, each row's
    bits whatever the pass's width, and the weight comes back bit for bit (unpack_linears); a bfloat16 one keeps its
    weight for passes outside the rows; an input embedding tied to the output layer reads the same rows out of the
    output layer's panels (times Gemma's embed_scale), so the tied weight is held once."""
    model = tiny_model(arch, seed=0, scale=20.0, vocab_size=512, tie_word_embeddings=tied)  # the largest weight
    reference, embedded = model(GREEDY_PROMPT).logits, model.get_input_embeddings()(GREEDY_PROMPT)
    weights = {name: m.weight.detach().clone() for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    swapped = pack_linears(model, (1, 4))
    assert swapped == sum(isinstance(m, PackedLinear) for m in model.modules()) > 0
    packed = {name: m for name, m in model.named_modules() if isinstance(m, PackedLinear)}
    assert all(m.weight is None for m in packed.values())
    assert all(torch.equal(m.dense_weight(), weights[name]) for name, m in packed.items())
    assert isinstance(model.get_input_embeddings(), PanelEmbedding) == tied
    assert torch.equal(model.get_input_embeddings()(GREEDY_PROMPT), embedded)
    vocabulary = model.config.vocab_size * model.config.hidden_size
    held = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()] if t.numel() >= vocabulary}
    assert len(held) == (1 if tied else 2)  # the output layer's panels (and an untied embedding)
    x = torch.randn(300, model.config.hidden_size)  # a long prompt's rows
    bf16 = tiny_model(arch, seed=0, scale=20.0).to(torch.bfloat16)  # its prompts run faster on the weights
    pack_linears(bf16, (1, 4))
    assert all(m.weight is not None for m in bf16.modules() if isinstance(m, PackedLinear))
    q_proj = "model.layers.0.self_attn.q_proj"
    wide = packed[q_proj](x)
    assert torch.equal(wide[7:8], packed[q_proj](x[7:8]))
    torch.testing.assert_close(wide, torch.nn.functional.linear(x, weights[q_proj]), atol=1e-4, rtol=1e-4)
    out = model(GREEDY_PROMPT).logits  # 6 rows, past `rows`: the kernel too, whose sums may round otherwise
    torch.testing.assert_close(out, reference, atol=1e-4, rtol=1e-4)
    step = model(GREEDY_PROMPT[:, :3]).logits  # 3 rows: the kernel
    torch.testing.assert_close(step, reference[:, :3], atol=1e-4, rtol=1e-4)
    assert len(unpack_linears(model)) == swapped and not any(isinstance(m, PackedLinear) for m in model.modules())
    assert torch.equal(model(GREEDY_PROMPT).logits, reference)


@needs_avx512
@pytest.mark.xdist_group("inductor")
def test_greedy_output_on_the_compiled_runtime_with_packed_linears():
    """...and each graph traces the decoder layer once, stamping it out for the other layer (specdec.runtime.regions;
    every architecture: tests/test_compiled.py)."""
    from torch._dynamo.utils import compilation_time_metrics

    target = tiny_model("llama", seed=0, scale=20.0)
    expected = hf_greedy(target, GREEDY_PROMPT, 24)
    before = [len(compilation_time_metrics.get(key, [])) for key in ("invoke_subgraph_trace",
                                                                      "invoke_subgraph_reuse_stamp_out")]
    compile_model(target, widths=(1, 2, 4), capacity=64, packed_rows=(1, 8))
    out = speculative_generate(target, ModelDrafter(perturbed_copy(target, 0.15)), GREEDY_PROMPT, k=3,
                               sampling=GREEDY, max_new_tokens=24)
    assert torch.equal(out.tokens, expected) and 0 < out.stats.acceptance_rate < 1
    runtime = compiled_forward(target)
    assert runtime.record.eager_reason is None and (1, 4) in runtime.record.seconds
    assert any(isinstance(m, PackedLinear) for m in target.modules())
    assert isinstance(target.model.layers[0].mlp.gate_up_proj, PackedLinear)  # fused (specdec.runtime.fused)
    assert runtime.options["freezing"] is False  # every linear packed: weights stay inputs (AOTAutograd's cache)
    traces, stamps = (len(compilation_time_metrics.get(key, [])) - count for key, count in
                      zip(("invoke_subgraph_trace", "invoke_subgraph_reuse_stamp_out"), before))
    assert runtime.regions and traces == stamps == len(runtime.record.seconds) >= 1  # 2 layers: 1 trace, 1 stamp


@needs_avx512
@pytest.mark.xdist_group("inductor")
@pytest.mark.exhaustive
def test_a_region_that_does_not_trace_leaves_the_layers_traced_one_by_one(monkeypatch, caplog):
    """Where tracing the decoder layer as a region fails, the graph is traced again with each layer on its own (one
    logged line) and the model stays compiled, its greedy output HF's."""
    from specdec.runtime import regions

    def unsupported(*args, **kwargs):
        torch._dynamo.graph_break()  # fullgraph=True: tracing fails
        return regions.layer_pass(*args, **kwargs)

    monkeypatch.setattr(regions, "LAYER_REGION", torch.compiler.nested_compile_region(unsupported))
    target = tiny_model("llama", seed=1, scale=20.0)
    expected = hf_greedy(target, GREEDY_PROMPT, 12)
    compile_model(target, widths=(1, 2), capacity=64, packed_rows=(1, 8))
    with caplog.at_level(logging.WARNING):
        out = speculative_generate(target, ModelDrafter(perturbed_copy(target, 0.15)), GREEDY_PROMPT, k=1,
                                   sampling=GREEDY, max_new_tokens=12)
    runtime = compiled_forward(target)
    assert "decoder layers traced one by one" in caplog.text
    assert not runtime.regions and runtime.record.eager_reason is None and runtime.record.seconds
    assert torch.equal(out.tokens, expected) and all("forward" not in vars(layer) for layer in target.model.layers)


@needs_avx512
def test_row_cost_times_the_packed_linears_at_two_row_counts():
    """The ratio of the packed linears' cost at 8 rows to one row (runtime.step_graph=auto reads it): a positive
    number for a packed model; None where no packed linear takes that many rows, or the model has none."""
    model = tiny_model("llama", seed=0)
    pack_linears(model, (1, 8))
    cost = row_cost(model, 8, repeats=3)
    assert cost is not None and 0.2 < cost < 20
    assert row_cost(model, 9) is None  # wider than the packed rows: those passes run F.linear
    assert row_cost(tiny_model("llama", seed=0), 8) is None


def test_without_avx512_the_runtime_keeps_inductors_linears(monkeypatch, caplog):
    from specdec.runtime import packed

    monkeypatch.setattr(packed.torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    target = tiny_model("llama", seed=0)
    with caplog.at_level(logging.WARNING):
        compile_model(target, widths=(1, 2), capacity=32, packed_rows=(1, 8))
    assert "needs AVX-512 (this CPU: AVX2)" in caplog.text
    assert not any(isinstance(m, PackedLinear) for m in target.modules())
    assert compiled_forward(target).options["freezing"] is True  # inductor's linears: frozen weights


def test_the_build_finds_ninja_without_an_activated_venv(monkeypatch):
    """cpp_extension needs `ninja` on PATH; the ninja wheel (a dependency) provides it when the system has none."""

    monkeypatch.setenv("PATH", "/nonexistent")
    ninja_on_path()
    assert shutil.which("ninja") is not None and os.environ["PATH"].endswith("/nonexistent")


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    """The weight an int8 copy computes with: symmetric int8, one scale per output (the largest |w| over 127)."""
    scale = weight.abs().amax(1, keepdim=True) / 127
    return (weight / scale).round().clamp(-127, 127) * scale


@needs_avx512
@pytest.mark.parametrize("rows,n,k", [(1, 48, 16), (3, 100, 37), (9, 7, 5), (17, 130, 48)])
def test_int8_product_equals_the_product_with_the_dequantized_weight(kernel, rows, n, k):
    torch.manual_seed(rows)
    x, weight = torch.randn(rows, k), torch.randn(n, k)
    packed, scales = kernel.pack_int8(weight)
    assert packed.dtype == torch.int8 and packed.shape == ((n + 47) // 48, k, 48) and scales.shape == (packed.shape[0] * 48,)
    y = kernel.packed_int8_mm(x, packed, scales, n)
    torch.testing.assert_close(y, x @ dequantized(weight).T, atol=1e-4, rtol=1e-4)
    assert (y - x @ weight.T).abs().max() > 1e-4  # it is int8: not the float32 product
    with pytest.raises(RuntimeError, match="int8 packed weight"):
        kernel.packed_int8_mm(x, kernel.pack(weight), scales, n)


@needs_avx512
def test_an_int8_linear_built_by_blocks_is_its_whole_weight_packed(kernel):
    """PackedInt8Linear quantizes 64 panels of outputs at a time (weight_blocks), from an nn.Linear or from a
    PackedLinear's panels: the panels and scales of the whole weight packed at once, the last panel partial."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 64 * 48 * 2 + 20)
    packed, scales = kernel.pack_int8(linear.weight.detach())
    for source in (linear, PackedLinear(linear, (1, 16))):
        copy = PackedInt8Linear(source)
        assert torch.equal(copy.packed, packed) and torch.equal(copy.scales, scales), type(source)
        assert torch.equal(copy.bias, linear.bias.detach()) and copy.out_features == linear.out_features


@needs_avx512
def test_a_packed_int8_copy_drafts_for_its_float32_target(tmp_path):
    """load_model(quantization='packed_int8'): every linear, the tied output layer included, becomes int8 on the
    kernel and keeps no float32 weight; the embedding stays float32; the copy is close to its target (most drafts
    accepted) and the output stays the target's."""
    target = tiny_model("llama", seed=0, scale=20.0)
    target.save_pretrained(tmp_path)
    linears = sum(isinstance(m, torch.nn.Linear) for m in target.modules())
    draft = load_model(str(tmp_path), quantization="packed_int8")
    assert sum(isinstance(m, PackedInt8Linear) for m in draft.modules()) == linears
    assert not any(isinstance(m, torch.nn.Linear) for m in draft.modules()) and all_packed(draft)
    assert all(p.dtype == torch.float32 for p in draft.parameters())  # embedding and norms only
    assert {b.dtype for name, b in draft.named_buffers() if name.endswith("packed")} == {torch.int8}
    x = torch.ones(1, draft.lm_head.in_features)
    torch.testing.assert_close(draft.lm_head(x), x @ dequantized(target.lm_head.weight.detach()).T, atol=1e-4,
                               rtol=1e-4)
    expected = hf_greedy(target, GREEDY_PROMPT, 24)
    out = speculative_generate(target, ModelDrafter(draft), GREEDY_PROMPT, k=4, sampling=GREEDY, max_new_tokens=24)
    assert torch.equal(out.tokens, expected) and out.stats.acceptance_rate > 0.8
    with pytest.raises(ValueError, match="runs on the CPU only, not on cuda"):
        load_model(str(tmp_path), device="cuda", quantization="packed_int8")


@needs_avx512
@pytest.mark.parametrize("arch,fused_per_layer", [("llama", 2), ("gemma3", 1), ("qwen2", 1)])
def test_fused_projections_give_the_unfused_copys_logits_bit_for_bit(tmp_path, arch, fused_per_layer):
    """fuse_projections: Llama's q/k/v as one packed int8 call, every gated MLP's gate/up as another (Gemma 3's
    attention, with its q/k norms, and Qwen2's, with biases, keep theirs); the copy's logits are the unfused copy's,
    bit for bit (each output sums over k in one order, whatever panel it falls in), and it still pickles."""
    import pickle

    tiny_model(arch, seed=0, scale=20.0).save_pretrained(tmp_path)
    plain, fused = (load_model(str(tmp_path), quantization="packed_int8") for _ in range(2))
    assert fuse_projections(fused) == fused_per_layer * fused.config.num_hidden_layers
    assert (not hasattr(fused.model.layers[0].self_attn, "q_proj")) == (fused_per_layer == 2)
    assert not hasattr(fused.model.layers[0].mlp, "up_proj") and hasattr(fused.model.layers[0].mlp, "gate_up_proj")
    assert torch.equal(fused(GREEDY_PROMPT).logits, plain(GREEDY_PROMPT).logits)
    assert torch.equal(pickle.loads(pickle.dumps(fused))(GREEDY_PROMPT).logits, plain(GREEDY_PROMPT).logits)


@needs_avx512
def test_fused_false_leaves_a_call_per_linear():
    """compile_model(fused=False) (runtime.fused=false): every linear keeps its own call; the default fuses."""
    plain, fused = (tiny_model("llama", seed=0, scale=20.0) for _ in range(2))
    compile_model(plain, widths=(1,), capacity=64, packed_rows=(1, 8), fused=False)
    compile_model(fused, widths=(1,), capacity=64, packed_rows=(1, 8))
    assert hasattr(plain.model.layers[0].self_attn, "q_proj") and hasattr(plain.model.layers[0].mlp, "up_proj")
    assert hasattr(fused.model.layers[0].self_attn, "qkv_proj") and not hasattr(fused.model.layers[0].mlp, "up_proj")


@needs_avx512
def test_a_copy_of_a_fused_float32_model_reads_each_part_by_name():
    """fuse_projections on float32 panels: the model's logits bit for bit (a step, and a prompt past `rows`: on the
    kernel too), and a packed int8 copy made from it (copy_of reads each q_proj as its rows of the fused weight,
    part_linear) is the copy of the unfused model, bit for bit."""
    from specdec.runtime.copies import copy_of

    plain, fused = (tiny_model("llama", seed=0, scale=20.0) for _ in range(2))
    for model in (plain, fused):
        pack_linears(model, (1, 4))
    assert fuse_projections(fused) == 2 * fused.config.num_hidden_layers
    assert isinstance(fused.model.layers[0].self_attn.qkv_proj, PackedLinear)
    for prompt in (GREEDY_PROMPT[:, :3], GREEDY_PROMPT):
        assert torch.equal(fused(prompt).logits, plain(prompt).logits)
    copies = [copy_of(model, "packed_int8") for model in (plain, fused)]
    assert torch.equal(copies[1](GREEDY_PROMPT).logits, copies[0](GREEDY_PROMPT).logits)


@needs_avx512
@pytest.mark.xdist_group("inductor")
def test_a_packed_int8_draft_runs_compiled_whatever_runtime_drafts_says(tmp_path):
    """With runtime.drafts=false, draft models stay eager, but a packed_int8 copy compiles (its eager step costs
    about twice its compiled one), on one static graph of width 1 where it reads the target's cache (steps=True),
    its cache in bfloat16 (runtime.draft_cache's default); the greedy output stays the target's."""
    from specdec.auto.runtime import RuntimeOptions, put_on_runtime
    from specdec.runtime.models import dynamic_int8_copy

    target = tiny_model("llama", seed=0, scale=20.0)
    target.save_pretrained(tmp_path)
    runtime = RuntimeOptions("compiled", widths=(2,), capacity=64, packed_rows=(1, 8), drafts=False)
    place = {"device": "cpu", "max_new_tokens": 64, "draft": True}
    draft, other = load_model(str(tmp_path), quantization="packed_int8"), dynamic_int8_copy(tiny_model("llama"))
    put_on_runtime(draft, runtime, steps=True, **place)
    put_on_runtime(other, runtime, **place)
    assert compiled_forward(other) is None
    compiled = compiled_forward(draft)
    assert compiled is not None and compiled.record.eager_reason is None and set(compiled.record.seconds) == {(1, 1)}
    assert compiled.widths == (1,) and not compiled.dynamic_width
    put_on_runtime(draft, runtime, **place)  # already on the runtime: left as it is
    assert compiled_forward(draft) is compiled
    drafter = ModelDrafter(draft, reads_target_cache=True)
    out = speculative_generate(target, drafter, GREEDY_PROMPT, k=3, sampling=GREEDY, max_new_tokens=24)
    assert torch.equal(out.tokens, hf_greedy(target, GREEDY_PROMPT, 24)) and out.stats.acceptance_rate > 0.8
    assert compiled.cache_dtype == torch.bfloat16 and drafter.lm.cache.layers[0].key_buffer.dtype == torch.bfloat16
    assert all(hasattr(layer.self_attn, "qkv_proj") and hasattr(layer.mlp, "gate_up_proj")
               for layer in draft.model.layers)  # compiled with its projections fused (specdec.runtime.fused)


def test_cpu_int8_is_the_packed_copy_where_the_kernel_runs_else_torchs(tmp_path, monkeypatch, caplog):
    """quantization='cpu_int8' (the cross-vocabulary drafts' copies): packed_int8 on a CPU with AVX-512, torch's
    dynamic int8 elsewhere, said in one line."""
    from specdec.runtime import packed

    tiny_model("llama", seed=0).save_pretrained(tmp_path)
    monkeypatch.setattr(packed.torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    with caplog.at_level(logging.INFO, logger="specdec.runtime.models"):
        dynamic = load_model(str(tmp_path), quantization="cpu_int8")
    assert "quantization=cpu_int8: dynamic_int8, as the packed kernel needs AVX-512" in caplog.text
    assert not any(isinstance(m, (PackedInt8Linear, torch.nn.Linear)) for m in dynamic.modules())
    monkeypatch.undo()
    if unavailable_reason() is None:  # this CPU has AVX-512
        assert all_packed(load_model(str(tmp_path), quantization="cpu_int8"))


@needs_avx512
def test_weight_bytes_count_the_panels_and_a_shared_tensor_once():
    """runtime=auto's size rule and the tables' weights_mb read weight_bytes: a packed model's panels are buffers,
    and a tied or shared weight is held once (panels pad each layer's outputs to a multiple of 48)."""
    from specdec.runtime.study import weight_bytes

    model = tiny_model("llama", seed=0, vocab_size=512, tie_word_embeddings=True)
    before = weight_bytes(model)
    assert before == sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    pack_linears(model, (1, 4))
    assert before <= weight_bytes(model) <= 1.6 * before
    assert weight_bytes(model, model) == weight_bytes(model)
