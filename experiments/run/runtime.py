"""The runtime group (conf/runtime/): its values checked before anything loads, and loaded models put on it."""

from __future__ import annotations

import logging
import os
import shutil

import torch
from omegaconf import DictConfig
from transformers import PreTrainedModel

from specdec.draft.head_runtime import compile_head
from specdec.runtime.compiled import (
    WINDOW,
    CompiledForward,
    compile_model,
    compiled_forward,
)
from specdec.runtime.packed import PackedInt8Linear, row_cost
from specdec.runtime.probes import ThreadChoice, build_graphs, choose_threads, time_buckets

from .schema import AUTO
from .settings import Plan, packed_rows

log = logging.getLogger(__name__)


def compile_settings(runtime: DictConfig) -> dict:
    """compile_model's settings from a runtime node (conf/runtime/compiled.yaml; a bench profile may leave the later
    ones out)."""
    return {"widths": tuple(runtime.widths), "capacity": runtime.capacity, "autotune": runtime.autotune,
            "packed_rows": packed_rows(runtime), "cpp_wrapper": runtime.get("cpp_wrapper", False),
            "window": runtime.get("window", WINDOW), "cuda_graphs": runtime.get("cuda_graphs", True),
            "dynamic_width": runtime.get("dynamic_width", False)}


AUTO_MIN_NEW_TOKENS = 32  # runtime=auto compiles for runs of at least this many new tokens per prompt
AUTO_MIN_WEIGHTS_MB = 64  # ... and targets of at least this many MB of weights (toy models run eager)


def auto_eager_reason(cfg: DictConfig, model: PreTrainedModel | None = None) -> str | None:
    """Why runtime=auto runs eager for this run and model (None: it compiles). It compiles where the compiled
    runtime measured faster and its compile pays back: on a CPU with the packed kernel (AVX-512), whose compiled
    SmolLM2-135M step took 21-25 ms against 55-61 ms eager; for a model of at least AUTO_MIN_WEIGHTS_MB (a toy model's
    eager step takes a millisecond); and for outputs of at least AUTO_MIN_NEW_TOKENS tokens (a warm start loads the
    graph in 10-13 s; docs/performance.md)."""
    from specdec.runtime.packed import unavailable_reason  # at call time (tests answer for this CPU)

    if not str(cfg.device).startswith("cpu"):
        return f"runtime=auto compiles on a CPU only (device={cfg.device})"
    if kernel := unavailable_reason():
        return f"runtime=auto compiles where the packed kernel runs, and {kernel}"
    if not shutil.which(os.environ.get("CXX", "c++")):
        return "runtime=auto compiles with a C++ compiler, and none is on PATH (CXX or c++)"
    if cfg.max_new_tokens < AUTO_MIN_NEW_TOKENS:
        return f"max_new_tokens={cfg.max_new_tokens} is too few to pay a compile (runtime=auto: >= {AUTO_MIN_NEW_TOKENS})"
    if model is not None and (mb := weight_bytes(model) / 2**20) < AUTO_MIN_WEIGHTS_MB:
        return f"{mb:.1f} MB of weights is too small to pay a compile (runtime=auto: >= {AUTO_MIN_WEIGHTS_MB})"
    return None


