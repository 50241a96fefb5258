"""`make gpu-check`: one command for one H100 or H200, in under 8 minutes, with every figure in one JSON.

1. The GPU exactness checks (tests/test_gpu.py, `pytest -m gpu`), as a subprocess: passed, failed, skipped.
2. Target-only against Hugging Face's `generate`: our greedy loop on the compiled runtime and HF's eager generate on
   the same prompt ids, interleaved (specdec.runtime.study.interleaved_runs); tokens per second, and whether the
   outputs are equal token for token (else where they part).
3. Pass costs: the target's pass of each width 1..16 after each context depth (64, 768, 2048, 4096 tokens), and the
   draft's one-token step there (c), by specdec.runtime.probes.forward_ms.

The models are the random-weight Llama-3 8B target and 1B draft in bfloat16 (specdec.runtime.tiny.RANDOM_SHAPES:
timing does not depend on the weights' values, nothing is downloaded), on the compiled runtime: one static-shape
graph per width bucket over a preallocated cache (the gpt-fast design), each pass seen before on a cache replayed as
a CUDA graph (specdec.runtime.graphs; inductor's own, mode="reduce-overhead", skip a graph that writes its inputs,
as every pass writes the cache). A pass pads to its bucket, so widths between buckets cost their bucket's pass.

A time budget (--budget-s) keeps the run under 8 minutes: a measurement that would not fit in what is left (a
graph's compile: as long as the slowest one so far) is skipped with its reason, and at the budget's end whatever
runs stops and the JSON records it. The JSON is written after every part.

    python scripts/gpu_check.py --out outputs/gpu-check.json                  # make gpu-check
    python scripts/gpu_check.py --device cpu --shapes tiny --out check.json   # a rehearsal on the CPU (toy shapes,
                                                                              # numbers that mean nothing)
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from experiments.records import machine, write_json
from specdec import GREEDY, autoregressive_generate
from specdec.hf import hf_generate
from specdec.quality import first_difference
from specdec.runtime.compiled import compile_model, compiled_forward, runs_compiled
from specdec.runtime.machine import release_memory
from specdec.runtime.models import check_device, load_model
from specdec.runtime.probes import forward_ms
from specdec.runtime.study import interleaved_runs, spread

ROOT = Path(__file__).resolve().parents[1]
GPU_TESTS = ROOT / "tests" / "test_gpu.py"
RESERVE_S = 5.0  # seconds of the budget kept for writing the JSON


@dataclass(frozen=True)
class Shapes:
    """The models and sizes of a check: target and draft (load_model names), their dtype, the target's width buckets,
    the widths and context depths of the pass costs, the end-to-end prompt and output lengths. compile_guess_s:
    the seconds a graph's first compile is planned at before one has been timed (the budget's estimate only)."""

    target: str
    draft: str
    dtype: str
    buckets: tuple[int, ...]
    widths: tuple[int, ...]
    depths: tuple[int, ...]
    prompt_tokens: int
    new_tokens: int
    compile_guess_s: float

    @property
    def capacity(self) -> int:
        """Cache slots a row: the deepest context, or the prompt and its output, and the widest bucket's pass."""
        return max(*self.depths, self.prompt_tokens + self.new_tokens) + max(self.buckets)


SHAPES = {
    # two graphs of the 8B (buckets 1 and 8) compiled in 107 s on an H200 (docs/results/gpu-graphs/h200-ab.json)
    "llama3": Shapes("random:llama3-8b", "random:llama3-1b", "bfloat16", (1, 2, 4, 8, 16), tuple(range(1, 17)),
                     (64, 768, 2048, 4096), 128, 128, compile_guess_s=120.0),
    # toy shapes for the CPU: the same path in seconds; widths 5 and 6 are wider than every bucket (eager passes)
    "tiny": Shapes("random:tiny-target", "random:tiny-draft", "float32", (1, 4), tuple(range(1, 7)), (16, 96), 16, 16,
                   compile_guess_s=30.0),
}


class OutOfTime(Exception):
    """The budget ran out while a part was running."""


