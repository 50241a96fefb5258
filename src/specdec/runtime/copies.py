"""Draft copies of a float32 model already in memory, built from its own weights one linear at a time.

A copy of the target (quantized, or in bfloat16) loaded from the weights file maps the whole file a second time: a
135M float32 target's 0.54 GB of file pages stand in memory next to the target while the copy is made, and a copy
loaded as it is keeps its own float32 embedding. `copy_of` instead takes each linear of the loaded model (a packed
one's weight laid back out of its panels), makes that one layer's copy, and shares every tensor it leaves as it is
(the embedding, the norms), so that making a copy costs the copy's own bytes and one layer's float32 weight.

The result is what `load_model(name, quantization=..., dtype=...)` makes from the file, bit for bit
(tests/test_models.py): the same per-layer quantization (torch's dynamic int8, bitsandbytes' int8 and 4-bit with
transformers' settings, the packed int8 kernel's), the same layers left in float32 (a bitsandbytes copy's output
layer). `load_model` remembers the float32 models it loaded (a weak reference) and builds a copy of one of them this
way; models loaded otherwise are not remembered.
"""

from __future__ import annotations

import copy
import warnings
import weakref

import torch
from transformers import PretrainedConfig, PreTrainedModel

from .fused import part_linear
from .packed import PackedInt8Linear, PackedLinear, PanelEmbedding

COPIES = ("packed_int8", "dynamic_int8", "int8", "nf4", "fp4", "none")  # quantizations copy_of makes
# (path, device) -> a float32 model load_model loaded, and its config as loaded (a runtime may change the model's)
_loaded: dict[tuple[str, str], tuple[weakref.ref, PretrainedConfig]] = {}


def remember(path: str, device: str, model: PreTrainedModel) -> None:
    """Note a float32, unquantized model load_model loaded from `path`, for copies of it."""
    _loaded[path, device] = weakref.ref(model), copy.deepcopy(model.config)


def loaded_original(path: str, device: str) -> tuple[PreTrainedModel, PretrainedConfig] | None:
    """The float32 model loaded from `path` onto `device` that is still alive, and its config as loaded; or None."""
    ref, config = _loaded.get((path, device), (lambda: None, None))
    model = ref()
    return (model, config) if model is not None and model.dtype == torch.float32 else None


def dense_linear(module: torch.nn.Module) -> torch.nn.Linear:
    """An nn.Linear with a source linear's weight: its own, or a packed one's laid back out (new memory)."""
    return module.unpacked() if isinstance(module, PackedLinear) else module


def dynamic_int8(module: torch.nn.Module, inplace: bool = False) -> torch.nn.Module:
    """The module with every nn.Linear replaced by torch's dynamic int8 Linear (quantize_dynamic, qint8), whole
    models (specdec.runtime.models.dynamic_int8_copy) and single layers (a copy_of) alike."""
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # torch marks torch.ao.quantization deprecated in favour of torchao
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return quantize_dynamic(module, {torch.nn.Linear}, dtype=torch.qint8, inplace=inplace).eval()


def bnb_linear(linear: torch.nn.Linear, quantization: str, compute_dtype: torch.dtype) -> torch.nn.Module:
    """bitsandbytes' int8 or 4-bit Linear of one layer, with the settings specdec.runtime.models.quantization_config
    gives transformers (LLM.int8 threshold 6.0; 4-bit blocks of 64, no double quantization, uint8 storage)."""
    import bitsandbytes as bnb

    weight = linear.weight.detach().float()
    if quantization == "int8":
        layer = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                    has_fp16_weights=False, threshold=6.0, device="meta")
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False).to("cpu")
    else:
        layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                  compute_dtype=compute_dtype, compress_statistics=False, quant_type=quantization,
                                  quant_storage=torch.uint8, device="meta")
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, compress_statistics=False,
                                         quant_type=quantization, quant_storage=torch.uint8, module=layer).to("cpu")
    if linear.bias is not None:
        layer.bias = torch.nn.Parameter(linear.bias.detach().float(), requires_grad=False)
    return layer