def weight_bytes(model: PreTrainedModel) -> int:
    """Bytes of the parameters one forward reads (a tied output layer counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def compiles(cfg: DictConfig, model: PreTrainedModel | None = None) -> bool:
    """Whether the run's models go on the compiled runtime: runtime=compiled, or runtime=auto where
    auto_eager_reason finds no reason against (said once in the log)."""
    if cfg.runtime.name != AUTO:
        return cfg.runtime.name == "compiled"
    reason = auto_eager_reason(cfg, model)
    if model is not None:
        log.info("runtime=auto: %s", f"eager, as {reason}" if reason else "compiled (specdec.runtime.compiled)")
    return reason is None


def on_runtime(cfg: DictConfig, model: PreTrainedModel | None, draft: bool = False, steps: bool = False) -> None:
    """Put a loaded model on the run's runtime: compiled (specdec.runtime.compiled), or eager as loaded (a model
    already on it stays as it is). Its settings were checked with the config (check_runtime). steps: the model runs
    one-token steps only (a copy that reads the target's cache): one static graph of width 1, quicker to compile."""
    runtime = cfg.runtime
    if model is None or (draft and not (runtime.drafts or has_int8_kernel(model))) or compiled_forward(model):
        return
    if not compiles(cfg, model):
        return
    settings = {**compile_settings(runtime), **({"widths": (1,), "dynamic_width": False} if steps else {})}
    add_step_graph(runtime.get("step_graph", NEVER), compile_model(model, **settings), model)
    build_graphs(model)  # now, not in a timed pass
    time_buckets(model)  # a pass pads to its cheapest bucket, as measured here


def has_int8_kernel(model: PreTrainedModel) -> bool:
    """Whether a model's linears run on the packed int8 kernel (quantization=packed_int8): such a draft runs
    compiled whatever runtime.drafts says, as its compiled step took 10.7-11.2 ms against 17.5 ms eager on a 2-core
    Xeon (docs/performance.md)."""
    return any(isinstance(module, PackedInt8Linear) for module in model.modules())


STEP_GAIN = 1.15  # step_graph=auto adds a 1-token graph where a pass of the widest bucket costs this many steps or more
NEVER, ALWAYS = "never", "always"


def add_step_graph(mode: str, compiled: CompiledForward, model: PreTrainedModel) -> None:
    """runtime.step_graph: a 1-token graph next to the profile's widths, so that a target step is not padded to a wide
    bucket. always: whenever the widths lack one; never: the widths as given; auto: where the packed kernel's pass
    of the widest bucket's rows measured at least STEP_GAIN times its one-row pass here (one logged line either
    way). The packed kernel keeps 8 rows at one row's cost on a 2-core "AMD EPYC" (docs/performance.md), but not on
    every CPU: on a 2-core Xeon an 8-row pass cost 1.47 steps, and `make run`'s target-only ran 1.5x faster with the
    1-token graph. With dynamic_width one graph takes every width already: nothing to add."""
    if mode == NEVER or compiled.eager or compiled.dynamic_width or 1 in compiled.widths:
        return
    if mode != ALWAYS:
        widest = max(compiled.widths)
        cost = row_cost(model, widest)
        if cost is None or cost < STEP_GAIN:
            log.info("runtime.step_graph=auto: no 1-token graph (%s)", "no packed linears" if cost is None else
                     f"the packed kernel's {widest}-row pass costs {cost:.2f} of its 1-row pass here")
            return
        log.info("runtime.step_graph=auto: a 1-token graph too, as the packed kernel's %d-row pass costs %.2f of its "
                 "1-row pass here", widest, cost)
    compiled.widths = (1, *compiled.widths)


def drafter_on_runtime(cfg: DictConfig, drafter) -> None:
    """A drafter's model on the run's runtime (on_runtime), and a trained head's forward (specdec.draft.head_runtime)
    on the compiled runtime with runtime.heads (its linears packed and its calls in C++ as the runtime says for
    models), its graphs built now."""
    on_runtime(cfg, getattr(drafter, "model", None), draft=True, steps=getattr(drafter, "reads_target_cache", False))
    head, runtime = getattr(drafter, "head", None), cfg.runtime
    if head is None or not runtime.heads or not compiles(cfg):
        return
    settings = compile_settings(runtime)
    compile_head(head, capacity=runtime.capacity, autotune=runtime.autotune, packed_rows=settings["packed_rows"],
                 cpp_wrapper=settings["cpp_wrapper"]).build()


def choose_threads_for(plan: Plan, target: PreTrainedModel, ids: torch.Tensor | None) -> ThreadChoice | None:
    """threads=auto on the CPU: 1, 2, 4, ... up to the core count, whichever is fastest here and now (one target
    step, one verification pass of width k + 1 (5 for k=auto) and one prompt pass over `ids`), set for the run;
    None otherwise. Call it before the target compiles: dynamo guards a compiled graph on the thread count it was
    built at, and compiles it again (12-25 s) at any other."""
    if plan.threads != AUTO or not plan.device.startswith("cpu"):
        return None
    cores = os.cpu_count() or 1
    counts = [2**i for i in range(cores.bit_length()) if 2**i <= cores]
    choice = choose_threads(target, ids, counts, width=5 if plan.k == AUTO else plan.k + 1)
    torch.set_num_threads(choice.threads)
    return choice
