"""What a target pass costs on this machine: against its width and context, against one read of the weights (the
memory bound), eager and compiled; and the clock inside each model's forward during a whole generation. The
measurements behind `python -m experiments.bench` (its costs) and `bench=runtime` (the runtime study); the
interleaved timings go through specdec.runtime.timing's one loop."""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from .cached import CachedLM
from .compiled import CompiledForward, compile_model, compiled_forward
from .models import DTYPES
from .probes import forward_ms, pass_tokens, timed_step
from .timing import interleaved_samples


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters one forward reads (a tied output layer counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def memory_bound_ms(model: torch.nn.Module, repeats: int = 5) -> tuple[float, float]:
    """(ms to read the model's weights once, GB/s): the fastest of `repeats` sums over a tensor of their size."""
    nbytes = weight_bytes(model)
    big = torch.ones(nbytes // 4)
    best = min(interleaved_samples({"read": big.sum}, repeats, warmup=0)["read"])
    return 1000 * best, nbytes / best / 1e9


@torch.inference_mode()
def pass_ms(model: PreTrainedModel, prefix: torch.Tensor, widths: list[int], repeats: int) -> tuple[dict[int, float],
                                                                                                   float]:
    """(median ms of one cached forward of w tokens after prefix (1, L), each width; the fastest read of the
    weights, memory_bound_ms's sum), timed in the same rounds: each round reads the weights once and runs one pass of
    each width, so that the drift of a shared CPU falls on every width and on the bound alike. Round 0 is dropped."""
    lm = CachedLM(model)
    lm.forward(prefix, last_only=True)
    big = torch.ones(weight_bytes(model) // 4)
    steps = {w: timed_step(lm, pass_tokens(prefix, w)) for w in widths}
    jobs = {"read": big.sum, **{w: run for w, (run, _) in steps.items()}}
    undo = {w: crop for w, (_, crop) in steps.items()}
    samples = interleaved_samples(jobs, repeats, device=prefix.device, after=undo)
    reads = samples.pop("read")
    return {w: 1000 * statistics.median(s) for w, s in samples.items()}, 1000 * min(reads)


def pass_widths(k: int, max_width: int) -> list[int]:
    """Widths of the pass-cost curve: 1..max_width, and the chain passes k + 1 and 2k + 1."""
    return sorted(set(range(1, max_width + 1)) | {k + 1, 2 * k + 1})


def pass_costs(
    target: PreTrainedModel, draft: PreTrainedModel | None, prefix: torch.Tensor, k: int, max_width: int = 17
) -> dict:
    """Measured costs: c = draft step / target step, and one target pass's time vs its width.

    A pass of width w scores w new tokens after the prefix (causal mask): width 1 is a plain step,
    k + 1 a chain's verification, nodes + 1 a tree's (whose 4D mask is not part of this curve).
    """
    ms = {w: forward_ms(target, prefix, w) for w in pass_widths(k, max_width)}
    target_ms = ms[1]
    # a draft with another vocabulary cannot read the target's ids: time its step on ids it has (the time of a
    # forward does not depend on which ids)
    draft_prefix = prefix % draft.get_input_embeddings().num_embeddings if draft is not None else None
    draft_ms = forward_ms(draft, draft_prefix, 1) if draft is not None else float("nan")
    return {
        "context_tokens": prefix.shape[-1],
        "target_step_ms": target_ms,
        "draft_step_ms": draft_ms,
        "c": draft_ms / target_ms,
        "target_verify_ms_by_k": {n - 1: ms[n] for n in sorted({2, k + 1, 2 * k + 1})},
        "pass_ms_by_width": ms,
        "pass_cost_by_width": {w: t / target_ms for w, t in ms.items()},  # in target steps
    }


def compile_seconds(model: PreTrainedModel, prefix: torch.Tensor, **settings) -> dict:
    """Compile the model's buckets (compile_model's settings) twice: into an empty disk cache (cold), then from it
    (warm)."""
    out = {}
    for state in ("cold", "warm"):
        torch._dynamo.reset()
        runtime = compile_model(model, **settings)
        lm = CachedLM(model)
        lm.forward(prefix)
        for w in runtime.widths:
            lm.forward(prefix[:, :w])
            lm.crop(prefix.shape[-1])
        record = runtime.record
        out[state] = {"seconds": record.total_seconds, "hits": record.cache_hits, "misses": record.cache_misses,
                      "bypassed": record.cache_bypassed, "eager_reason": record.eager_reason}
        if record.cache_bypassed or record.eager_reason:
            break  # nothing on disk to be warm from: a later process compiles again
    return out


def last_logits(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """Logits (1, 4, V) of ids' last 4 tokens, ids (1, L) fed as a prefix and then those tokens one pass at a time
    (widths 1, 2 and 1)."""
    lm = CachedLM(model)
    lm.forward(ids[:, :-4])
    return torch.cat([lm.forward(ids[:, -4:-3]), lm.forward(ids[:, -3:-1]), lm.forward(ids[:, -1:])], dim=1)


def largest_logit_difference(model: PreTrainedModel, prompts: list[torch.Tensor], eager: list[torch.Tensor]) -> float:
    """Largest |model's - eager| logit over the prompts' last positions (last_logits of each prompt)."""
    return max((float((last_logits(model, ids) - reference).abs().max()) for ids, reference in zip(prompts, eager)),
               default=0.0)


def weights_in(model: PreTrainedModel, dtype: str) -> PreTrainedModel:
    """The model itself if its weights are in `dtype`, else a copy in it (a float32 target read as bfloat16: half
    the bytes of a step)."""
    if dtype not in DTYPES:
        raise ValueError(f"runtime profile dtype {dtype!r}: choose one of {sorted(DTYPES)}")
    return model if model.dtype == DTYPES[dtype] else copy.deepcopy(model).to(DTYPES[dtype]).eval()


class ForwardClock:
    """Seconds and calls inside each model's forward, by hooks: what the models cost, for ours and HF's alike.

    Wall time minus this is the loop's own overhead (sampling, acceptance, cache bookkeeping, Python).
    A model on the compiled runtime runs its passes through CompiledForward, which calls the model's forward
    without its hooks (a hook traced into a graph would stop it compiling): those calls are timed there instead.
    """

    def __init__(self, models: dict[str, torch.nn.Module | None]):
        models = {name: m for name, m in models.items() if m is not None}
        self.seconds = dict.fromkeys(models, 0.0)
        self.calls = dict.fromkeys(models, 0)
        self.handles = []
        self.wrapped: list[tuple[CompiledForward, str, bool, Callable]] = []  # runtime, attribute, own, original
        for name, model in models.items():
            self.handles.append(model.register_forward_pre_hook(lambda *_: self._start()))
            self.handles.append(model.register_forward_hook(lambda *_, n=name: self._stop(n)))
            runtime = compiled_forward(model)
            if runtime is not None:
                self.time_runtime(name, runtime)

    def time_runtime(self, name: str, runtime: CompiledForward) -> None:
        """Time the runtime's compiled passes and its eager ones (passes wider than every bucket) as the model's."""
        for attr in ("compiled", "run"):
            inner = getattr(runtime, attr)

            def timed(*args, inner=inner):
                self._start()
                out = inner(*args)
                self._stop(name)
                return out

            self.wrapped.append((runtime, attr, attr in vars(runtime), inner))
            setattr(runtime, attr, timed)

    def _start(self) -> None:
        self.started = time.perf_counter()

    def _stop(self, name: str) -> None:
        self.seconds[name] += time.perf_counter() - self.started
        self.calls[name] += 1

    def reset(self) -> None:
        """Start the counts again from zero."""
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.calls = dict.fromkeys(self.calls, 0)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for runtime, attr, own, inner in reversed(self.wrapped):
            if own:
                setattr(runtime, attr, inner)
            else:
                delattr(runtime, attr)
        self.wrapped = []
