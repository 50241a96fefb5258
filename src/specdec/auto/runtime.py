"""Which runtime a model runs on, eager or compiled (specdec.runtime.compiled), decided once per run and model:
runtime=auto's reasons, the compile settings, a 1-token graph where the widest bucket costs more than a step, and the
drafters' models and heads."""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel

from ..draft.head_runtime import compile_head
from ..draft.switch import DraftSwitch
from ..markdown import cell, markdown_table
from ..runtime.compiled import (
    CAPACITY,
    WIDTHS,
    WINDOW,
    CompiledForward,
    check_settings,
    compile_model,
    compiled_forward,
)
from ..runtime.packed import PackedInt8Linear, row_cost
from ..runtime.probes import build_graphs, time_buckets
from ..runtime.study import weight_bytes
from .report import Report

EAGER, COMPILED, AUTO = "eager", "compiled", "auto"  # the runtimes (conf/runtime/)
NEVER, ALWAYS = "never", "always"  # step_graph's choices besides auto
BFLOAT16, MODEL = "bfloat16", "model"
DRAFT_CACHES = (BFLOAT16, MODEL)  # draft_cache's choices


@dataclass(frozen=True)
class RuntimeOptions:
    """How models run: name eager, compiled or auto (compiled where it pays, eager_reason), and the compiled
    runtime's settings (specdec.runtime.compiled.compile_model; conf/runtime/compiled.yaml says each)."""

    name: str = EAGER
    widths: tuple[int, ...] = WIDTHS  # compiled pass widths, tokens per row
    capacity: int = CAPACITY  # cache slots per row, preallocated
    autotune: bool = False
    packed_rows: tuple[int, int] | None = None  # [first, last] rows on the packed kernel; None: inductor's GEMMs
    cpp_wrapper: bool = False
    cuda_graphs: bool = True
    dynamic_width: bool = False
    invariant: bool | None = None  # attention in compiled passes as row-wise sums (with packed_rows: batch-invariant
    # passes); None: for bfloat16 and float16 models, where SDPA's rounding parts greedy outputs at near-ties
    step_graph: str = NEVER  # a 1-token graph next to widths: always, never or auto (add_step_graph)
    window: int = WINDOW
    drafts: bool = False  # draft models run compiled too (a packed int8 copy does whatever this says)
    heads: bool = True  # a trained draft head's forward runs compiled too
    draft_cache: str = BFLOAT16  # the dtype a compiled copy that reads the target's cache keeps it in: bfloat16
    # (where the attention kernel runs) or model (the copy's own dtype); see draft_cache_dtype
    fused: bool = True  # packed linears: q/k/v and gate/up each one call of the packed kernel (runtime.fused)
    direct: bool = True  # on a CPU, calls like ones seen before call their graph directly (runtime.direct)

    def __post_init__(self) -> None:
        """Settings the compiled runtime can take; a ValueError naming the field and the fix otherwise."""
        if not self.widths:
            raise ValueError("widths must be a non-empty list of pass widths >= 1, got []")
        if small := [w for w in self.widths if w < 1]:
            raise ValueError(f"widths must be an integer >= 1, got {small[0]!r}")
        check_settings(tuple(self.widths), self.capacity)
        rows = self.packed_rows
        if rows is not None and len(rows) != 2:
            raise ValueError(f"packed_rows must be null or [first, last] pass rows, got {list(rows)!r}")
        if rows is not None and not 1 <= rows[0] <= rows[1]:
            least, value = (1, rows[0]) if rows[0] < 1 else rows
            raise ValueError(f"packed_rows must be an integer >= {least}, got {value!r}")
        if self.draft_cache not in DRAFT_CACHES:
            raise ValueError(f"draft_cache must be one of {', '.join(DRAFT_CACHES)}, got {self.draft_cache!r}")

    def compile_settings(self) -> dict:
        """compile_model's keyword arguments."""
        settings = asdict(self)
        for key in ("name", "step_graph", "drafts", "heads", "draft_cache"):
            del settings[key]
        return settings


EAGER_RUNTIME = RuntimeOptions()  # models as loaded

AUTO_MIN_NEW_TOKENS = 32  # runtime=auto compiles for runs of at least this many new tokens per prompt
AUTO_MIN_WEIGHTS_MB = 64  # ... and targets of at least this many MB of weights (toy models run eager)


