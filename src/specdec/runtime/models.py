"""Load models and tokenizers: hub ids, local folders, offline assets and random-weight shapes.

Names: a hub id, a local folder, an offline asset (offline:..., specdec.runtime.offline) or a random-weight shape
(random:..., specdec.runtime.tiny.RANDOM_SHAPES, for benchmarks). Quantization: bitsandbytes int8 / nf4 / fp4,
torch's dynamic int8 and the packed kernel's weight-only int8; copies of a loaded model in bf16, dynamic int8 or cut
to its first layers.
"""

from __future__ import annotations

import copy
import functools
import logging
import re

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .copies import COPIES, copy_of, dynamic_int8, loaded_original, remember
from .machine import map_large_allocations, off_the_file, use_huge_pages
from .offline import OFFLINE_ASSETS, ensure_offline_model
from .tiny import ByteTokenizer, random_model

log = logging.getLogger(__name__)

RANDOM = "random:"  # random:<shape>: a random-weight model of specdec.runtime.tiny.RANDOM_SHAPES (benchmarks)
BNB_QUANTIZATIONS = ("int8", "nf4", "fp4")  # bitsandbytes: LLM.int8 and 4-bit weights, CPU and CUDA
TORCH_QUANTIZATIONS = ("dynamic_int8",)  # torch dynamic int8 Linear layers (CPU only, no extra package)
KERNEL_QUANTIZATIONS = ("packed_int8",)  # int8 weights on specdec's packed kernel (CPU with AVX-512)
CPU_INT8 = "cpu_int8"  # packed_int8 where the packed kernel runs, else dynamic_int8 (cpu_int8_here)
QUANTIZATIONS = ("none", *BNB_QUANTIZATIONS, *TORCH_QUANTIZATIONS, *KERNEL_QUANTIZATIONS, CPU_INT8)
CPU_QUANTIZATIONS = (*TORCH_QUANTIZATIONS, *KERNEL_QUANTIZATIONS, CPU_INT8)  # these load in float32, on the CPU
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve(name: str) -> str:
    """An offline asset name becomes its converted folder; hub ids and local paths pass through."""
    if name in OFFLINE_ASSETS:
        return str(ensure_offline_model(OFFLINE_ASSETS[name]))
    if name.startswith("offline:"):
        raise ValueError(f"unknown offline model {name!r}; choices: {sorted(OFFLINE_ASSETS)}")
    return name


def quantization_config(quantization: str, compute_dtype: torch.dtype):
    """A bitsandbytes config for int8, nf4 or fp4; None for none and for torch's own quantizations."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; choices: {QUANTIZATIONS}")
    if quantization not in BNB_QUANTIZATIONS:
        return None
    try:
        import bitsandbytes  # noqa: F401  (imported only when quantizing)
    except ImportError as e:
        raise ImportError("quantization needs bitsandbytes: pip install 'specdec[quant]'") from e
    from transformers import BitsAndBytesConfig

    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quantization,
        bnb_4bit_compute_dtype=compute_dtype,
        bnb_4bit_use_double_quant=False,
    )


def check_device(device: str) -> None:
    """cpu, cuda or cuda:N, and CUDA actually present when asked for; a ValueError naming the fix otherwise."""
    if device == "cpu":
        return
    if not re.fullmatch(r"cuda(:\d+)?", device):
        raise ValueError(f"device={device!r} is not supported; choices: cpu, cuda, cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device={device} but CUDA is not available here. Run on a GPU machine, or add device=cpu "
            "dtype=float32 (hub pairs are slow on a CPU), or use an offline pair: model=smollm2"
        )
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise ValueError(f"device={device} but only {torch.cuda.device_count()} CUDA device(s) exist")


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """End-of-sequence ids of the model's generation config and its tokenizer."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))


