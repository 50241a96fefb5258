"""A draft copy's c predicted from its linears, before the copy is built: the calibration builds only a copy that
could win.

A copy of the target (quantized, or in bfloat16) runs the target's step with other linears. Write one step's time
as T = O + M: M the time in the linears, O everything else (attention over the cache, norms, the calls between).
The copy does the target's other work on its own runtime (eager, unless it compiles: the packed int8 copy, or
runtime.drafts), and its linears cost R times the target's, R measured here. So, before it exists,

    c = T_copy / T_target = (O_copy + R M) / T_target

with T_target the target's step as it runs, M its linears timed one after another, O_copy its step on the copy's
runtime less M (never below 0). The calibration (specdec.auto.calibration.calibrate_in_turn) takes MARGIN times that
c, a lower figure than predicted, in Thm 3.8 at alpha = 1, and builds the copy only where even that could beat the
best candidate so far: a copy that cannot win is never loaded whole (a bfloat16 copy of a 135M target is 0.27 GB;
of a 7B one, 14 GB). One that could is built and measured as before.

R is measured as the copy would run: each group of like linears (every layer's q_proj, every layer's MLP up
projection, the output layer) is copied with the copy's kind of layer (specdec.runtime.copies.linear_copy), all
members of the group, each by blocks of its outputs (never a whole float32 output layer laid out of its panels at
once), so that a sweep over them reads their weights from memory as a step does (one linear timed again and again
would run from the cache); the sweeps of the target's own linears and of the copies are interleaved on one token's
input, the group is dropped, the next is built. Memory: one group's copies at a time. The layers a copy leaves as
they are (a bitsandbytes copy's output layer) count the target's time on both sides.
"""

from __future__ import annotations

import logging
import re
import statistics
from collections.abc import Callable, Iterator

import torch
from transformers import PreTrainedModel

from ..runtime.cached import CachedLM
from ..runtime.copies import COPIES, kept_in_float, linear_copy
from ..runtime.machine import trim_heap
from ..runtime.models import DTYPES
from ..runtime.packed import PackedLinear, weight_blocks
from ..runtime.probes import timed_step
from ..runtime.timing import interleaved_samples

log = logging.getLogger(__name__)
MARGIN = 0.8  # the c a copy is ruled out at: this times the predicted one (timing noise, a model of the step)


def linear_groups(model: PreTrainedModel) -> dict[str, list[tuple[str, torch.nn.Module]]]:
    """The model's linears (plain or packed) by role: names with their layer index replaced by '*'."""
    groups: dict[str, list[tuple[str, torch.nn.Module]]] = {}
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, PackedLinear)):
            groups.setdefault(re.sub(r"\.\d+\.", ".*.", name), []).append((name, module))
    return groups


def row_blocks(linear: torch.nn.Module) -> Iterator[torch.nn.Linear]:
    """The linear as nn.Linears of a block of its outputs each (weight_blocks: never its whole float32 weight at once,
    a packed output layer's 0.11 GB for SmolLM2)."""
    first = 0
    for weight in weight_blocks(linear):
        block = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None, device="meta")
        block.weight = torch.nn.Parameter(weight.contiguous(), requires_grad=False)  # as a layer copy_of reads
        if linear.bias is not None:
            block.bias = torch.nn.Parameter(linear.bias.detach()[first : first + weight.shape[0]], requires_grad=False)
        first += weight.shape[0]
        yield block


def group_copies(members: list[tuple[str, torch.nn.Module]], quantization: str, dtype: torch.dtype,
                 compute_dtype: torch.dtype, fused_4bit: bool) -> list[torch.nn.Module]:  # fmt: skip
    """Each member's copy in the copy's kind of layer (linear_copy, as copy_of makes a copy's layers; a dynamic int8
    block carries its own scale), by blocks of outputs (row_blocks: a sweep over them does the layer's work), a
    bitsandbytes 4-bit one on the unfused path where asked."""
    copies = [linear_copy(block, quantization, compute_dtype, lambda t: t.detach().to(dtype)).eval()
              for _, module in members for block in row_blocks(module)]  # fmt: skip  # eval: as a copy runs
    if not fused_4bit:
        for layer in copies:
            if hasattr(layer, "support_avx512bf16_for_cpu"):
                layer.support_avx512bf16_for_cpu = False  # before its first forward (models.force_unfused_4bit)
    return copies


def sweep(layers: list[torch.nn.Module], x: torch.Tensor) -> Callable[[], None]:
    """One call of every layer on x: one step's work in that group of linears."""

    def run() -> None:
        for layer in layers:
            layer(x)

    return run