class Budget:
    """Seconds left of the run's budget; `hard_stop` raises OutOfTime in the main thread at its end."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.perf_counter):
        self.seconds, self.clock = seconds, clock
        self.end = clock() + seconds

    def left(self) -> float:
        return self.end - self.clock()

    def allows(self, seconds: float) -> bool:
        """Whether `seconds` of work still fit, the JSON's reserve kept."""
        return self.left() - RESERVE_S >= seconds

    @contextmanager
    def hard_stop(self) -> Iterator[None]:
        """Within the block, SIGALRM at the budget's end raises OutOfTime (where there is SIGALRM and this is the
        main thread; elsewhere only the checks of `allows` hold the budget)."""
        if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
            yield
            return

        def stop(signum, frame):
            raise OutOfTime(f"the budget of {self.seconds:.0f} s ran out")

        previous = signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, max(self.left(), 0.001))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def run_part(parts: dict, name: str, budget: Budget, needed_s: float, part: Callable[[dict], None]) -> dict:
    """parts[name]: the figures part(record) fills in, and its seconds; or why it did not run (the budget). A part
    that stops (OutOfTime) or fails keeps what it had filled in, with the reason (the check goes on)."""
    record = parts[name] = {}
    if not budget.allows(needed_s):
        record["skipped"] = f"needs about {needed_s:.0f} s, {budget.left():.0f} s of the budget left"
        return record
    start = time.perf_counter()
    try:
        part(record)
    except OutOfTime as stop:
        record["stopped"] = str(stop)
    except Exception as error:  # noqa: BLE001 (one part's failure is that part's record, not the run's end)
        record["error"] = f"{type(error).__name__}: {str(error).strip()[:500]}"
    record["seconds"] = time.perf_counter() - start
    return record


# ---------------------------------------------------------------------------- 1. the GPU tests


def gpu_tests(device: str, workers: int, timeout_s: float, path: Path = GPU_TESTS) -> dict:
    """`pytest -m gpu path` in a subprocess (rehearsed on the CPU with SPECDEC_GPU_TESTS_ON=cpu), on `workers`
    pytest-xdist processes (0: in the subprocess itself): its counts from a JUnit XML report, the failures' ids."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "gpu-tests.xml"
        command = [sys.executable, "-m", "pytest", "-m", "gpu", str(path), f"--junitxml={report}", "-q",
                   *(["-n", str(workers), "--dist", "loadgroup"] if workers else [])]
        env = os.environ | ({"SPECDEC_GPU_TESTS_ON": "cpu"} if device == "cpu" else {})
        try:
            done = subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"command": shlex.join(command), "timed_out": f"after {timeout_s:.0f} s"}
        counts = junit_counts(report) if report.exists() else {"report": "none written"}
    tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
    return {"command": shlex.join(command), "returncode": done.returncode, **counts, "output_tail": tail}


def junit_counts(report: Path) -> dict:
    """Tests, passed, failed, errors and skipped of a JUnit XML report, and the ids of those that failed."""
    outcomes: dict[str, list[str]] = {"passed": [], "failed": [], "errors": [], "skipped": []}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        kind = "failed" if "failure" in tags else "errors" if "error" in tags else "skipped" if "skipped" in tags \
            else "passed"
        outcomes[kind].append(name)
    return {"tests": sum(map(len, outcomes.values())), **{kind: len(ids) for kind, ids in outcomes.items()},
            "not_passed": outcomes["failed"] + outcomes["errors"], "skipped_ids": outcomes["skipped"]}


# ---------------------------------------------------------------------------- the models


def load_pair(shapes: Shapes, device: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Target and draft of the shapes on the device, on the compiled runtime (graphs compile at their first use):
    the target with the shapes' buckets, the draft with one-token steps; CUDA graphs on (on a GPU)."""
    target = load_model(shapes.target, dtype=shapes.dtype, device=device)
    draft = load_model(shapes.draft, dtype=shapes.dtype, device=device)
    compile_model(target, widths=shapes.buckets, capacity=shapes.capacity, autotune=False, cuda_graphs=True)
    compile_model(draft, widths=(1,), capacity=shapes.capacity, autotune=False, cuda_graphs=True)
    return target, draft


def load_into(models: dict, record: dict, shapes: Shapes, device: str) -> None:
    """models["target"] and models["draft"] (load_pair); their names and dtype into record."""
    models["target"], models["draft"] = load_pair(shapes, device)
    record |= {"target": shapes.target, "draft": shapes.draft, "dtype": shapes.dtype}