def load_model(
    name: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    quantization: str = "none",
    compute_dtype: str | None = None,
    fused_4bit: bool = True,
) -> PreTrainedModel:
    """A causal LM in eval mode: hub id, local folder or offline asset; optionally quantized
    (bitsandbytes int8 / nf4 / fp4, torch's dynamic_int8 on the CPU, or packed_int8: int8 weights with a scale per
    output, float32 activations, on specdec's packed kernel, specdec.runtime.packed.packed_int8_copy).

    fused_4bit=False: a 4-bit model takes bitsandbytes' non-fused CPU path even where the fused kernel exists
    (force_unfused_4bit), standing in for a CPU without AVX512-BF16. A dynamic_int8 model loads in float32 whatever
    dtype says: torch's dynamic int8 Linear takes float32 activations (a bf16 target's int8 copy is then the same
    as an fp32 target's); so does a packed_int8 one. A quantized or bfloat16 copy of a float32 model this function
    loaded and that is still alive is built from that model's weights (specdec.runtime.copies.copy_of: the same
    bits, without reading the file again).
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choices: {sorted(DTYPES)}")
    map_large_allocations()  # what a run frees goes back to the system
    use_huge_pages()  # the weights on 2 MB pages, where the kernel gives them
    if quantization in CPU_QUANTIZATIONS:
        if device != "cpu":
            raise ValueError(cpu_only(quantization, device))
        dtype = "float32"
        quantization = cpu_int8_here() if quantization == CPU_INT8 else quantization
    qconfig = quantization_config(quantization, DTYPES[compute_dtype or dtype])
    if name.startswith(RANDOM):
        if quantization != "none":
            raise ValueError(f"{name}: random-weight models load unquantized (quantization='none')")
        return random_model(name.removeprefix(RANDOM), DTYPES[dtype], device)
    path = resolve(name)
    original = loaded_original(path, device) if device == "cpu" else None
    another_form = quantization != "none" if dtype == "float32" else quantization == "none"  # not a float32 twin
    if original is not None and quantization in COPIES and another_form:  # from its weights in memory, not the file
        model = copy_of(original[0], quantization, DTYPES[dtype], DTYPES[compute_dtype or dtype], original[1])
    else:
        model = from_file(name, path, dtype, device, quantization, qconfig)
    if quantization in ("nf4", "fp4") and not fused_4bit:
        force_unfused_4bit(model)  # before its first forward, which would repack the weights for the fused kernel
    return model


def from_file(name: str, path: str, dtype: str, device: str, quantization: str, qconfig) -> PreTrainedModel:
    """load_model's read of the weights file; a float32 model loaded as it is is remembered for copies of it
    (specdec.runtime.copies)."""
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], quantization_config=qconfig, device_map={"": device}
        )
    except OSError as e:
        raise OSError(
            f"could not load {name!r}: {e}\nIf it is a gated model, accept its license on the Hub and log in "
            "(`hf auth login` or HF_TOKEN). Without network, use the offline asset "
            f"{sorted(OFFLINE_ASSETS)} (e.g. `python -m experiments.run model=smollm2`)."
        ) from e
    if quantization == "none" and dtype == "float32":
        remember(path, device, model)
    if quantization == "packed_int8":
        from .packed import packed_int8_copy

        packed_int8_copy(model)
    model = dynamic_int8_copy(model, inplace=True) if quantization == "dynamic_int8" else model.eval()
    if quantization != "none" and device == "cpu":
        off_the_file(model)
    return model


def cpu_int8_here() -> str:
    """quantization='cpu_int8': the int8 copy that runs fastest on this CPU, packed_int8 where the packed kernel runs
    (AVX-512), else torch's dynamic_int8 (one logged line)."""
    from .packed import unavailable_reason

    reason = unavailable_reason()
    if reason:
        log.info("quantization=cpu_int8: dynamic_int8, as %s", reason)
        return "dynamic_int8"
    return "packed_int8"


def cpu_only(quantization: str, device: object) -> str:
    return (
        f"quantization={quantization!r} runs on the CPU only, not on {device}; on a GPU use a bitsandbytes "
        "quantization ('int8', 'nf4') or dtype='bfloat16'"
    )


def dynamic_int8_copy(model: PreTrainedModel, inplace: bool = False) -> PreTrainedModel:
    """The model with every nn.Linear (the tied lm_head included) replaced by torch's dynamic int8 Linear:
    int8 weights per tensor, activations quantized on the fly at each call; CPU only."""
    if model.device.type != "cpu":
        raise ValueError(cpu_only("dynamic_int8", model.device))
    return dynamic_int8(model, inplace=inplace)


