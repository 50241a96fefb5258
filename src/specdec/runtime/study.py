"""What a target pass costs on this machine: against its width and context, against one read of the weights (the
memory bound), eager and compiled (the runtime study); the clock inside each model's forward during a whole
generation; and the benchmark's loops: generation loops clocked in an interleaved order and their throughput, time
per token against output and prompt length (the scaling study), throughput against batch size (the batch study),
and each input generated once (a load run, and its share of plain steps). The measurements behind
`python -m experiments.bench`; the interleaved timings go through specdec.runtime.timing's one loop. A loop is
a callable the caller builds (any method, ours or Hugging Face's): this module measures, the caller decides what
runs.

The runtime study, for each runtime profile on the target, in one process, so that every ratio compares timings of
one machine and load:
- the compile: seconds of each width's first call with an empty disk cache (cold), then again after dynamo's
  in-memory state is dropped (warm: what a later process pays, loading from the disk cache);
- the pass cost: ms of one cached forward of w tokens after the prompt, for w = 1..max_width, over the one-token
  step (widths above the largest bucket run eager on the slot cache);
- the step against the memory bound: the ms to read the weights once, a `sum` over as many bytes, timed in the same
  rounds as the passes (each round one read and one pass of each width);
- the compiled logits against the eager ones on every prompt (largest absolute difference);
- end to end, greedy: the given loops (the caller's target-only loop and prompt lookup), tokens per second, outputs
  checked against the first loop's eager outputs of the same weights, next to Hugging Face's plain generate."""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from transformers import PreTrainedModel

from .cached import CachedLM
from .compiled import CompiledForward, compile_model, compiled_forward, eager_model
from .models import DTYPES
from .probes import forward_ms, forwards_ms, pass_tokens, timed_step
from .timing import interleaved_samples, stopwatch


def weight_bytes(*models: torch.nn.Module) -> int:
    """Bytes of the weights the models hold: parameters and buffers (a packed layer's panels), each storage counted
    once (a tied output layer, a copy's embedding shared with its target)."""
    held = {(t.device, t.untyped_storage().data_ptr()): t.untyped_storage().nbytes()
            for model in models for t in [*model.parameters(), *model.buffers()] if t.device.type != "meta"}
    return sum(held.values())


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


Loop = Callable[[PreTrainedModel, torch.Tensor], torch.Tensor]  # (model, prompt ids (1, L)) -> new tokens (n,)


@dataclass
class RuntimeProfile:
    """One runtime of the study: its settings as configured (recorded), the dtype of the weights it runs (None: the
    model's; another: a copy in it) and compile_model's keywords (None: eager)."""

    settings: dict = field(default_factory=dict)
    dtype: str | None = None
    compile: dict | None = None


def tokens_per_second(generate: Callable[[torch.Tensor], torch.Tensor], prompts: list[torch.Tensor]
                      ) -> tuple[float, list[torch.Tensor]]:
    """Generated tokens over seconds, summed over the prompts; the outputs."""
    outputs, seconds = [], 0.0
    for ids in prompts:
        start = time.perf_counter()
        outputs.append(generate(ids))
        seconds += time.perf_counter() - start
    return sum(o.numel() for o in outputs) / seconds, outputs


def end_to_end(model: PreTrainedModel, prompts: list[torch.Tensor], loops: Mapping[str, Loop]
               ) -> tuple[dict[str, float], dict[str, list[torch.Tensor]]]:
    """Tokens/s of each loop over the prompts (after a warm-up on a short prefix), and their outputs."""
    rates, outputs = {}, {}
    for loop in loops.values():  # warm-up
        loop(model, prompts[0][:, :8])
    for name, loop in loops.items():
        rates[f"{name}_tokens_per_s"], outputs[name] = tokens_per_second(lambda ids, f=loop: f(model, ids), prompts)
    return rates, outputs


def hf_plain(model: PreTrainedModel, prompts: list[torch.Tensor], n: int, eos: list[int]) -> float:
    """Tokens/s of Hugging Face's greedy generate over the prompts."""
    def generate(ids):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos or None, pad_token_id=(eos or [0])[0])
        return out[0, ids.shape[-1]:]

    generate(prompts[0][:, :8])
    return tokens_per_second(generate, prompts)[0]