def random_ids(length: int, device: str, seed: int = 0) -> torch.Tensor:
    """(1, length) token ids below 256 (the bytes every random shape's vocabulary holds), the same for a seed."""
    return torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(seed)).to(device)


def runtime_record(model: torch.nn.Module) -> dict:
    """What the model's compiled runtime did: each graph's compile seconds (rows x width), why it runs eager if it
    does, and its CUDA graphs (recorded, replayed, why recording stopped; None without them: on a CPU)."""
    runtime = compiled_forward(model)
    if runtime is None:
        return {"compiled": False}
    graphs = runtime.graphs
    return {
        "compiled": runs_compiled(model), "eager_reason": runtime.record.eager_reason,
        "buckets": list(runtime.widths), "capacity": runtime.capacity,
        "attention_slots": f"the slots in use rounded up to {runtime.window_slots}" if runtime.window_slots
        else "the whole cache buffer",
        "compile_seconds": {f"{rows}x{width}": s for (rows, width), s in runtime.record.seconds.items()},
        "cuda_graphs": None if graphs is None else {"recorded": graphs.recorded, "replayed": graphs.replayed,
                                                    "failed": graphs.failed},
    }  # fmt: skip


def compile_estimate(models: list[torch.nn.Module], guess_s: float) -> float:
    """Seconds a graph's first compile is planned at: the slowest compile timed so far on the models (the target's
    the slowest), else guess_s."""
    return max((s for model in models for s in compiled_forward(model).record.seconds.values()), default=guess_s)


def compiles(model: torch.nn.Module, width: int) -> bool:
    """Whether a pass of `width` tokens would compile a graph (its bucket has none yet)."""
    runtime = compiled_forward(model)
    bucket = runtime.bucket(width)
    return bucket is not None and (1, bucket) not in runtime.record.seconds


# ---------------------------------------------------------------------------- 2. target-only against HF generate


def target_only_vs_hf(target: torch.nn.Module, shapes: Shapes, device: str, repetitions: int) -> dict:
    """Our target-only greedy loop (compiled runtime) and Hugging Face's greedy generate (eager, the model's own
    attention) on the same prompt, `repetitions` interleaved rounds after a warm-up each: tokens per second (median,
    min, max over the rounds), ours over HF's, and whether every output equals HF's first token for token."""
    runs = {
        "target_only": lambda ids, n, seed: autoregressive_generate(target, ids, sampling=GREEDY, max_new_tokens=n),
        "hf_generate": lambda ids, n, seed: hf_generate(target, ids, sampling=GREEDY, max_new_tokens=n, seed=seed,
                                                        eos_token_id=[]),
    }  # fmt: skip
    prompt = random_ids(shapes.prompt_tokens, device)
    measured = interleaved_runs(runs, {"prompt": prompt}, shapes.new_tokens, repetitions)
    rates = {name: spread([len(r.tokens) / r.seconds for r in by_input["prompt"]])
             for name, by_input in measured.items()}
    reference = measured["hf_generate"]["prompt"][0].tokens
    parted = [first_difference(r.tokens, reference) for by_input in measured.values() for r in by_input["prompt"]]
    return {
        "prompt_tokens": shapes.prompt_tokens, "new_tokens": shapes.new_tokens, "repetitions": repetitions,
        "target_only_compiled": runs_compiled(target),
        "tokens_per_s": rates,
        "target_only_over_hf": rates["target_only"]["median"] / rates["hf_generate"]["median"],
        "outputs_equal": all(at is None for at in parted),
        "first_difference": min((at for at in parted if at is not None), default=None),
        "target_only_tokens": measured["target_only"]["prompt"][0].tokens, "hf_tokens": reference,
    }  # fmt: skip


# ---------------------------------------------------------------------------- 3. pass costs by width and depth