def bfloat16_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A bfloat16 copy of the model's weights (half the bytes to read per step)."""
    return copy.deepcopy(model).to(torch.bfloat16).eval()


def force_unfused_4bit(model: PreTrainedModel) -> int:
    """Make a bitsandbytes 4-bit model take the non-fused CPU path: dequantize each weight, then torch matmul.

    bitsandbytes 0.50 fuses 4-bit matmuls on the CPU only when the CPU has AVX512-BF16: each Linear4bit
    stores has_avx512bf16() at construction (`support_avx512bf16_for_cpu`) and, on its first CPU forward,
    repacks its weight for the fused gemv_4bit kernel. Clearing that flag before the first forward sends
    every call through dequantize_4bit + matmul, the only path on CPUs without AVX512-BF16. Returns the
    number of layers that would have used the fused kernel (0 on such CPUs).
    """
    from bitsandbytes.nn import Linear4bit

    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    if not layers:
        raise ValueError("force_unfused_4bit needs a bitsandbytes 4-bit model (quantization='nf4' or 'fp4')")
    if any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in layers):
        raise ValueError(
            "this 4-bit model already ran a forward with the fused CPU kernel (its weights are repacked); "
            "call force_unfused_4bit right after load_model"
        )
    fused = sum(bool(m.support_avx512bf16_for_cpu) for m in layers)
    for m in layers:
        m.support_avx512bf16_for_cpu = False
    return fused


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer; a random-weight model's is a ByteTokenizer. Loaded once per process and folder: a pair
    of two vocabularies asks for the target's twice (the target's side and the cross-vocabulary drafter), and Gemma
    3's 262,144 tokens take about 3 s to load on a 2-core Xeon."""
    return ByteTokenizer() if name.startswith(RANDOM) else tokenizer_in(resolve(name))


@functools.lru_cache(maxsize=8)
def tokenizer_in(folder: str) -> PreTrainedTokenizerBase:
    """AutoTokenizer's tokenizer of a hub id or folder, shared by every caller (nothing here changes a tokenizer)."""
    return AutoTokenizer.from_pretrained(folder)


def check_tokenizers(
    target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase, target_name: str, draft_name: str
) -> None:
    """Speculative decoding compares p and q token by token: both models must share one vocabulary."""
    if target.get_vocab() != draft.get_vocab():
        raise ValueError(
            f"the tokenizers of {target_name!r} ({len(target)} tokens) and {draft_name!r} ({len(draft)} tokens) "
            "differ; speculative decoding needs a draft from the same model family with the same tokenizer"
        )


def draft_tokenizer(target: PreTrainedTokenizerBase, target_name: str, draft_name: str | None) -> PreTrainedTokenizerBase:
    """A draft model's tokenizer: the target's for a copy of the target (draft_name None or the target's), else the
    draft model's own, which must share the target's vocabulary (check_tokenizers)."""
    if draft_name is None or draft_name == target_name:
        return target
    tokenizer = load_tokenizer(draft_name)
    check_tokenizers(target, tokenizer, target_name, draft_name)
    return tokenizer


def layer_truncated_copy(model: PreTrainedModel, n_layers: int) -> PreTrainedModel:
    """The model's first n_layers blocks with its own embeddings and head, untrained: a deliberately weak draft."""
    layers = model.model.layers
    if not 1 <= n_layers < len(layers):
        raise ValueError(f"n_layers must be in [1, {len(layers) - 1}], got {n_layers}")
    small = copy.deepcopy(model)
    small.model.layers = small.model.layers[:n_layers]
    small.config.num_hidden_layers = n_layers
    if getattr(small.config, "layer_types", None):
        small.config.layer_types = small.config.layer_types[:n_layers]
    return small.eval()


def load_truncated_copy(name: str, n_layers: int, *, dtype: str = "float32", device: str = "cpu") -> PreTrainedModel:
    """The model `name` (as load_model loads it) cut to its first n_layers blocks: a deliberately weak draft."""
    return layer_truncated_copy(load_model(name, dtype=dtype, device=device), n_layers)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, chat: bool = True) -> torch.Tensor:
    """Token ids (1, L) of a prompt, through the chat template when the tokenizer has one and chat is True."""
    if chat and tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
        )
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    else:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    return ids.long()