def runtime_study(model: PreTrainedModel, prompts: list[torch.Tensor], profiles: Mapping[str, RuntimeProfile],
                  loops: Mapping[str, Loop], *, max_width: int, repeats: int, n: int, eos: list[int],
                  log: Callable[[str], None] = lambda line: None) -> dict:
    """The runtime study (module docstring) on model over prompts (1, L_i). A profile with a `dtype` runs on a copy of
    the model in that dtype, against its own memory bound, and its outputs are checked against the first profile of
    the same dtype (the same weights). The model starts eager, whatever runtime it was loaded on."""
    eager_model(model)
    torch._dynamo.reset()
    bound_ms, gbps = memory_bound_ms(model)
    log(f"memory bound {bound_ms:.1f} ms ({gbps:.1f} GB/s, {weight_bytes(model) / 1e6:.0f} MB of weights)")
    result: dict = {"memory_bound_ms": bound_ms, "read_gb_per_s": gbps, "weight_mb": weight_bytes(model) / 1e6,
                    "hf_plain_tokens_per_s": hf_plain(model, prompts, n, eos), "profiles": {}}
    models, eager_logits, references = {}, {}, {}
    for name, profile in profiles.items():
        dtype = profile.dtype or str(model.dtype).removeprefix("torch.")
        if dtype not in models:  # the weights, and their eager logits (before anything compiles them)
            models[dtype] = weights_in(model, dtype)
            eager_logits[dtype] = [last_logits(models[dtype], ids) for ids in prompts]
        entry, outputs = run_profile(models[dtype], prompts, profile, loops, eager_logits[dtype], max_width, repeats)
        reference = references.setdefault(dtype, next(iter(outputs.values())))
        entry["outputs_equal_eager_target_only"] = all(
            torch.equal(a, b) for key in outputs for a, b in zip(outputs[key], reference))
        result["profiles"][name] = entry
        log(f"{name}: step {entry['pass_ms'][1]:.1f} ms, pass cost "
            + " ".join(f"{w}:{c:.2f}" for w, c in entry["pass_cost"].items()) + "; "
            + ", ".join(f"{key} {entry[f'{key}_tokens_per_s']:.1f} tok/s" for key in loops))
    return result


def runtime_keys(result: dict, report: str) -> dict:
    """bench=runtime's keys from runtime_study's result, for the reported profile (the run's compiled runtime)
    against eager; its end-to-end loops named `ar` (target-only) and `lookup_k3` (prompt lookup, k = 3)."""
    p, eager = result["profiles"][report], result["profiles"]["eager"]
    cost = p["pass_cost"]
    compile_ = p.get("compile", {})
    return {
        "profile": report,
        "pass_cost_max_width_2_to_5": max(cost[w] for w in range(2, 6) if w in cost),
        "pass_cost_width_9": cost.get(9),
        "target_step_vs_memory_bound": p["step_vs_memory_bound"],
        "ar_vs_hf_plain": p["ar_tokens_per_s"] / result["hf_plain_tokens_per_s"],
        "ar_vs_eager_ar": p["ar_tokens_per_s"] / eager["ar_tokens_per_s"],
        "lookup_vs_target_only": p["lookup_k3_tokens_per_s"] / p["ar_tokens_per_s"],
        "lookup_vs_eager_target_only": p["lookup_k3_tokens_per_s"] / eager["ar_tokens_per_s"],
        "compile_seconds_cold": compile_.get("cold", {}).get("seconds"),
        "compile_seconds_warm": compile_.get("warm", {}).get("seconds"),
    }