def pass_cost_grid(grid: dict, target: torch.nn.Module, draft: torch.nn.Module, shapes: Shapes, device: str,
                   repeats: int, budget: Budget) -> None:
    """Into grid, after each context depth (a prefix of random ids): the median ms of the target's pass of each
    width (forward_ms, `repeats` rounds after two untimed ones: the graph's compile, then its CUDA graph's
    recording) and its cost in one-token steps; then the draft's one-token step at each depth (c: over the
    target's). A measurement that would not fit in the budget is skipped with its reason; the others go on."""
    grid |= {"buckets": {w: compiled_forward(target).bucket(w) for w in shapes.widths}, "skipped": [],
             "by_depth": {depth: {"target_pass_ms_by_width": {}} for depth in shapes.depths}}
    longest = 0.0  # the slowest measurement that compiled nothing: the estimate of the next one
    for name, model, widths in (("target", target, shapes.widths), ("draft", draft, (1,))):
        for depth in shapes.depths:
            prefix = random_ids(depth, device, seed=depth)
            for width in widths:
                compiling = compiles(model, width)
                needed = longest + (compile_estimate([target, draft], shapes.compile_guess_s) if compiling else 0.0)
                if not budget.allows(needed):
                    grid["skipped"].append({"depth": depth, "model": name, "width": width,
                                            "reason": f"needs about {needed:.0f} s, {budget.left():.0f} s left"})
                    continue
                start = time.perf_counter()
                ms = forward_ms(model, prefix, width, repeats=repeats, warmup=2)
                longest = longest if compiling else max(longest, time.perf_counter() - start)
                if name == "target":
                    grid["by_depth"][depth]["target_pass_ms_by_width"][width] = ms
                else:
                    grid["by_depth"][depth]["draft_step_ms"] = ms
            release_memory(device)  # the caches of this depth's measurements
    for row in grid["by_depth"].values():
        step = row["target_pass_ms_by_width"].get(1)
        if step:
            row["target_pass_cost_by_width"] = {w: ms / step for w, ms in row["target_pass_ms_by_width"].items()}
            row["c"] = row["draft_step_ms"] / step if "draft_step_ms" in row else None


# ---------------------------------------------------------------------------- the run


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a rehearsal")
    parser.add_argument("--shapes", default="llama3", choices=sorted(SHAPES),
                        help="llama3: random-weight Llama-3 8B/1B in bf16 (default); tiny: toy shapes for the CPU")
    parser.add_argument("--out", default="outputs/gpu-check.json", help="the JSON written")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="seconds the parts may take (default 420: with Python's start, under 8 minutes)")
    parser.add_argument("--no-tests", action="store_true", help="leave out the GPU tests (part 1)")
    parser.add_argument("--test-workers", type=int, default=None,
                        help="pytest-xdist workers of the GPU tests (0: none; default 4 on a GPU, 0 on a CPU)")
    parser.add_argument("--tests-timeout-s", type=float, default=180.0, help="the GPU tests' limit")
    parser.add_argument("--repetitions", type=int, default=3, help="interleaved rounds of target-only and HF")
    parser.add_argument("--repeats", type=int, default=9, help="timed passes per width and depth")
    return parser.parse_args(argv)


def xdist_workers(args: argparse.Namespace) -> int:
    """The GPU tests' pytest-xdist workers: as asked, else 4 on a GPU (the machine's cores compile the tiny models'
    graphs side by side) and none on a CPU (a rehearsal, on a machine that may have two cores)."""
    return args.test_workers if args.test_workers is not None else 0 if args.device == "cpu" else 4


