"""A compiled runtime: a model's forward under torch.compile over a preallocated cache (the gpt-fast design).

A one-token step reads every weight once, and a pass of a few tokens should reuse each weight it reads, so it should
cost about one step. Eager linears on a CPU do not get there (a pass of 2-5 tokens costs 1.5-2 steps); inductor's C++
GEMM template with frozen weights does. Three things make the forward compilable once per shape:
- the cache is a SlotLayer buffer of fixed capacity written in place (its fill count is a tensor), so a forward's
  shapes do not change as the sequence grows;
- every compiled pass has one of a few widths (buckets): a pass of n tokens is padded on the right with dead
  queries to the cheapest bucket that holds it, and the padded slots are cropped afterwards; or, with dynamic_width
  on a CPU, one graph takes every width up to the widest bucket as it is (the width an unbacked size);
- the mask (from specdec.runtime.cached) covers a window of the buffer: the slots in use rounded up to a multiple
  of WINDOW (on a CPU; elsewhere the whole buffer), a dimension every graph takes as dynamic, so no graph depends on
  the cache's length, and attention reads only the window (specdec.runtime.attention); there the buffer's length is
  dynamic too, so a cache that outgrows its capacity (a long prompt) keeps its graphs.
Passes wider than every bucket (a prompt) run eager on the same cache.

Compiled code is cached by inductor on disk (TORCHINDUCTOR_CACHE_DIR, by default under the specdec cache folder):
the first process on a machine pays the compile, later ones load it (and still trace the model, its decoder layer
once per graph rather than once per layer: specdec.runtime.regions). A model that does not compile (an architecture,
a quantized layer) runs eager, with one logged line saying why.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from .attention import GROUPED, shipped_attention, use_grouped_attention, window_kernel
from .direct import GraphRecorder, call_key
from .fused import fuse_projections
from .graphs import CudaGraphs
from .inductor import (
    allow_graphs,
    cpu_options,
    cuda_options,
    dynamic_capacity,
    dynamic_window,
    graphs_built,
    inductor_settings,
    mark_width,
    own_code,
    skip_buffer_guards,
    use_inductor_cache,
)
from .masks import MASKED_BACKENDS
from .packed import all_packed, use_packed_kernel
from .regions import drop_layer_regions, regions_inlined, use_layer_regions

log = logging.getLogger(__name__)
PAD_GAIN = 0.05  # a pass pads to a wider bucket only when that bucket measured at least this much cheaper

WIDTHS = (1, 2, 4, 8)  # default buckets: new tokens per row of a compiled pass
CAPACITY = 512  # default slots per row of the preallocated cache (doubled when a sequence outgrows it)
WINDOW = 64  # default: attention reads the slots in use rounded up to a multiple of this (CPU, GROUPED attention)


def check_settings(widths: tuple[int, ...], capacity: int) -> None:
    """Buckets of at least one token, and a cache that holds two passes of the widest."""
    if not widths or min(widths) < 1:
        raise ValueError(f"widths must be >= 1, got {widths}")
    if capacity < 2 * max(widths):
        raise ValueError(f"capacity={capacity} must hold two passes of the widest width ({max(widths)}): raise it "
                         "or drop that width")


@dataclass
class CompileRecord:
    """What compiling cost: seconds of each shape's first call, and whether inductor's disk cache held it."""

    seconds: dict[tuple[int, int], float] = field(default_factory=dict)  # (rows, width) -> first call's seconds
    cache_hits: int = 0  # graphs loaded from inductor's disk cache
    cache_misses: int = 0  # graphs compiled afresh and stored
    cache_bypassed: int = 0  # graphs compiled afresh that the disk cache refused (e.g. MKLDNN-prepacked weights)
    eager_reason: str | None = None  # why the model runs eager, if it does

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def warm(self) -> bool:
        """Every graph came from the disk cache."""
        return self.cache_misses == 0 and self.cache_bypassed == 0 and self.cache_hits > 0


class Rebucket(Exception):
    """One graph for every width failed to compile for a pass: pad it to its bucket and run it again (CachedLM)."""


class CompiledForward:
    """model(input_ids, position_ids, 4D mask, cache) under torch.compile, one graph per (rows, width bucket).

    widths: the buckets; capacity: cache slots per row; autotune: inductor's max_autotune (the C++ GEMM template
    on a CPU, Triton's on a GPU); cpp_wrapper: on a CPU, the graph's calls in C++ (cpu_options); cuda_graphs: on a
    GPU, passes replayed as CUDA graphs (specdec.runtime.graphs); window: attention
    reads the slots in use rounded up to a multiple of this (0: the whole buffer; see `window`). pass_ms (width ->
    measured ms, filled by the caller) makes `bucket` pick the cheapest bucket that holds a pass instead of the
    smallest. dynamic_width: on a CPU, one graph per row count for every width up to the widest bucket, each pass at
    its own width (mark_width), instead of one graph per bucket with passes padded to it. cache_dtype: the dtype its
    caches hold states in (None: the model's; a draft's float32 states kept in bfloat16 read half the bytes).
    direct: on a CPU, a call like one seen before calls its graph directly, not through dynamo (specdec.runtime.direct).
    """

    built = 0  # graphs that the calls of every compiled runtime in this process traced (compiled, loaded from
    # the disk cache, or compiled again where a guard failed): a pass during which this grew timed a compile

    def __init__(self, model: PreTrainedModel, widths: tuple[int, ...] = WIDTHS, capacity: int = CAPACITY,
                 autotune: bool = False, cpp_wrapper: bool = False, window: int = WINDOW, cuda_graphs: bool = True,
                 dynamic_width: bool = False, cache_dtype: torch.dtype | None = None, direct: bool = True):
        check_settings(widths, capacity)
        self.model, self.widths, self.capacity = model, tuple(sorted(set(widths))), capacity
        self.cache_dtype = cache_dtype
        self.dynamic_width = dynamic_width and model.device.type == "cpu"
        self.pass_ms: dict[int, float] = {}
        self.record = CompileRecord()
        self.seen: set[tuple] = set()  # input shapes (a cache: its capacity) of calls that ran, guards checked
        attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
        self.window_slots = window if attention == GROUPED else 0  # GROUPED attention reads the mask's window only
        cuda = model.device.type == "cuda"
        frozen = not all_packed(model)  # packed linears read their panels, not frozen weights (cpu_options)
        options = cuda_options(autotune) if cuda else cpu_options(autotune, cpp_wrapper, frozen)
        allow_graphs(256)
        self.options = options  # applied around every call that may compile: torch.compile's options= leave
        # freezing off (inductor_settings)
        self.regions = not options["freezing"] and use_layer_regions(model) > 0  # each graph traces the decoder
        # layer once, not once per layer (specdec.runtime.regions); frozen weights are graph constants, which a
        # region's trace cannot be stamped out over (torch 2.13)
        self.recorder = GraphRecorder(options)  # inductor with these options, keeping each graph's input sources
        self.compiled = torch.compile(own_code(type(self).run).__get__(self), fullgraph=True, dynamic=False,
                                      backend=self.recorder, options={"guard_filter_fn": skip_buffer_guards(model)})
        self.graphs = CudaGraphs(self.compiled) if cuda and cuda_graphs else None  # replays of passes seen before
        self.direct = {} if direct and not cuda else None  # call_key -> DirectCall (None: every call via dynamo)

    def __reduce__(self):
        """A copy of a compiled model runs eager: its runtime copies as None (Runtimes)."""
        return type(None), ()

    def run(self, tokens: torch.Tensor, positions: torch.Tensor, mask, cache, keep: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The model's logits (B, n, V) and last hidden states (B, n, d) for tokens (B, n) at positions (B, n),
        appended to cache; keep > 0 (an eager pass, a prompt): the logits of the last `keep` positions only, the
        output layer run over those rows alone. The hidden states (after the final norm: a draft head's features,
        specdec.runtime.features) are one more output of the same graph, so a target that keeps them needs no
        graphs of its own."""
        out = self.model.forward(input_ids=tokens, position_ids=positions, attention_mask=mask, cache=cache,
                                 use_cache=True, output_hidden_states=True, logits_to_keep=keep)
        # forward: hooks on the model (a bench's clock) stay out of the graph; traced into it, a hook that dynamo
        # cannot follow makes the compile fail
        return out.logits, out.hidden_states[-1]

    @property
    def eager(self) -> bool:
        return self.record.eager_reason is not None

    def bucket(self, width: int) -> int | None:
        """The bucket a pass of `width` tokens runs in (None: wider than every bucket, or the model runs eager): the
        smallest that holds it, or a wider one measured at least PAD_GAIN cheaper (pass_ms), so that timing noise
        between buckets of equal cost does not pad passes for nothing."""
        fits = [w for w in self.widths if w >= width]
        if self.eager or not fits:
            return None
        if self.dynamic_width:
            return width
        cheapest = min(fits, key=lambda w: (self.pass_ms.get(w, float("inf")), w))
        own = self.pass_ms.get(fits[0], float("inf"))
        return cheapest if self.pass_ms.get(cheapest, float("inf")) < (1 - PAD_GAIN) * own else fits[0]

    def window(self, slots: int, capacity: int) -> int:
        """Key slots a pass attends over when `slots` are in use with it: a multiple of WINDOW, or the whole
        buffer (of `capacity` slots) where the model's attention reads every slot its cache returns."""
        return min(capacity, self.rounded(slots)) if self.window_slots else capacity

    def rounded(self, slots: int) -> int:
        """`slots` rounded up to a multiple of the window's step (WINDOW)."""
        return -(-slots // self.window_slots) * self.window_slots

    def room(self, slots: int) -> int:
        """Slots a cache must hold for a pass that fills `slots`: with a window, one more than the window, so that the
        window stays narrower than the buffer and the graphs that take both as dynamic hold (dynamic_capacity)."""
        return self.rounded(slots) + 1 if self.window_slots else slots

    def __call__(self, *inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """run(*inputs) in the graph of the first input's shape (tokens (B, n): rows and width; rows and the widest
        bucket with dynamic_width): called directly where a call of the same key ran it before (direct), else through
        dynamo (through_dynamo)."""
        key = call_key(inputs) if self.direct is not None and self.graphs is None else None  # (replays: graphs)
        direct = self.direct.get(key) if key is not None else None
        if direct:
            return direct(inputs)
        self.recorder.forget()
        out = self.through_dynamo(*inputs)
        if key is not None and key not in self.direct and (graph := self.recorder.ran(out)) is not None:
            self.direct[key] = graph.bind(type(self).run, self, inputs) or False  # False: always through dynamo
        return out

    def through_dynamo(self, *inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """__call__ through dynamo. Inputs of shapes seen before check only the guards that tell graphs apart (which
        shape), not the hundreds on the model's modules (about 1.5 ms a SmolLM2-135M pass), and outside inductor's
        settings (nothing compiles there)."""
        shape = (len(inputs[0]), max(self.widths)) if self.dynamic_width else tuple(inputs[0].shape)
        seen = tuple(getattr(x, "shape", None) or getattr(getattr(x, "layers", [None])[0], "capacity", None)
                     for x in inputs)  # tensor shapes, the cache's capacity
        if seen in self.seen:  # no compile on this path: inductor's settings stay as they are
            try:
                with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                    return (self.graphs or self.compiled)(*inputs)
            except RuntimeError as error:  # an input no graph of this shape was guarded for: compile one
                if "skip_guard_eval_unsafe" not in str(error):
                    raise
        graphs = graphs_built()
        with inductor_settings(self.options), regions_inlined():
            if self.window_slots:  # a call that may compile: its graph takes the window and the capacity as dynamic
                dynamic_window(inputs[2], inputs[3].layers[0].capacity)
                dynamic_capacity(inputs[3])
            if self.dynamic_width:
                mark_width(*inputs[:3], widest=max(self.widths))
            out = self.compiled(*inputs) if shape in self.record.seconds else self.first_call(shape, *inputs)
            self.seen.update([seen] if shape in self.record.seconds else [])  # guards checked: a grown cache got
            # its own graph
        CompiledForward.built += graphs_built() - graphs
        return out

    def first_call(self, shape, *inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Compile (or load) the graph of this shape, timing it. On failure, run this pass eager, and from now on a
        graph per bucket where one graph for every width failed (dynamic_width), else eager."""
        from torch._dynamo.utils import counters

        before = {key: counters["inductor"][f"fxgraph_cache_{key}"] for key in ("hit", "miss", "bypass")}
        start = time.perf_counter()
        try:
            out = self.compiled(*inputs)
        except Exception as error:  # noqa: BLE001 (any compiler failure: the model still runs, eager)
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            reason = f"{type(error).__name__}: {reason}"[:300]
            if self.dynamic_width:  # (Gemma 2's soft-capped attention, on torch 2.13; a batch's rows beyond the
                # packed kernel's)
                self.dynamic_width = False
                log.warning("%s: a graph per bucket, as one graph for every width failed (%s)",
                            type(self.model).__name__, reason)
                raise Rebucket  # the caller pads this pass to its bucket: it runs compiled as every later one does
                # (an eager pass here would round differently, and batch invariance would not hold)
            if self.regions:  # traced once more, each layer on its own, before the model runs eager
                self.regions = False
                drop_layer_regions(self.model)
                log.warning("%s: decoder layers traced one by one, as tracing them as one region failed (%s)",
                            type(self.model).__name__, reason)
                return self.first_call(shape, *inputs)
            self.record.eager_reason = reason
            log.warning("%s runs eager: torch.compile failed (%s)", type(self.model).__name__, reason)
            return self.run(*inputs)  # tracing failed before anything ran
        self.record.seconds[shape] = time.perf_counter() - start
        self.record.cache_hits += counters["inductor"]["fxgraph_cache_hit"] - before["hit"]
        self.record.cache_misses += counters["inductor"]["fxgraph_cache_miss"] - before["miss"]
        self.record.cache_bypassed += counters["inductor"]["fxgraph_cache_bypass"] - before["bypass"]
        return out


class Runtimes:
    """Each model's (or draft head's) compiled runtime, kept on the model itself. A dictionary from models to their
    runtimes, even a weak one, keeps every compiled model alive (a runtime refers to its model), so a sweep or a bench
    that moved on to another target kept the earlier ones, and their graphs, in memory; an attribute makes model and
    runtime one cycle that goes when the model does. A copy of a model (copy.deepcopy, pickle) runs eager
    (CompiledForward.__reduce__)."""

    attribute = "_specdec_runtime"

    def get(self, model: torch.nn.Module, default=None):
        return vars(model).get(self.attribute) or default

    def __contains__(self, model: torch.nn.Module) -> bool:
        return self.get(model) is not None

    def __getitem__(self, model: torch.nn.Module):
        if model not in self:
            raise KeyError(type(model).__name__)
        return self.get(model)

    def __setitem__(self, model: torch.nn.Module, runtime) -> None:
        vars(model)[self.attribute] = runtime

    def __delitem__(self, model: torch.nn.Module) -> None:
        vars(model).pop(self.attribute)

    def pop(self, model: torch.nn.Module, default=None):
        return vars(model).pop(self.attribute, None) or default


RUNTIMES = Runtimes()  # models and draft heads


def compile_model(model: PreTrainedModel, widths: tuple[int, ...] = WIDTHS, capacity: int = CAPACITY,
                  autotune: bool = False, packed_rows: tuple[int, int] | None = None,
                  cpp_wrapper: bool = False, window: int = WINDOW, cuda_graphs: bool = True,
                  dynamic_width: bool = False, invariant: bool | None = None, cache_dtype: torch.dtype | None = None,
                  fused: bool = True, direct: bool = True) -> CompiledForward:
    """Run `model` on the compiled runtime from now on: every CachedLM of it uses a slot cache and compiled
    passes (see the module's docstring). Compiles lazily, one graph per (rows, width bucket) at its first use.
    packed_rows (first, last): passes of that many rows (tokens times batch rows) run the model's float32 linears on
    the packed kernel (specdec.runtime.packed), where the CPU has one; elsewhere one logged line says why not.
    window: attention's window of the cache (CompiledForward.window; 0: every slot). cuda_graphs: on a GPU, a pass
    seen before on a cache replays as a CUDA graph (specdec.runtime.graphs). dynamic_width: on a CPU, one graph for
    every width up to the widest (CompiledForward). invariant: on a CPU, attention in compiled passes on a kernel that
    sums each row in one order (specdec.runtime.attention): with packed linears, batch-invariant passes; False: on
    the chunked kernel (faster after long contexts); None: True for a bfloat16 or float16 model (in float32 the
    chunked kernel's rounding differences between a step and a pass stay below what flips a greedy token in
    practice: docs/performance.md). cache_dtype: the dtype its caches hold states in (None: the model's), kept where
    the model's attention runs on our kernel (grouped attention on a CPU with AVX-512), which reads a cache of another
    dtype, and dropped elsewhere (a float32 draft's bfloat16 cache: specdec.auto.runtime.draft_cache_dtype).
    fused: where the linears are packed, each layer's q/k/v and gate/up as one call of the packed kernel
    (specdec.runtime.fused). direct: on a CPU, calls like ones seen before call their graph directly, not through
    dynamo (specdec.runtime.direct)."""
    check_compilable(model)
    invariant = model.dtype in (torch.bfloat16, torch.float16) if invariant is None else invariant
    grouped = use_grouped_attention(model, rowwise=invariant)
    if grouped:
        log.info("%s: attention reads each key/value head in place%s%s", type(model).__name__,
                 f", over the slots in use rounded up to {window}" if window else "",
                 "; compiled passes batch-invariant (window attention kernel)" if invariant else "")
    if packed_rows is not None:
        use_packed_kernel(model, packed_rows)
    if fused:  # where the linears are packed (packed_rows, or a packed int8 copy)
        fuse_projections(model)
    use_inductor_cache()
    cache_dtype = cache_dtype if grouped and window_kernel() else None  # only our kernel reads a cache of another dtype
    RUNTIMES[model] = CompiledForward(model, widths, capacity, autotune, cpp_wrapper, window, cuda_graphs,
                                      dynamic_width, cache_dtype, direct)
    return RUNTIMES[model]


def compiled_forward(model: PreTrainedModel) -> CompiledForward | None:
    """The model's compiled runtime, or None for the eager one."""
    return RUNTIMES.get(model)


def runs_compiled(model: PreTrainedModel | None) -> bool:
    """Whether the model's passes run compiled graphs (on the compiled runtime, and not fallen back to eager)."""
    runtime = RUNTIMES.get(model) if model is not None else None
    return runtime is not None and not runtime.eager


def eager_model(model: PreTrainedModel) -> None:
    """Back to the eager runtime (and its own linears, if they were packed)."""
    from .packed import unpack_linears

    RUNTIMES.pop(model, None)
    drop_layer_regions(model)
    unpack_linears(model)
    shipped_attention(model)


def check_compilable(model: PreTrainedModel) -> None:
    """The compiled runtime passes a 4D mask on every forward: it needs an attention that takes one."""
    backend = model.config._attn_implementation
    if backend not in MASKED_BACKENDS:
        raise ValueError(f"the compiled runtime passes 4D attention masks, which attn_implementation={backend!r} "
                         "does not take: load the model with attn_implementation='sdpa', or use runtime=eager")