def eager_reason(device: str, max_new_tokens: int, model: PreTrainedModel | None = None) -> str | None:
    """Why runtime=auto runs eager for this run and model (None: it compiles). It compiles where the compiled
    runtime measured faster and its compile pays back: on a CPU with the packed kernel (AVX-512), whose compiled
    SmolLM2-135M step took 21-25 ms against 55-61 ms eager; for a model of at least AUTO_MIN_WEIGHTS_MB (a toy model's
    eager step takes a millisecond); and for outputs of at least AUTO_MIN_NEW_TOKENS tokens (a warm start loads the
    graph in 10-13 s; docs/performance.md)."""
    from ..runtime.packed import unavailable_reason  # at call time (tests answer for this CPU)

    if not str(device).startswith("cpu"):
        return f"runtime=auto compiles on a CPU only (device={device})"
    if kernel := unavailable_reason():
        return f"runtime=auto compiles where the packed kernel runs, and {kernel}"
    if not shutil.which(os.environ.get("CXX", "c++")):
        return "runtime=auto compiles with a C++ compiler, and none is on PATH (CXX or c++)"
    if max_new_tokens < AUTO_MIN_NEW_TOKENS:
        return f"max_new_tokens={max_new_tokens} is too few to pay a compile (runtime=auto: >= {AUTO_MIN_NEW_TOKENS})"
    if model is not None and (mb := weight_bytes(model) / 2**20) < AUTO_MIN_WEIGHTS_MB:
        return f"{mb:.1f} MB of weights is too small to pay a compile (runtime=auto: >= {AUTO_MIN_WEIGHTS_MB})"
    return None


def compiles(runtime: RuntimeOptions, device: str, max_new_tokens: int, model: PreTrainedModel | None = None,
             report: Report | None = None) -> bool:
    """Whether models go on the compiled runtime: runtime=compiled, or runtime=auto where eager_reason finds no
    reason against (said in the report for a model)."""
    if runtime.name != AUTO:
        return runtime.name == COMPILED
    reason = eager_reason(device, max_new_tokens, model)
    if model is not None:
        (report or Report()).say("runtime=auto: %s", f"eager, as {reason}" if reason else "compiled (specdec.runtime.compiled)")
    return reason is None


def put_on_runtime(model: PreTrainedModel | None, runtime: RuntimeOptions, *, device: str, max_new_tokens: int,
                   draft: bool = False, steps: bool = False, report: Report | None = None) -> None:
    """Put a loaded model on the run's runtime: compiled (specdec.runtime.compiled), or eager as loaded (a model
    already on it stays as it is). draft: a draft model, compiled only with runtime.drafts or on the packed int8
    kernel. steps: the model runs one-token steps only (a copy that reads the target's cache): one static graph of
    width 1, quicker to compile. The graphs are built and their buckets timed now, not in a timed pass."""
    if model is None or (draft and not (runtime.drafts or has_int8_kernel(model))) or compiled_forward(model):
        return
    if not compiles(runtime, device, max_new_tokens, model, report):
        return
    settings = {**runtime.compile_settings(), **({"widths": (1,), "dynamic_width": False} if steps else {})}
    if draft and runtime.invariant is None:  # batch invariance is the target's: a draft's numerics never change outputs
        settings["invariant"] = False
    if draft and steps:
        settings["cache_dtype"] = draft_cache_dtype(model, runtime.draft_cache)
    add_step_graph(runtime.step_graph, compile_model(model, **settings), model, report)
    build_graphs(model)  # now, not in a timed pass
    time_buckets(model)  # a pass pads to its cheapest bucket, as measured here


def draft_cache_dtype(model: PreTrainedModel, choice: str) -> torch.dtype | None:
    """The dtype a compiled copy that reads the target's cache keeps its states in (None: the copy's own).
    bfloat16 for a float32 copy, which compile_model keeps where its attention kernel runs (specdec.runtime.attention,
    a CPU with AVX-512) and drops elsewhere: the copy's step reads the whole cache, and after long contexts the cache
    is a large part of its bytes (after 2048 tokens SmolLM2-135M's float32 cache holds 94 MB, its packed int8 copy's
    linears 134 MB); in bfloat16 half of it. The draft is then
    "the copy, reading the target's states rounded to bfloat16": only a proposal, so exactness holds. After 1,993
    tokens a step of that copy took 11.3 ms against 12.7 on a 2-core AMD EPYC, its drafts accepted as often
    (docs/performance.md, The int8 draft)."""
    return torch.bfloat16 if choice == BFLOAT16 and model.dtype == torch.float32 else None


def has_int8_kernel(model: PreTrainedModel) -> bool:
    """Whether a model's linears run on the packed int8 kernel (quantization=packed_int8): such a draft runs
    compiled whatever runtime.drafts says, as its compiled step took 10.7-11.2 ms against 17.5 ms eager on a 2-core
    Xeon (docs/performance.md)."""
    return any(isinstance(module, PackedInt8Linear) for module in model.modules())


STEP_GAIN = 1.15  # step_graph=auto adds a 1-token graph where a pass of the widest bucket costs this many steps or more


