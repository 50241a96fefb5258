"""Trace a model's decoder layer once per graph, not once per layer: hierarchical compilation.

Loading a compiled graph from inductor's disk cache still traces the model's Python code with dynamo, and most of
that trace is the decoder layers, the same code run once per layer (SmolLM2-135M: 30 layers, about 0.32 s each on a
2-core Xeon, 11 of the 17 s a graph took to load). torch.compiler.nested_compile_region marks a function whose trace
dynamo records once and stamps out again wherever it is called with inputs of the same kinds and shapes and a module
whose guarded attributes agree (a layer of the other kind, such as Gemma 3's sliding-window layers, gets a trace of
its own). Its inputs must be tensors, numbers or modules, so each layer's call goes through `layer_pass`, which takes
the layer's slice of the slot cache as three tensors (keys, values, fill count) and hands the layer a stand-in cache
(LayerSlots) that writes them as SlotLayer does. Inductor then sees the same flat graph as before
(inline_invoke_subgraph: the regions are inlined after tracing), so the compiled code, its speed and its numerics do
not change; only the trace is shorter.

The layer's keyword arguments (the attention mask, the rotary (cos, sin) pair, the position ids, flags) go into the
region as one flat row of positional values after a string naming them (flat_keywords), since dynamo matches a call
of flat positional leaves to a recorded trace directly, where keywords or a tuple cost a symbolic pytree flatten of
every call (on a 2-core AMD EPYC 0.45-0.8 s of a default run's warm load of a graph: docs/performance.md, The runtime).

Outside a compiled trace, and for a cache that is not a slot cache, each layer runs its own forward as before.
"""

from __future__ import annotations

import functools

import torch

from .layers import SlotLayer, write_slots

ATTRIBUTE = "forward"  # the instance attribute that routes a layer's calls through its region


class LayerSlots:
    """One layer's slot buffers as the cache its attention writes (cache.update), inside a region: the states go to
    slots filled.. as SlotLayer.update puts them."""

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, filled: torch.Tensor):
        self.key_buffer, self.value_buffer, self.filled = key_buffer, value_buffer, filled

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return write_slots(self.key_buffer, self.value_buffer, self.filled, key_states, value_states)


def layer_pass(layer: torch.nn.Module, hidden_states: torch.Tensor, key_buffer: torch.Tensor,
               value_buffer: torch.Tensor, filled: torch.Tensor, names: str = "", /, *values, **kwargs) -> torch.Tensor:
    """The decoder layer's own forward on its slots (the body of every layer's region), its keywords `kwargs` and
    those flat_keywords made into (`names`, `values`)."""
    kwargs.update(keywords_of(names, values))
    return type(layer).forward(layer, hidden_states, cache=LayerSlots(key_buffer, value_buffer, filled), **kwargs)


def flat_keywords(kwargs: dict) -> tuple[str, tuple] | None:
    """Keyword arguments as (names, values): each value a leaf (a tensor, number, string, bool or None) or a tuple
    of leaves, which stands as its items, its name marked with their count ("position_embeddings:2"); None where a
    value is another kind of container."""
    names, values = [], []
    for name, value in kwargs.items():
        if isinstance(value, tuple) and all(is_leaf(item) for item in value):
            names.append(f"{name}:{len(value)}")
            values.extend(value)
        elif is_leaf(value):
            names.append(name)
            values.append(value)
        else:
            return None
    return ",".join(names), tuple(values)


def is_leaf(value: object) -> bool:
    """Whether flat_keywords passes `value` as it is: a tensor, a number, a string, a bool or None."""
    return value is None or isinstance(value, (torch.Tensor, bool, int, float, str))


def keywords_of(names: str, values: tuple) -> dict:
    """The keyword arguments flat_keywords flattened into (names, values)."""
    kwargs, at = {}, 0
    for entry in names.split(",") if names else ():
        name, _, count = entry.partition(":")
        if count:
            kwargs[name] = tuple(values[at:at + int(count)])
            at += int(count)
        else:
            kwargs[name] = values[at]
            at += 1
    return kwargs


MAX_TRACES = 256  # traces the region keeps within one graph: one per kind of layer, each layer at most
LAYER_REGION = torch.compiler.nested_compile_region(layer_pass, max_reuse_entries=MAX_TRACES)


def regional_forward(layer: torch.nn.Module, hidden_states: torch.Tensor, *args, cache=None, **kwargs):
    """A decoder layer's forward: through LAYER_REGION while a graph is traced over a slot cache, else as shipped."""
    slots = cache.layers[layer.self_attn.layer_idx] if cache is not None else None
    if args or not isinstance(slots, SlotLayer) or not slots.held() or not torch.compiler.is_compiling():
        return type(layer).forward(layer, hidden_states, *args, cache=cache, **kwargs)
    flat = flat_keywords(kwargs)
    if flat is None:
        return LAYER_REGION(layer, hidden_states, slots.key_buffer, slots.value_buffer, slots.filled, **kwargs)
    names, values = flat
    return LAYER_REGION(layer, hidden_states, slots.key_buffer, slots.value_buffer, slots.filled, names, *values)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers (transformers' `model.layers`), each with an attention that knows its cache layer
    (self_attn.layer_idx); [] where the model is built otherwise."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        return []
    if not all(isinstance(getattr(getattr(layer, "self_attn", None), "layer_idx", None), int) for layer in layers):
        return []
    return list(layers)


def use_layer_regions(model: torch.nn.Module) -> int:
    """Route every decoder layer's calls through LAYER_REGION; the number of layers routed."""
    layers = decoder_layers(model)
    if len(layers) > MAX_TRACES:  # more kinds of layer than the region may keep traces of, in the worst case
        return 0
    for layer in layers:
        setattr(layer, ATTRIBUTE, functools.partial(regional_forward, layer))  # a partial of module-level functions:
        # copies and pickles of the model keep it (a bound method set on an instance does not unpickle)
    return len(layers)


def drop_layer_regions(model: torch.nn.Module) -> None:
    """Every decoder layer back to its own forward."""
    for layer in decoder_layers(model):
        if isinstance(vars(layer).get(ATTRIBUTE), functools.partial):
            delattr(layer, ATTRIBUTE)


def regions_inlined():
    """Dynamo's setting under which a traced region is inlined into the graph it is traced in, so that inductor
    compiles one flat graph (a context manager): the C++ wrapper (cpp_wrapper) has no code for a region's call."""
    return torch._dynamo.config.patch(inline_invoke_subgraph=True)