def linear_copy(linear: torch.nn.Linear | PackedLinear, quantization: str, compute_dtype: torch.dtype,
                cast) -> torch.nn.Module:  # fmt: skip
    """One layer's copy: quantized, or an nn.Linear of its tensors cast (`cast`: a tensor's copy in the copy's
    dtype, the same one for tied tensors). A packed source is read by blocks of its panels for a packed int8 copy,
    laid back out whole for the others."""
    if quantization == "packed_int8":
        return PackedInt8Linear(linear)
    linear = dense_linear(linear)
    if quantization == "dynamic_int8":
        # a copy of the one layer, without a float32 copy of it first: in place in a wrapper, the source as it is
        return dynamic_int8(torch.nn.Sequential(linear), inplace=True)[0]
    if quantization != "none":
        return bnb_linear(linear, quantization, compute_dtype)
    layer = torch.nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
    layer.weight = torch.nn.Parameter(cast(linear.weight), requires_grad=False)
    if linear.bias is not None:
        layer.bias = torch.nn.Parameter(cast(linear.bias), requires_grad=False)
    return layer


def kept_in_float(model: PreTrainedModel, quantization: str) -> set[str]:
    """Names of the linears a copy leaves as they are: a bitsandbytes copy's output layer (transformers keeps the
    layer tied to the input embedding unquantized)."""
    if quantization not in ("int8", "nf4", "fp4"):
        return set()
    output = model.get_output_embeddings()
    return {name for name, module in model.named_modules() if module is output}


def skeleton(model: PreTrainedModel, config: PretrainedConfig, dtype: torch.dtype) -> PreTrainedModel:
    """The model's class built on the meta device from `config`, with `dtype` as the default dtype (as
    from_pretrained builds a model it loads in that dtype: the buffers its layers make take it or keep their own)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            twin = type(model)(copy.deepcopy(config))
    finally:
        torch.set_default_dtype(default)
    twin.generation_config = copy.deepcopy(model.generation_config)
    twin.config.dtype = dtype
    return twin


def copy_of(model: PreTrainedModel, quantization: str = "none", dtype: torch.dtype = torch.float32,
            compute_dtype: torch.dtype | None = None, config: PretrainedConfig | None = None) -> PreTrainedModel:
    """A copy of a float32 model, quantized (COPIES) or cast to `dtype`, built layer by layer from its tensors; the
    tensors it leaves as they are shared with `model` (module/parameter structure as the model's class builds it
    from `config`: the model's config as loaded, before a runtime set its attention; default: the model's own)."""
    if quantization not in COPIES:
        raise ValueError(f"copy_of makes {COPIES}, not {quantization!r}")
    if model.dtype != torch.float32 or (quantization == "none" and dtype == torch.float32):
        raise ValueError(f"copy_of copies a float32 model into another form, not {model.dtype} into {dtype}")
    twin = skeleton(model, config or model.config, dtype if quantization == "none" else torch.float32)
    keep = kept_in_float(model, quantization)
    casts: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # id of a source tensor -> (it, its cast): ties stay ties

    def cast(tensor: torch.Tensor, to: torch.dtype = dtype) -> torch.Tensor:
        if to == tensor.dtype or not tensor.is_floating_point():
            return tensor
        source, done = casts.get(id(tensor), (None, None))
        if source is None or source() is not tensor:  # not cast yet (an id of a freed tensor may come again)
            done = tensor.detach().to(to)
            casts[id(tensor)] = (weakref.ref(tensor), done)
        return done

    for name, module in list(twin.named_modules()):
        source = part_linear(model, name)  # (a fused layer's q_proj: its rows of the fused weight)
        parent, _, child = name.rpartition(".")
        if isinstance(module, torch.nn.Linear) and name not in keep:
            setattr(twin.get_submodule(parent), child,
                    linear_copy(source, quantization, compute_dtype or dtype, cast))
            continue
        if isinstance(source, PanelEmbedding) and quantization != "none":  # float32 rows: the target's module
            setattr(twin.get_submodule(parent), child, source)
            continue
        source = dense_linear(source) if isinstance(source, PackedLinear) else source  # a kept output layer
        for key in [k for k, v in module._parameters.items() if v is not None]:  # one left as it is: the same
            # Parameter, so that moving it off the weights file (off_the_file) moves it for both models
            kept = cast(getattr(source, key))
            module._parameters[key] = kept if kept.dtype == getattr(source, key).dtype else torch.nn.Parameter(
                kept, requires_grad=False)
        for key in [k for k, v in module._buffers.items() if v is not None]:  # in the dtype the class made them
            module._buffers[key] = cast(getattr(source, key), module._buffers[key].dtype)
        for key, value in vars(module).items():  # tensors kept as plain attributes (a rotary embedding's)
            if isinstance(value, torch.Tensor):
                setattr(module, key, cast(getattr(source, key), value.dtype))
    return twin.eval()
