"""Inductor's settings for the compiled runtime (specdec.runtime.compiled): what a CPU and a GPU compile with, how they
reach inductor, how many graphs dynamo may keep and which guards it checks, which input sizes a graph takes as
symbols, and where the compiled code is cached on disk."""

from __future__ import annotations

import os
import types
import weakref

import torch


def cpu_options(autotune: bool, cpp_wrapper: bool = False, frozen: bool = True) -> dict[str, object]:
    """Inductor settings on a CPU.

    frozen: the weights become constants the compiler folds and lays out (inductor's freezing). The C++ GEMM
    template needs it. Where every linear runs on the packed kernel (specdec.runtime.packed) it buys nothing: a graph
    with frozen weights is one that AOTAutograd's disk cache refuses, so a warm start builds that stage again. On
    `make run`'s profile the warm build took 8.6 s unfrozen against 22.2 s frozen, and 8-token passes 47.2-49.1 ms
    against 47.5-47.7 ms, interleaved (docs/results/compile-profile/freezing.py; docs/performance.md, "The
    runtime").

    cpp_wrapper: the graph's kernel calls in compiled C++, not Python: about 2.5-4 ms less a SmolLM2-135M pass. Its
    entry function and its kernels compile as separate units (cpp_wrapper_build_separate): a cold compile of
    `make run`'s graph took 70 s that way against 96 s as one unit, and its passes were no slower
    (docs/results/compile-profile).

    autotune: max_autotune with inductor's C++ GEMM template next to ATen's kernels (benchmarked per GEMM shape at
    compile time), on frozen weights whatever `frozen` says. Without it, MKLDNN weight prepacking is off: MKLDNN
    tensors cannot be pickled, and a graph holding one never reaches inductor's disk cache (CompileRecord counts such
    graphs as bypassed).
    """
    wrapper = {"cpp_wrapper": True, "cpp_wrapper_build_separate": True} if cpp_wrapper else {}
    if autotune:
        return {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"} | wrapper
    return {"freezing": frozen, "cpp.weight_prepack": False} | wrapper


def cuda_options(autotune: bool) -> dict[str, object]:
    """Inductor settings on a GPU: frozen weights, and none of inductor's CUDA graphs (mode="reduce-overhead"): they
    skip a graph that writes its inputs, as every pass writes the cache; specdec.runtime.graphs records passes."""
    return {"freezing": True, "triton.cudagraphs": False, "max_autotune": autotune}


def inductor_settings(options: dict[str, object]):
    """Inductor's global config patched with `options` (a context manager). torch.compile(options=...) hands its
    options to inductor's inner compile only, after compile_fx has read `freezing` from the global config: passed
    that way alone, the weights are never frozen and every linear stays an aten::mm on inputs."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(options)


def allow_graphs(count: int) -> None:
    """Let dynamo keep `count` graphs of a CompiledForward's code (one per shape; each model's runtime compiles its
    own copy of it, specdec.runtime.inductor.own_code), instead of silently running eager past its default of 8."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, count)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * count)


def own_code(function):
    """A copy of `function` with a code object of its own. Dynamo keeps the graphs of a code object together and
    looks a call up among all of them: with one code object shared by every model, a draft's step is checked against
    the target's graphs first, and the guards that fail there (on modules and parameters) join the guards checked on
    every later call, skip_guard_eval_unsafe or not (together with the buffers' guards, skip_buffer_guards, that was
    7% of a speculative run's time on SmolLM2-135M; docs/performance.md). Each runtime compiles its own copy, so a
    lookup sees that model's graphs only."""
    return types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__,
                              function.__defaults__, function.__closure__)


def skip_buffer_guards(model: torch.nn.Module):
    """A guard filter (torch.compile's guard_filter_fn) without the tensor guards on the model's buffers. Dynamo
    checks every tensor that is not a parameter on every call, skip_guard_eval_unsafe or not; the packed kernel's
    panels are buffers, one or two per linear, 211-422 of them in SmolLM2-135M. A model's buffers stay what they
    are while it is on the runtime (eager_model takes it off), so the inputs' guards are the ones worth checking."""
    held = {id(buffer): weakref.ref(buffer) for buffer in model.buffers()}

    def is_buffer(value) -> bool:  # by identity (an id alone may be reused once its tensor is freed)
        ref = held.get(id(value))
        return ref is not None and ref() is value

    return lambda entries: [not (entry.guard_type == "TENSOR_MATCH" and is_buffer(entry.value)) for entry in entries]


def inductor_cache_dir():
    """Inductor's on-disk cache under the specdec cache folder."""
    from .offline import cache_dir

    return cache_dir() / "inductor"


def use_inductor_cache() -> str:
    """Point inductor's disk cache at inductor_cache_dir(), unless TORCHINDUCTOR_CACHE_DIR names a folder of the
    user's; returns the folder in use. Importing torch._dynamo (transformers does) sets the variable to torch's
    default, a folder under the temporary directory that a reboot may empty, so a value equal to that default counts
    as unset. Inductor reads the variable at each use: setting it before the first compile is enough."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache_dir())
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


Masks = torch.Tensor | dict[str, torch.Tensor]  # one 4D mask, or one per attention kind (sliding windows)


def each_mask(masks: Masks) -> list[torch.Tensor]:
    return list(masks.values()) if isinstance(masks, dict) else [masks]


def dynamic_window(masks: Masks, capacity: int) -> None:
    """Mark every mask's key dimension (the window) dynamic, so that one graph serves every window, when the window
    is narrower than the cache: traced at the full buffer, slicing it to the window would pin the two equal."""
    for mask in each_mask(masks):
        if mask.shape[-1] < capacity:
            torch._dynamo.mark_dynamic(mask, mask.dim() - 1)


def dynamic_capacity(cache) -> None:
    """Mark every slot buffer's length (the cache's capacity, (B, H, capacity, D)) dynamic, so that one graph serves
    every capacity: a cache that grows past its capacity for a long prompt (SlotLayer.reserve) keeps its graphs
    instead of compiling new ones (about 90 s for SmolLM2-135M, once per distinct prompt length). Only where attention
    reads a window of the buffer (dynamic_window): the graph then never reads the capacity itself. A graph traced
    with the window as wide as the buffer ties the two together and keeps the capacity static (maybe_mark_dynamic
    lets it)."""
    for layer in cache.layers:
        if getattr(layer, "key_buffer", None) is not None:
            torch._dynamo.maybe_mark_dynamic(layer.key_buffer, 2)
            torch._dynamo.maybe_mark_dynamic(layer.value_buffer, 2)


def mark_width(tokens: torch.Tensor, positions: torch.Tensor, masks: Masks, widest: int) -> None:
    """Mark a pass's width (tokens and positions (B, n), masks (B, 1, n, K)) as one unbacked size of 1..widest,
    so that the graph traced for it serves every width: a backed size would be specialized at 1 (a second graph for
    the step) and its code would guard on the width it was traced at."""
    for tensor, dim in [(tokens, 1), (positions, 1), *((mask, 2) for mask in each_mask(masks))]:
        torch._dynamo.decorators.mark_unbacked(tensor, dim, min=1, max=widest, shape_id="width")


def graphs_built() -> int:
    """Graphs dynamo traced so far in this process: compiled, loaded from the disk cache, or compiled again where a
    guard failed (a graph holds for the thread count it was built at, among others). The compiled runtime
    tallies those its calls traced (specdec.runtime.compiled.CompiledForward.built)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]