def run_profile(model: PreTrainedModel, prompts: list[torch.Tensor], profile: RuntimeProfile,
                loops: Mapping[str, Loop], eager_logits: list[torch.Tensor], max_width: int, repeats: int
                ) -> tuple[dict, dict]:
    """One profile's figures (compile, logits against these weights' eager ones, pass costs, step against the
    memory bound of these weights, end to end) and its outputs; the model is eager again afterwards."""
    prefix, widths = prompts[0], list(range(1, max_width + 1))
    entry: dict = {"settings": profile.settings, "dtype": str(model.dtype).removeprefix("torch.")}
    if profile.compile is not None:
        entry["compile"] = compile_seconds(model, prefix, **profile.compile)
        entry["logits_max_abs_diff_vs_eager"] = largest_logit_difference(model, prompts, eager_logits)
    ms, bound_ms = pass_ms(model, prefix, widths, repeats)
    entry |= {"pass_ms": ms, "pass_cost": {w: ms[w] / ms[1] for w in widths}, "memory_bound_ms": bound_ms,
              "step_vs_memory_bound": ms[1] / bound_ms}
    rates, outputs = end_to_end(model, prompts, loops)
    eager_model(model)
    torch._dynamo.reset()
    return entry | rates, outputs


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

            def timed(*args, inner=inner, **kwargs):
                self._start()
                out = inner(*args, **kwargs)
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


@dataclass
class ClockedRun:
    """One call of a loop on one input: new tokens, wall seconds, the loop's statistics (a summary; None for Hugging
    Face's loops), and the seconds and calls inside each model (a ForwardClock's)."""

    tokens: list[int]
    seconds: float
    stats: dict | None = None
    model_seconds: dict[str, float] = field(default_factory=dict)
    model_calls: dict[str, int] = field(default_factory=dict)


def clocked(clock: ForwardClock | None, fn: Callable, ids: torch.Tensor, n: int, seed: int) -> ClockedRun:
    """Wall time of fn(ids, n, seed), an output with .tokens (n,) and .stats (CUDA synchronized by the stopwatch),
    with the seconds and calls inside each of the clock's models during the call (no clock: none)."""
    if clock is not None:
        clock.reset()
    wall: dict[str, float] = {}
    with stopwatch(wall, "run", ids.device):
        out = fn(ids, n, seed)
    run = ClockedRun(out.tokens.tolist(), wall["run"], out.stats)
    if clock is not None:
        run.model_seconds, run.model_calls = dict(clock.seconds), dict(clock.calls)
    return run


Item = TypeVar("Item")


def interleaved(names: Sequence[str], items: Sequence[Item], repetitions: int) -> Iterator[tuple[int, Item, str]]:
    """(repetition, item, contender) in a round-robin order: no contender always runs first, so drift of the
    machine's speed hits all contenders alike."""
    for rep in range(repetitions):
        for j, item in enumerate(items):
            for name in rotated(names, rep * len(items) + j):
                yield rep, item, name


def interleaved_runs(runs: Mapping[str, Callable], inputs: Mapping[str, torch.Tensor], n: int, repetitions: int,
                     seed: int = 0, clock: ForwardClock | None = None, attempt: Callable | None = None,
                     finished: Callable[[str, dict], None] = lambda name, runs: None,
                     log: Callable[[str], None] = lambda s: None) -> dict[str, dict[str, list[ClockedRun]]]:
    """Each loop run(ids, n, seed) (clocked's fn) once as a warm-up (excluded: first calls allocate, build kernels
    and caches), then `repetitions` rounds over every input in an interleaved order, clocked, at seed + repetition.
    attempt(name, stage, fn, *args): the call fn(*args), or None for a loop that failed (it runs no more);
    finished(name, its runs): once a loop has run everything. Returns each loop's runs by input."""
    attempt = attempt or (lambda name, stage, fn, *args: fn(*args))
    first = next(iter(inputs.values()))
    for name, run in runs.items():
        attempt(name, "warm-up", run, first, min(8, n), seed)
    out: dict[str, dict[str, list[ClockedRun]]] = {name: {key: [] for key in inputs} for name in runs}
    left = dict.fromkeys(runs, len(inputs) * repetitions)
    for rep, key, name in interleaved(list(runs), list(inputs), repetitions):
        measured = attempt(name, "run", clocked, clock, runs[name], inputs[key], n, seed + rep)
        if measured is None:
            continue
        out[name][key].append(measured)
        log(f"rep {rep} {key:16s} {name:20s} {len(measured.tokens):4d} tok "
            f"{len(measured.tokens) / measured.seconds:6.1f} tok/s")
        left[name] -= 1
        if left[name] == 0:
            finished(name, out[name])
    return out


def rotated(items: Sequence[Item], shift: int) -> list[Item]:
    """items started at index shift (modulo their number), the ones before it moved to the end."""
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


