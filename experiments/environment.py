"""What a run ran on (git commit, package versions, device) and how much memory each method used."""

from __future__ import annotations

import math
import platform
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import psutil
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "specdec", "torch", "transformers", "bitsandbytes", "datasets", "hydra-core", "omegaconf", "wandb",
    "numpy", "pandas", "seaborn",
)  # fmt: skip


def git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, check=False, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.processor() or platform.machine()} CPU, {psutil.cpu_count()} logical cores"


def environment(device: str) -> dict[str, object]:
    """Git commit, package versions and device, for the run's config and environment.json."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": git("status", "--porcelain", "--untracked-files=no") not in ("", "unknown"),
        "packages": versions,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "device_name": device_name(device),
        "torch_threads": torch.get_num_threads(),
    }


@dataclass
class Peak:
    """Peak memory of one block: process RSS (MB) and, on CUDA, the peak allocated (MB)."""

    rss_mb: float = math.nan
    cuda_mb: float = math.nan


@contextmanager
def peak_memory(device: str, interval: float = 0.01) -> Iterator[Peak]:
    """Measure the block's peak memory; the Peak is filled in when the block ends.

    RSS is sampled by a background thread every `interval` seconds (the OS keeps only a
    process-lifetime peak); it includes every model loaded so far, not only the method's own.
    """
    process, done, peak = psutil.Process(), threading.Event(), Peak()
    highest = [process.memory_info().rss]

    def sample() -> None:
        while not done.wait(interval):
            highest[0] = max(highest[0], process.memory_info().rss)

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()
        peak.rss_mb = max(highest[0], process.memory_info().rss) / 2**20
        if cuda:
            peak.cuda_mb = torch.cuda.max_memory_allocated(device) / 2**20