def add_step_graph(mode: str, compiled: CompiledForward, model: PreTrainedModel, report: Report | None = None
                   ) -> None:
    """step_graph: a 1-token graph next to the profile's widths, so that a target step is not padded to a wide
    bucket. always: whenever the widths lack one; never: the widths as given; auto: where the packed kernel's pass
    of the widest bucket's rows measured at least STEP_GAIN times its one-row pass here (one reported line either
    way). The packed kernel keeps 8 rows at one row's cost on a 2-core "AMD EPYC" (docs/performance.md), but not on
    every CPU: on a 2-core Xeon an 8-row pass cost 1.47 steps, and `make run`'s target-only ran 1.5x faster with the
    1-token graph. With dynamic_width one graph takes every width already: nothing to add."""
    if mode == NEVER or compiled.eager or compiled.dynamic_width or 1 in compiled.widths:
        return
    if mode != ALWAYS:
        report = report or Report()
        widest = max(compiled.widths)
        cost = row_cost(model, widest)
        if cost is None or cost < STEP_GAIN:
            report.say("runtime.step_graph=auto: no 1-token graph (%s)", "no packed linears" if cost is None else
                       f"the packed kernel's {widest}-row pass costs {cost:.2f} of its 1-row pass here")
            return
        report.say("runtime.step_graph=auto: a 1-token graph too, as the packed kernel's %d-row pass costs %.2f of "
                   "its 1-row pass here", widest, cost)
    compiled.widths = (1, *compiled.widths)


def put_drafter_on_runtime(drafter: object, runtime: RuntimeOptions, *, device: str, max_new_tokens: int,
                           report: Report | None = None) -> None:
    """A drafter's model on the run's runtime (put_on_runtime), and a trained head's forward
    (specdec.draft.head_runtime) on the compiled runtime with runtime.heads (its linears packed and its calls in C++
    as the options say for models), its graphs built now."""
    put_on_runtime(getattr(drafter, "model", None), runtime, device=device, max_new_tokens=max_new_tokens, draft=True,
                   steps=getattr(drafter, "reads_target_cache", False), report=report)
    head = getattr(drafter, "head", None)
    if head is None or not runtime.heads or not compiles(runtime, device, max_new_tokens):
        return
    compile_head(head, capacity=runtime.capacity, autotune=runtime.autotune, packed_rows=runtime.packed_rows,
                 cpp_wrapper=runtime.cpp_wrapper).build()


def compiled_runtimes(target: PreTrainedModel, drafter: object) -> dict[str, CompiledForward]:
    """The compiled runtimes of the target and of the drafter's models (every candidate of a DraftSwitch), by role."""
    members = drafter.candidates if isinstance(drafter, DraftSwitch) else {"": drafter}  # not getattr: a
    # string-level drafter's `candidates` is a method
    models = {"target": target} | {f"draft {name}".strip(): d.model for name, d in members.items()
                                    if getattr(d, "model", None) is not None}
    return {role: runtime for role, model in models.items() if (runtime := compiled_forward(model)) is not None}


def cuda_graphs(runtime: CompiledForward) -> dict | None:
    """On a GPU: how many passes were recorded as CUDA graphs and replayed (specdec.runtime.graphs); else None."""
    graphs = runtime.graphs
    return graphs and {"recorded": graphs.recorded, "replayed": graphs.replayed, "failed": graphs.failed}


def runtimes_markdown(runtimes: dict[str, CompiledForward]) -> str:
    """Per model (compiled_runtimes), its graphs' compile seconds, whether inductor's disk cache held them, or why the
    model runs eager, and the ms of a pass in each width bucket as timed at load (a pass pads to the cheapest). A
    graph for every width up to the widest (dynamic_width) shows as rows x 1-widest."""
    rows = []
    for role, runtime in runtimes.items():
        r = runtime.record
        cache = ("warm" if r.warm else f"{r.cache_hits} loaded, {r.cache_misses} compiled, {r.cache_bypassed} "
                 "compiled and refused by the disk cache")
        shapes = ", ".join(f"{rows}x{'1-' * runtime.dynamic_width}{width}" for rows, width in r.seconds)
        timed = ", ".join(f"{w}: {ms:.1f}" for w, ms in runtime.pass_ms.items()) or "-"
        rows.append([role, r.eager_reason and f"eager ({r.eager_reason})" or "compiled", shapes or "-",
                     cell(r.total_seconds, "{:.1f}"), "-" if r.eager_reason else cache, timed])
    header = ["model", "runs", "graphs (rows x width)", "compile s", "inductor disk cache", "pass ms by bucket"]
    notes = "".join(f"\n{role}: CUDA graphs, {g['recorded']} passes recorded, {g['replayed']} replayed"
                    + (f" (recording stopped: {g['failed']})" if g["failed"] else "") + "\n"
                    for role, runtime in runtimes.items() if (g := cuda_graphs(runtime)))
    return f"Runtime: compiled (specdec.runtime.compiled).\n\n{markdown_table(header, rows)}\n{notes}"


def runtimes_json(runtimes: dict[str, CompiledForward]) -> dict[str, dict]:
    """compiled_runtimes as plain data: each model's compile record, buckets and timed passes."""
    return {role: {**asdict(r.record), "seconds": {f"{b}x{w}": s for (b, w), s in r.record.seconds.items()},
                   "total_seconds": r.record.total_seconds, "warm": r.record.warm, "widths": list(r.widths),
                   "dynamic_width": r.dynamic_width, "pass_ms": r.pass_ms, "cuda_graphs": cuda_graphs(r)}
            for role, r in runtimes.items()}