STEP_REPEATS = 9  # interleaved rounds of scaling_study's target steps, one at every row's context


def scaling_study(runs: Mapping[str, Callable], target: PreTrainedModel, prompt: torch.Tensor, lengths: list[int],
                  prompt_lengths: list[int], seed: int = 0, log: Callable[[str], None] = lambda s: None) -> dict:
    """Milliseconds per generated token vs max_new_tokens and vs prompt length (end tokens ignored), for each loop
    run(ids, n, seed) (clocked's fn) after prompt (1, L).

    Next to each loop's wall time per token: its time outside the target's forwards (the loop's own cost, which
    must not grow with the length) and the target's one-token step at the final context, the steps at every row's
    context timed interleaved (STEP_REPEATS rounds). The prompt is lengthened by repeating itself in front of it.
    """
    clock = ForwardClock({"target": target})
    for run in runs.values():
        run(prompt, 4, seed)
    filler = prompt.repeat(1, 1 + max([*lengths, *prompt_lengths]) // prompt.shape[-1])

    def row(ids: torch.Tensor, n: int) -> dict:
        r = {"prompt_tokens": ids.shape[-1], "new_tokens": n, "target_step_ms_at_end": None}  # timed below
        for name, run in runs.items():
            measured = clocked(clock, run, ids, n, seed)
            r[f"{name}_ms_per_token"] = 1000 * measured.seconds / len(measured.tokens)
            outside = measured.seconds - sum(measured.model_seconds.values())  # the loop's own time, load-robust
            r[f"{name}_overhead_ms_per_token"] = 1000 * outside / len(measured.tokens)
            log(f"scaling L={ids.shape[-1]} n={n} {name} {r[f'{name}_ms_per_token']:.1f} ms/token")
        return r

    by_new = [row(prompt, n) for n in lengths]
    by_prompt = [row(torch.cat([filler[:, : L - prompt.shape[-1]], prompt], dim=-1), lengths[0])
                 for L in prompt_lengths if L >= prompt.shape[-1]]  # fmt: skip
    clock.remove()
    rows = [*by_new, *by_prompt]
    ends = {i: torch.cat([filler[:, : r["prompt_tokens"]], filler[:, : r["new_tokens"]]], dim=-1)  # (1, L + n)
            for i, r in enumerate(rows)}  # fmt: skip
    for i, ms in forwards_ms(target, ends, 1, STEP_REPEATS).items():
        rows[i]["target_step_ms_at_end"] = ms
    return {"by_max_new_tokens": by_new, "by_prompt_length": by_prompt}


Batched = Callable[[torch.Tensor | list[torch.Tensor], int, int], object]  # (ids, n, seed) -> a Generation


LONG_CONTEXT, SHORT_CONTEXT = 2048, 64  # long_context_vs_short: tokens/s after this many prompt tokens over that many


def context_ratios(by_prompt_length: list[dict], llamacpp: dict[int, float] | None = None) -> dict[str, float]:
    """long_context_vs_short: the target's decoding rate (one step, the prompt's prefill left out, as llama-bench's
    depth runs measure it) after LONG_CONTEXT tokens over after SHORT_CONTEXT, from scaling_study's rows, where both
    were measured. llamacpp: llama-bench's tokens/s by depth (specdec.llamacpp.depth_rates), which adds its own
    ratio (llamacpp_long_context_vs_short) and ours over its at LONG_CONTEXT (ar_vs_llamacpp_f32_long)."""
    ms = {row["prompt_tokens"]: row.get("target_step_ms_at_end") for row in by_prompt_length}
    out = {}
    if ms.get(LONG_CONTEXT) and ms.get(SHORT_CONTEXT):
        out["long_context_vs_short"] = ms[SHORT_CONTEXT] / ms[LONG_CONTEXT]
    rates = {int(depth): rate for depth, rate in (llamacpp or {}).items()}
    if rates.get(LONG_CONTEXT) and rates.get(SHORT_CONTEXT):
        out["llamacpp_long_context_vs_short"] = rates[LONG_CONTEXT] / rates[SHORT_CONTEXT]
    if rates.get(LONG_CONTEXT) and ms.get(LONG_CONTEXT):
        out["ar_vs_llamacpp_f32_long"] = 1000 / ms[LONG_CONTEXT] / rates[LONG_CONTEXT]
    return out


def batch_study(generate: Mapping[str, Batched], prompts: list[torch.Tensor], sizes: list[int], baseline: str, *,
                max_new_tokens: int, seed: int = 0, repetitions: int = 1,
                peak: Callable[[], AbstractContextManager], log: Callable[[str], None] = lambda s: None) -> dict:
    """Throughput against batch size: each loop generate[name] at every batch size, and its ratio over the baseline's
    at the same size. The prompts (1, L) each are cycled to a multiple of the largest size, so that every size
    decodes the same rows, and grouped `size` at a time (batch 1: one prompt (1, L) per call, the single-sequence
    path; else a list of them). The sizes run in an order rotated between repetitions, so that a slow phase of the
    machine does not fall on one size only. peak(): a context measuring the peak memory of its block (.rss_mb,
    .cuda_mb)."""
    rows = [prompts[i % len(prompts)] for i in range(-(-len(prompts) // max(sizes)) * max(sizes))]
    for run in generate.values():  # warm-up: allocator, kernels, the calibration's caches
        run(rows[0], 8, seed)
        run(rows[:2], 8, seed)
    measured: dict[str, dict[int, list[dict]]] = {name: {s: [] for s in sizes} for name in generate}
    for rep in range(repetitions):
        for size in rotated(sizes, rep):
            for name, run in generate.items():
                r = run_size(run, rows, size, max_new_tokens, seed, peak)
                measured[name][size].append(r)
                log(f"batch {size} {name}: {r['tokens_per_second']:.1f} tok/s, latency {r['latency_s']:.2f} s")
    result = {"sizes": sizes, "rows": len(rows),
              "contenders": {name: {str(s): summary_of(runs) for s, runs in by_size.items()}
                             for name, by_size in measured.items()}}  # fmt: skip
    reference = measured[baseline][sizes[0]][0]["outputs"]  # agreement: rows equal to the baseline's at batch 1
    result["agreement"] = {name: {str(s): statistics.mean(a == b for a, b in zip(runs[0]["outputs"], reference))
                                  for s, runs in by_size.items()} for name, by_size in measured.items()}  # fmt: skip
    base = result["contenders"][baseline]
    result["ratios"] = {name: {str(s): figures[str(s)]["tokens_per_second"] / base[str(s)]["tokens_per_second"]
                               for s in sizes}
                        for name, figures in result["contenders"].items() if name != baseline}  # fmt: skip
    return result


def run_size(run: Batched, rows: list[torch.Tensor], size: int, n: int, seed: int,
             peak: Callable[[], AbstractContextManager]) -> dict:
    """One loop over every row at one batch size: tokens, wall seconds, latency, passes, the cost model's predicted
    and measured tokens/s, the outputs."""
    tokens, latency, passes, row_passes, chosen, outputs = 0, [], 0, 0, [], []
    model = dict.fromkeys(("predicted_tokens", "predicted_seconds", "measured_tokens", "measured_seconds"), 0.0)
    with peak() as memory:
        started = time.perf_counter()
        for i in range(0, len(rows), size):
            begun = time.perf_counter()
            out = run(rows[i] if size == 1 else rows[i : i + size], n, seed)
            stats = out.stats
            if size == 1:
                rows_out = [out.tokens]
                latency.append(time.perf_counter() - begun)
                passes += stats.target_forwards
            else:
                rows_out = out.tokens
                latency += out.latency
                passes += int(stats.extras.get("passes", 0))
            row_passes += stats.target_forwards
            tokens += sum(r.numel() for r in rows_out)
            chosen += list(stats.chosen_k)
            for key in model:
                model[key] += getattr(stats, key)
            outputs += [r.tolist() for r in rows_out]
        seconds = time.perf_counter() - started
    return {
        "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
        "latency_s": statistics.mean(latency), "passes": passes,
        "tokens_per_row_pass": tokens / row_passes if row_passes else None,
        "chosen_k_mean": statistics.mean(chosen) if chosen else None,
        "plain_step_share": statistics.mean([k == 0 for k in chosen]) if chosen else None,
        "peak_rss_mb": memory.rss_mb, "peak_cuda_mb": memory.cuda_mb, "outputs": outputs,
        # the cost model's expected tokens per second over the rounds it predicted, and what they measured
        "predicted_tokens_per_second": ratio(model["predicted_tokens"], model["predicted_seconds"]),
        "measured_tokens_per_second": ratio(model["measured_tokens"], model["measured_seconds"]),
    }  # fmt: skip


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def summary_of(runs: list[dict]) -> dict:
    """One size's repetitions: medians of the rates, the outputs of the first."""
    keep = {k: v for k, v in runs[0].items() if k != "outputs"}
    for key in ("tokens_per_second", "latency_s", "seconds"):
        keep[key] = statistics.median(r[key] for r in runs)
    keep["tokens_per_second_runs"] = [r["tokens_per_second"] for r in runs]
    keep["outputs"] = runs[0]["outputs"]
    return keep


def spread(values: list[float]) -> dict:
    """Median, min, max and count of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def throughput(per_prompt: Mapping[str, list[ClockedRun]], categories: Mapping[str, str]) -> dict:
    """Tokens/s of each repetition (the prompts pooled) over every prompt, per category and per prompt (median, min,
    max over the repetitions: spread), the share of the time inside the models' forwards and their calls per token;
    per_prompt: a loop's runs of each prompt by repetition, categories: each prompt's."""
    reps = len(next(iter(per_prompt.values())))
    runs = [r for rs in per_prompt.values() for r in rs]

    def pooled(ids: list[str]) -> list[float]:  # tokens/s of each repetition over the given prompts
        return [
            sum(len(per_prompt[i][r].tokens) for i in ids) / sum(per_prompt[i][r].seconds for i in ids)
            for r in range(reps)
        ]

    return {
        "tokens_per_second": spread(pooled(list(categories))),
        "by_category": {c: spread(pooled([i for i in categories if categories[i] == c]))
                        for c in sorted(set(categories.values()))},
        "by_prompt": {i: {"tokens": len(per_prompt[i][0].tokens), **spread(pooled([i]))} for i in categories},
        "model_forward_share": sum(sum(r.model_seconds.values()) for r in runs)
        / sum(r.seconds for r in runs),
        "forwards_per_token": {  # the models this loop called (a bench clocks every contender's)
            m: sum(r.model_calls[m] for r in runs) / sum(len(r.tokens) for r in runs)
            for m in runs[0].model_calls if any(r.model_calls[m] for r in runs)
        },
    }


def generations(generate: Callable[[torch.Tensor], object], inputs: Mapping[str, torch.Tensor]) -> dict:
    """Each input once, in order, generate(ids) -> a Generation: tokens, seconds, tokens/s over them all, and per
    input its tokens, seconds, start (seconds after the first began), target passes (`rounds`; 0 for target-only),
    share of plain steps, and the drafts and thread counts chosen online (rounds each)."""
    rows, generating = [], time.perf_counter()
    for key, ids in inputs.items():
        out = generate(ids)
        stats = out.stats
        rows.append({
            "prompt": key, "tokens": len(out.tokens), "seconds": stats.seconds["total"],
            "started_s": time.perf_counter() - generating - stats.seconds["total"],
            "rounds": len(stats.chosen_k),  # target passes of a speculative method; 0 for target-only
            "plain_step_share": sum(k == 0 for k in stats.chosen_k) / len(stats.chosen_k) if stats.chosen_k else None,
            "drafts": {d: stats.chosen_draft.count(d) for d in sorted(set(stats.chosen_draft))},
            "threads": {t: stats.chosen_threads.count(t) for t in sorted(set(stats.chosen_threads))},
        })  # fmt: skip
    tokens, seconds = sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds, "prompts": rows}


def plain_step_share(run: dict) -> float | None:
    """Share of the rounds of a `generations` result that drafted nothing (None for target-only)."""
    rounds = [p["rounds"] for p in run["prompts"]]
    shares = [p["plain_step_share"] for p in run["prompts"]]
    if not any(rounds) or any(s is None for s in shares):
        return None
    return sum(s * n for s, n in zip(shares, rounds)) / sum(rounds)
