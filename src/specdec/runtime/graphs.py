"""CUDA graphs over compiled passes: on a GPU, a pass that ran before on the same cache replays its kernels at once.

On a GPU the compiled step of a large model is bound by launching its kernels, not by reading its weights: on an
H200 an 8B step took 13.6 ms without CUDA graphs and 6.4 ms with them, where reading its weights takes about 3.4 ms
(docs/performance.md). A CUDA graph launches a recorded sequence of kernels in one call. Inductor's own CUDA graphs
skip a graph that writes its inputs in place, and every pass writes the cache's buffers, so this module records the
passes itself (gpt-fast instead holds its cache as the model's buffers, whose addresses never change):

- a pass of a shape not seen on a cache runs as usual (that also warms up what a recording must not initialise),
  then is recorded once on that cache: the recorded kernels read and write the cache's buffers where they are;
- a later pass of that shape on that cache copies its small inputs (tokens, positions, masks) into the recording's
  own input tensors, replays it and copies its outputs out (the next replay overwrites them);
- recordings live with the cache they were made on (they are dropped with it) and are keyed by the input shapes and
  the addresses of the cache's buffers, so a cache that reallocates (it grew, or its rows changed) records afresh,
  and two caches of one model never replay each other's passes.

Each recording keeps its intermediates in a memory pool of its own (a pass's activations and outputs), freed with it.
Sharing one pool between recordings would save that memory, but a pool that every recording made in it has left
cannot be recorded into again (the CUDA caching allocator asserts so: seen on torch 2.11).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch

log = logging.getLogger(__name__)


def cache_addresses(cache) -> tuple[int, ...]:
    """Where the slot cache's tensors live: every layer's key and value buffer and fill count."""
    return tuple(tensor.data_ptr() for layer in cache.layers
                 for tensor in (layer.key_buffer, layer.value_buffer, layer.filled))


def signature(inputs: tuple, cache) -> tuple:
    """What a recording depends on: each input's shape and dtype (masks: per attention type) and the cache's
    addresses."""
    def described(x):
        if isinstance(x, dict):
            return tuple((kind, described(mask)) for kind, mask in sorted(x.items()))
        return None if x is None else (tuple(x.shape), x.dtype)

    return tuple(described(x) for x in inputs), cache_addresses(cache)


def static_copy(x):
    """An input tensor (or a dict of them) a recording reads: a copy of this pass's, to be refilled at each replay."""
    if isinstance(x, dict):
        return {kind: static_copy(mask) for kind, mask in x.items()}
    return None if x is None else x.clone(memory_format=torch.contiguous_format)


def refill(static, x) -> None:
    """Copy a pass's input into the recording's tensor of it."""
    if isinstance(static, dict):
        for kind, mask in static.items():
            refill(mask, x[kind])
    elif static is not None:
        static.copy_(x)


@dataclass
class Recording:
    """One recorded pass: its graph (replay()), the input tensors it reads, the output tensors it writes."""

    graph: object
    inputs: list
    outputs: tuple[torch.Tensor, ...]

    def replay(self, inputs: tuple) -> tuple[torch.Tensor, ...]:
        for static, x in zip(self.inputs, inputs):
            refill(static, x)
        self.graph.replay()
        return tuple(out.clone() for out in self.outputs)


class CudaGraphs:
    """forward(*inputs, cache) with every pass after a cache's first of its shape replayed from a recording (see the
    module's docstring). `recorded` counts the recordings made, `replayed` the passes replayed."""

    def __init__(self, forward):
        self.forward = forward
        self.by_cache: WeakKeyDictionary = WeakKeyDictionary()  # cache -> {signature: Recording}
        self.recorded = self.replayed = 0
        self.failed: str | None = None  # why recording stopped (the passes then run without graphs)
        self.stream = None

    def __call__(self, *inputs):
        *small, cache = inputs
        recordings = self.by_cache.setdefault(cache, {})
        key = signature(tuple(small), cache)
        if key in recordings:
            self.replayed += 1
            return recordings[key].replay(tuple(small))
        out = self.first_pass(*inputs)
        if self.failed is None:
            try:
                recordings[key] = self.record(tuple(small), cache)
                self.recorded += 1
            except Exception as error:  # noqa: BLE001 (a pass that cannot be recorded still runs)
                self.failed = f"{type(error).__name__}: {str(error).strip()[:200]}"
                log.warning("CUDA graphs off for this runtime: recording a pass failed (%s)", self.failed)
        return out

    def first_pass(self, *inputs):
        """The pass run as usual, on the stream recordings are made on (what a recording must find initialised,
        such as a library's workspace for that stream, is then there)."""
        if self.failed is not None:
            return self.forward(*inputs)
        self.stream = self.stream or torch.cuda.Stream()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = self.forward(*inputs)
        torch.cuda.current_stream().wait_stream(self.stream)
        for tensor in out:  # made on that stream, read on this one: not reused before this one is done with them
            tensor.record_stream(torch.cuda.current_stream())
        return out

    def record(self, small: tuple, cache) -> Recording:
        """Record the pass on `cache` with input tensors of its own (nothing runs while recording). The graph API's
        context manager is not used: it empties the allocator's cache at every recording, and a model records for
        every new cache."""
        static = [static_copy(x) for x in small]
        graph = torch.cuda.CUDAGraph()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            graph.capture_begin()  # a memory pool of its own, freed with it
            try:
                outputs = self.forward(*static, cache)
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(self.stream)
        return Recording(graph, static, tuple(outputs))

