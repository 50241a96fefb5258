"""Fused projections: an attention layer's q, k and v as one packed product, an MLP's gate and up as another.

A step on the packed kernel calls it seven times a layer; the three projections of the attention's input and the
two of the MLP's each read the same row. Fused, a layer makes four calls instead of seven: each call has a cost of
its own (the graph's dispatch, the kernel's threads), and a call over few outputs (k and v: 192 of SmolLM2's) reads
its weights at a fraction of the rate a wide one does. On the kernel one call over the outputs of several is
exactly their calls: it sums each output over k in one order, whatever the panel it falls in
(kernels/packed_mm.cpp), so the fused layer's outputs are the parts' outputs, bit for bit, prompts included (a
linear that holds its weight as panels only runs every pass on the kernel).

Only where every part is a packed linear of one kind without a bias (PackedInt8Linear, or a float32 PackedLinear
holding its weight as panels only) and the layer is one whose forward this module restates (Llama's attention; the
gated MLPs of Llama, Mistral, Qwen2 and Gemma): the layer's class becomes a subclass whose forward reads the fused
product (FusedAttention, FusedMLP). A copy made from a fused model reads each part by its own name (part_linear).
"""

from __future__ import annotations

import sys

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .packed import PANEL, PackedInt8Linear, PackedLinear, unpanel

ATTENTIONS = ("LlamaAttention",)  # attention classes whose forward FusedAttention restates
MLPS = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "GemmaMLP", "Gemma2MLP", "Gemma3MLP")  # down(act(gate(x)) * up(x))


def fused_int8(parts: list[PackedInt8Linear]) -> PackedInt8Linear:
    """One PackedInt8Linear whose outputs are the parts' outputs in order: their int8 rows packed in panels again
    (torch.ops.specdec.pack), their scales padded to the panels."""
    rows = torch.cat([unpanel(part.packed, part.out_features) for part in parts])
    scales = torch.cat([part.scales[: part.out_features] for part in parts])
    fused = PackedInt8Linear.__new__(PackedInt8Linear)
    torch.nn.Module.__init__(fused)
    fused.in_features, fused.out_features, fused.bias = parts[0].in_features, rows.shape[0], None
    fused.register_buffer("packed", torch.ops.specdec.pack(rows))
    fused.register_buffer("scales", torch.cat([scales, scales.new_zeros(fused.packed.shape[0] * PANEL - len(scales))]))
    return fused


def fused_float(parts: list[PackedLinear]) -> PackedLinear:
    """One PackedLinear whose outputs are the float32 parts' outputs in order, for passes of the same rows."""
    linear = torch.nn.Linear(parts[0].in_features, sum(part.out_features for part in parts), bias=False, device="meta")
    linear.weight = torch.nn.Parameter(torch.cat([part.dense_weight() for part in parts]), requires_grad=False)
    return PackedLinear(linear, parts[0].rows)


def fusable(module: torch.nn.Module, names: tuple[str, ...]) -> bool:
    """Whether the module's linears `names` are packed ones of one kind without a bias over one input width: int8,
    or float32 panels without a kept weight (every pass of those on the kernel, whatever their `rows`)."""
    parts = [getattr(module, name, None) for name in names]
    int8 = all(type(part) is PackedInt8Linear for part in parts)
    panels = all(type(part) is PackedLinear and part.weight is None and part.packed.dtype == torch.float32
                 for part in parts)
    return ((int8 or panels) and all(part.bias is None for part in parts)
            and len({part.in_features for part in parts}) == 1)


def fuse(module: torch.nn.Module, names: tuple[str, ...], fused_name: str, cls: type) -> None:
    """Replace the module's linears `names` by one fused linear `fused_name` and make it a `cls` of its own class."""
    parts = [getattr(module, name) for name in names]
    setattr(module, fused_name, fused_int8(parts) if type(parts[0]) is PackedInt8Linear else fused_float(parts))
    module.fused_name, module.fused_names = fused_name, names
    module.fused_sizes = [part.out_features for part in parts]
    for name in names:
        delattr(module, name)
    module.__class__ = fused_class(type(module), cls)


_classes: dict[tuple[type, type], type] = {}


def fused_class(base: type, cls: type) -> type:
    """The subclass of `base` with `cls`'s forward, one per pair, named in this module (so that a model pickles)."""
    if (base, cls) not in _classes:
        name = f"Fused{base.__name__}"
        _classes[base, cls] = type(name, (cls, base), {"__module__": __name__, "source": sys.modules[base.__module__]})
        setattr(sys.modules[__name__], name, _classes[base, cls])
    return _classes[base, cls]


class FusedAttention(torch.nn.Module):
    """Llama's attention with q, k and v from one product (qkv_proj), then as transformers computes it: rotary
    embeddings, the cache, the model's attention function, o_proj (`source`: the module of the layer's class)."""

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None, cache=None, **kwargs
                ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q, k, v = (part.view(shape).transpose(1, 2) for part in self.qkv_proj(hidden_states).split(self.fused_sizes,
                                                                                                    dim=-1))
        cos, sin = position_embeddings
        q, k = self.source.apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                       self.source.eager_attention_forward)
        out, weights = attend(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


class FusedMLP(torch.nn.Module):
    """A gated MLP, down(act(gate(x)) * up(x)), with gate and up from one product (gate_up_proj)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.fused_sizes, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


def fuse_projections(model: torch.nn.Module) -> int:
    """Fuse q/k/v and gate/up of every layer of `model` where they are packed linears (module docstring), in place;
    returns how many layers it fused."""
    fused = 0
    for module in list(model.modules()):
        name = type(module).__name__
        if name in ATTENTIONS and fusable(module, ("q_proj", "k_proj", "v_proj")):
            fuse(module, ("q_proj", "k_proj", "v_proj"), "qkv_proj", FusedAttention)
            fused += 1
        elif name in MLPS and fusable(module, ("gate_proj", "up_proj")):
            fuse(module, ("gate_proj", "up_proj"), "gate_up_proj", FusedMLP)
            fused += 1
    return fused


def part_linear(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """The submodule `name` of the model as its class builds it: one that fusing took out of a float32 model (a
    layer's q_proj) comes back as an nn.Linear with its rows of the fused weight (new memory)."""
    parent, _, child = name.rpartition(".")
    layer = model.get_submodule(parent)
    if child not in getattr(layer, "fused_names", ()):
        return model.get_submodule(name)
    fused = getattr(layer, layer.fused_name)
    index = layer.fused_names.index(child)
    start = sum(layer.fused_sizes[:index])
    rows = slice(start, start + layer.fused_sizes[index])
    weight = fused.dense_weight()[rows]
    linear = torch.nn.Linear(fused.in_features, weight.shape[0], bias=False, device="meta")
    linear.weight = torch.nn.Parameter(weight.contiguous(), requires_grad=False)
    return linear