def machine_record(device: str) -> dict:
    """The repository's machine record (commit, packages, CPU, device name) with torch's CUDA build and the GPU."""
    record = machine(device) | {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if device.startswith("cuda"):
        properties = torch.cuda.get_device_properties(torch.device(device))
        record |= {"gpu": properties.name, "gpu_memory_gb": properties.total_memory / 1e9,
                   "gpu_capability": f"{properties.major}.{properties.minor}"}
    return record


def check(args: argparse.Namespace, command: str) -> dict:
    """Every part in turn into one record (with the command that ran it), written to args.out after each."""
    started = time.perf_counter()
    budget, shapes, out = Budget(args.budget_s), SHAPES[args.shapes], Path(args.out)
    result: dict = {"command": command, "budget_s": args.budget_s,
                    "settings": {"device": args.device, "shapes": args.shapes, **asdict(shapes),
                                 "capacity": shapes.capacity, "repetitions": args.repetitions,
                                 "repeats": args.repeats},
                    "machine": machine_record(args.device), "parts": {}}
    parts, models = result["parts"], {}
    write_json(out, result)
    try:
        with budget.hard_stop():
            if args.no_tests:
                parts["gpu_tests"] = {"skipped": "--no-tests"}
            else:
                run_part(parts, "gpu_tests", budget, 0.0, lambda record: record.update(
                    gpu_tests(args.device, xdist_workers(args), min(args.tests_timeout_s, budget.left()))))
            write_json(out, result)
            run_part(parts, "load", budget, 0.0, lambda record: load_into(models, record, shapes, args.device))
            if len(models) == 2:
                target, draft = models["target"], models["draft"]
                run_part(parts, "target_only_vs_hf", budget, shapes.compile_guess_s, lambda record: record.update(
                    target_only_vs_hf(target, shapes, args.device, args.repetitions)))
                write_json(out, result)
                run_part(parts, "pass_costs", budget, 0.0, lambda record: pass_cost_grid(
                    record, target, draft, shapes, args.device, args.repeats, budget))
    except OutOfTime as stop:  # between two parts
        result["stopped"] = str(stop)
    result["runtimes"] = {name: runtime_record(model) for name, model in models.items()}
    if args.device.startswith("cuda"):
        result["cuda_max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(torch.device(args.device)) / 1e9
    result["seconds"] = time.perf_counter() - started
    write_json(out, result)
    return result


def failed(result: dict) -> list[str]:
    """What makes the check fail: a part that erred or stopped, GPU tests that did not all pass (or did not run
    when asked)."""
    parts = result["parts"]
    problems = [f"{name}: {part.get('error') or part.get('stopped') or part.get('timed_out')}"
                for name, part in parts.items() if {"error", "stopped", "timed_out"} & set(part)]
    problems += [f"stopped: {result['stopped']}"] if "stopped" in result else []
    tests = parts.get("gpu_tests", {})
    if "returncode" in tests and (tests["returncode"] != 0 or tests.get("failed") or tests.get("errors")):
        problems.append(f"gpu_tests: {tests.get('not_passed') or tests['output_tail'][-1:]}")
    return problems


def summary(result: dict) -> list[str]:
    """One line per part: its seconds and headline figures, or why it did not run."""
    return [f"{name}: " + "; ".join(part_figures(part)) for name, part in result["parts"].items()]


def part_figures(part: dict) -> list[str]:
    """A part's seconds, headline figures and reasons, as short phrases."""
    figures = [f"{part['seconds']:.1f} s"] if "seconds" in part else []
    if "passed" in part:
        figures.append(f"{part['passed']} passed, {part['failed']} failed, {part['errors']} errors, "
                       f"{part['skipped']} skipped")
    if "target_only_over_hf" in part:
        rates = {key: rate["median"] for key, rate in part["tokens_per_s"].items()}
        equal = "equal" if part["outputs_equal"] else f"part at token {part['first_difference']}"
        figures.append(f"target-only {rates['target_only']:.1f} tok/s, HF generate {rates['hf_generate']:.1f} tok/s, "
                       f"outputs {equal}")
    for depth, row in part.get("by_depth", {}).items():
        costs = list(row.get("target_pass_cost_by_width", {}).values())[1:]
        if costs:
            figures.append(f"at {depth} tokens: step {row['target_pass_ms_by_width'][1]:.2f} ms, wider passes "
                           f"{min(costs):.2f}-{max(costs):.2f} steps")
    if isinstance(part.get("skipped"), list) and part["skipped"]:
        figures.append(f"{len(part['skipped'])} measurements skipped for the budget")
    return figures + [f"{key}: {part[key]}" for key in ("skipped", "stopped", "error", "timed_out")
                      if isinstance(part.get(key), str)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        check_device(args.device)
    except ValueError as error:
        print(f"{error}\nA rehearsal without a GPU: python scripts/gpu_check.py --device cpu --shapes tiny",
              file=sys.stderr)
        return 2
    result = check(args, shlex.join([sys.executable, str(Path(__file__).relative_to(ROOT)), *argv]))
    print("\n".join(summary(result)), flush=True)
    problems = failed(result)
    print(f"wrote {args.out} in {result['seconds']:.0f} s" + (": " + "; ".join(problems) if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