@torch.inference_mode()
def linear_ratio(target: PreTrainedModel, quantization: str = "none", dtype: str = "float32",
                 compute_dtype: str | None = None, fused_4bit: bool = True, repeats: int = 3) -> float:  # fmt: skip
    """R: the time of one token through all of a copy's linears over the target's own (median sweeps per group,
    summed over the groups). The layers a copy leaves as they are (a bitsandbytes copy's output layer) count the
    target's time on both sides."""
    copy_dtype = torch.float32 if quantization != "none" else DTYPES[dtype]
    kept = kept_in_float(target, quantization)
    totals = {"target": 0.0, "copy": 0.0}
    for members in linear_groups(target).values():
        source = [module for _, module in members]
        x = torch.randn(1, 1, source[0].in_features, generator=torch.Generator().manual_seed(0))
        jobs = {"target": sweep(source, x)}
        if not {name for name, _ in members} & kept:
            copies = group_copies(members, quantization, copy_dtype, DTYPES[compute_dtype or dtype], fused_4bit)
            jobs["copy"] = sweep(copies, x.to(copy_dtype))
        samples = interleaved_samples(jobs, repeats, warmup=1)
        ms = {key: statistics.median(values) for key, values in samples.items()}
        totals["target"] += ms["target"]
        totals["copy"] += ms.get("copy", ms["target"])
        jobs.clear()  # the group's copies go before the next group's are made, their pages back to the system
        trim_heap()
    return totals["copy"] / totals["target"]


@torch.inference_mode()
def step_parts(target: PreTrainedModel, prefix: torch.Tensor, eager_copy: bool, repeats: int = 3
               ) -> tuple[float, float, float]:  # fmt: skip
    """(T, O, M) in seconds after prefix (1, L), interleaved: the target's step as it runs, the rest of a step on the
    copy's runtime (eager_copy: the eager one) less the linears, and the target's linears one after another."""
    lms = {"step": CachedLM(target), "other": CachedLM(target, eager=eager_copy)}
    jobs, undo = {}, {}
    for key, lm in lms.items():
        lm.forward(prefix, last_only=True)
        jobs[key], undo[key] = timed_step(lm, prefix[:, -1:])
    groups = [[module for _, module in members] for members in linear_groups(target).values()]
    inputs = [torch.randn(1, 1, layers[0].in_features, dtype=target.dtype) for layers in groups]
    jobs["linears"] = lambda: [sweep(layers, x)() for layers, x in zip(groups, inputs)]
    samples = interleaved_samples(jobs, repeats, warmup=1, after=undo)
    step, other, linears = (statistics.median(samples[key]) for key in ("step", "other", "linears"))
    return step, max(0.0, other - linears), linears


def predicted_c(target: PreTrainedModel, prefix: torch.Tensor, quantization: str = "none", dtype: str = "float32",
                compute_dtype: str | None = None, fused_4bit: bool = True, eager_copy: bool = True,
                repeats: int = 3) -> tuple[float, float]:  # fmt: skip
    """(c, R): the copy's c = (O + R M) / T (step_parts), before it is built, and R (linear_ratio)."""
    trim_heap()  # what the calibration freed so far, out of the memory the copies' layers are made in
    step, other, linears = step_parts(target, prefix, eager_copy, repeats)
    ratio = linear_ratio(target, quantization, dtype, compute_dtype, fused_4bit, repeats)
    return (other + ratio * linears) / step, ratio


def predictable(target: PreTrainedModel, quantization: str = "none", dtype: str = "float32") -> bool:
    """Whether linear_ratio can measure this copy's linears: a float32 target on the CPU, and a form copy_of makes
    from it."""
    cpu = all(p.device.type == "cpu" for p in target.parameters())
    another = quantization != "none" or dtype != "float32"
    return target.dtype == torch.float32 and cpu and quantization in COPIES and another


def cost_bound(target: PreTrainedModel, eager_copy: bool = True, **form: object
               ) -> Callable[[torch.Tensor], tuple[float, float] | None] | None:  # fmt: skip
    """A function of a prefix giving (MARGIN times the predicted c, R) of the copy that load_model's keywords `form`
    (quantization, dtype, compute_dtype, fused_4bit) make of `target`, on an eager runtime or not, or None where the
    prediction fails (a kernel that does not take a layer); None where linear_ratio cannot measure it."""
    quantization = str(form.get("quantization") or "none")
    dtype = "float32" if quantization in ("dynamic_int8", "packed_int8") else str(form.get("dtype") or "float32")
    if not predictable(target, quantization, dtype):
        return None

    def bound(prefix: torch.Tensor) -> tuple[float, float] | None:
        try:
            c, ratio = predicted_c(target, prefix, quantization, dtype, form.get("compute_dtype"),
                                   bool(form.get("fused_4bit", True)), eager_copy)  # fmt: skip
        except Exception as error:  # noqa: BLE001 (a kernel that does not take a layer: the copy is built instead)
            log.info("%s copy: no prediction of its c (%s); built and measured", quantization, error)
            return None
        return MARGIN * c, ratio

    return bound
