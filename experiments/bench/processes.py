"""Contenders in fresh processes: the load scenario and each contender's peak memory.

The load scenario (bench.load): target-only and the default configuration each run again in a fresh process
(loading, threads=auto and the calibration included) while competing busy loops run, from the process's
start until bench.load.seconds after its generation started; the ratio of their tokens per second is
default_under_load_vs_target_only: the same schedule of load for both, the default's start-up measured under
load too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from specdec.prompts import Prompt
from specdec.runtime.machine import peak_rss_mb, reset_peak_rss
from specdec.runtime.study import generations

from .contenders import Contender

GENERATING = "generating:"  # what a load run prints once its contender is built, before it generates


def bench_command(base: list[str], one: str, folder: Path) -> list[str]:
    """`python -m experiments.bench` with the overrides base and `one` (the contender it runs), writing to folder."""
    return [sys.executable, "-m", "experiments.bench", *base, one, "bench.memory=false", f"hydra.run.dir={folder}",
            "hydra.output_subdir=null"]


def busy_loops(processes: int) -> list[subprocess.Popen]:
    """Competing CPU work: `processes` Python busy loops (what a user's other program does to the machine)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]


def stop(loops: list[subprocess.Popen]) -> None:
    for p in loops:
        if p.poll() is None:
            p.kill()
            p.wait()


def load_run_of(name: str, base: list[str], out: Path, seconds: float, processes: int) -> dict:
    """The contender `name` in a fresh process (overrides base), under `processes` busy loops from its start until
    `seconds` after its generation starts; what the process measured (run_load_of), plus when the load stopped."""
    cmd = bench_command(base, f"bench.load_of={name}", out / "load" / name)
    loops = busy_loops(processes)
    started = time.perf_counter()
    timer, lines, stopped = None, [], {}

    def end_load() -> None:
        stop(loops)
        stopped["at"] = time.perf_counter() - started

    try:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        for line in child.stdout:
            lines.append(line)
            if line.startswith(GENERATING):
                timer = threading.Timer(seconds, end_load)
                timer.start()
        if child.wait() != 0:
            raise RuntimeError(f"the load run of {name} failed (exit {child.returncode}): {' '.join(cmd)}")
    finally:
        if timer is not None:
            timer.cancel()
        if any(p.poll() is None for p in loops):
            end_load()
    result = json.loads(lines[-1])
    result["load_stopped_s"] = stopped.get("at")  # seconds after the process started
    return result


def run_load_of(contender: Contender, prompts: list[Prompt], ids: dict[str, torch.Tensor], n: int, seed: int,
                started: float) -> dict:  # fmt: skip
    """In the load run's process: one warm-up, then every prompt once (specdec.runtime.study.generations)."""
    contender.run(ids[prompts[0].id], min(8, n), seed)
    print(f"{GENERATING} {time.perf_counter() - started:.1f} s after the start", flush=True)
    generating = time.perf_counter()
    figures = generations(lambda row: contender.setup.generate(contender.method, row, n, seed), {p.id: ids[p.id] for p in prompts})
    return figures | {"generation_started_s": generating - started}


def memory_of(name: str, base: list[str], out: Path) -> dict:
    """Peak RSS of a fresh process that builds only the contender `name` and runs it once on one prompt."""
    done = subprocess.run(bench_command(base, f"bench.memory_of={name}", out / "memory"), capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_memory_of(contender: Contender, ids: torch.Tensor, n: int, seed: int) -> dict:
    loaded = peak_rss_mb()
    reset_peak_rss()  # restart the high-water mark after loading
    after_load = peak_rss_mb()
    contender.run(ids, n, seed)
    return {"peak_rss_mb": peak_rss_mb(), "rss_after_loading_mb": after_load, "peak_while_loading_mb": loaded}
