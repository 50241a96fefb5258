"""What a number ran on, and the memory it took: package versions, device, CPU features, the bitsandbytes path, load,
and peak memory (a process's high-water mark, or sampled over a block). Record it next to every measurement."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import math
import os
import platform
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import psutil
import torch

PACKAGES = (
    "specdec", "torch", "transformers", "bitsandbytes", "datasets", "hydra-core", "omegaconf", "wandb",
    "numpy", "pandas", "seaborn",
)  # fmt: skip
# On AVX512-BF16 CPUs bitsandbytes warns at import that the optional `kernels` package (which downloads its 4-bit
# kernel from the Hugging Face Hub) is missing; it then runs its own bundled fused gemv_4bit kernel, so: silenced.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
# CPU flags that decide which kernels run: x86 (/proc/cpuinfo "flags") and ARM ("Features")
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8",
             "asimd", "bf16", "i8mm", "sve", "sve2")  # fmt: skip


# ---------------------------------------------------------------------------- the machine


def cores() -> int:
    """The cores this process may use (its CPU affinity: a Slurm allocation, a container's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_info() -> dict[str, object]:
    """CPU model and the flags that decide kernel paths (bf16 / AMX / AVX-512 / AVX2; ARM bf16, i8mm, sve)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {
        "model": fields.get("model name")
        or fields.get("Model name")
        or platform.processor()
        or platform.machine(),
        "logical_cores": psutil.cpu_count(),
        "flags": {flag: flag in flags for flag in CPU_FLAGS} if flags else "unknown (no /proc/cpuinfo)",
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def bitsandbytes_cpu_backend() -> dict[str, object]:
    """Which bitsandbytes CPU kernels this process can use.

    bitsandbytes 0.50 registers its fused 4-bit CPU kernel (gemv_4bit) only when the CPU has AVX512-BF16;
    without it every 4-bit matmul dequantizes the whole weight first. Asked of torch's dispatcher, so it
    reports what was registered, not what the flags suggest.
    """
    try:
        import bitsandbytes  # noqa: F401  (registers its kernels)
        from bitsandbytes.functional import has_avx512bf16
    except ImportError:
        return {"installed": False}

    def registered(op: str) -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"bitsandbytes::{op}", "CPU")

    fused = registered("gemv_4bit")
    return {
        "installed": True,
        "has_avx512bf16": bool(has_avx512bf16()),
        "fused_4bit_gemv": fused,
        "int8_matmul_kernel": registered("int8_linear_matmul"),
        "4bit_path": "fused gemv_4bit kernel" if fused else "dequantize, then torch matmul (no fused kernel)",
    }


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_info()['model']}, {psutil.cpu_count()} logical cores"


def machine(device: str = "cpu") -> dict[str, object]:
    """Package versions, device, CPU features, bitsandbytes path and load: what a number ran on."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "packages": versions,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": platform.node(),
        "device": device,
        "device_name": device_name(device),
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu_info(),
        "bitsandbytes_cpu": bitsandbytes_cpu_backend(),
        "load_average": load_average(),
        "huge_pages": f"{huge_pages_mode()}; {HUGE_PAGES}={os.environ.get(HUGE_PAGES, 'unset')}",
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages when the record was taken (other work on a shared machine)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def cpu_flags(info: dict[str, object]) -> list[str]:
    """The kernel-deciding CPU flags the machine has ([] where they are unknown)."""
    flags = info["cpu"]["flags"]
    return [f for f, on in flags.items() if on] if isinstance(flags, dict) else []


def flags_present(info: dict[str, object]) -> str:
    """The kernel-deciding CPU flags the machine has, comma-separated (or why they are unknown)."""
    flags = info["cpu"]["flags"]
    present = ", ".join(cpu_flags(info)) if isinstance(flags, dict) else flags
    return present or "none of " + ", ".join(CPU_FLAGS)


def machine_label(info: dict[str, object]) -> str:
    """What a timing ran on, short enough for a table cell: the device (a GPU's name, or the CPU model and its
    cores) and the CPU flags. Timings with different labels never share a ratio (experiments.report)."""
    return f"{info['device_name']}; {flags_present(info)}"


def machine_sentence(info: dict[str, object]) -> str:
    """One line for a summary: CPU (or device), the kernel-deciding flags it has, the bitsandbytes 4-bit path."""
    bnb = info["bitsandbytes_cpu"]
    line = f"Machine: {info['device_name']}; CPU flags: {flags_present(info)}"
    if bnb.get("installed"):
        line += f"; bitsandbytes 4-bit on the CPU: {bnb['4bit_path']}"
    if info.get("load_average"):
        line += f"; load average {info['load_average'][0]:.1f} at the start (other work on the machine)"
    return line + "."


# ---------------------------------------------------------------------------- memory


def peak_rss_mb() -> float:
    """This process's lifetime peak resident memory (Linux VmHWM), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
OWN_PAGES_FROM = 1 << 20  # bytes: allocations this large or larger get pages of their own (map_large_allocations)


def glibc():
    """The C library when it is glibc (Linux), else None (musl, macOS: nothing to tune)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def map_large_allocations(threshold: int = OWN_PAGES_FROM) -> None:
    """Give every allocation of `threshold` bytes or more pages of its own, returned to the system when it is freed.
    glibc does so from 128 KB, but raises that bound to the largest block freed so far (up to 32 MB): after a model
    loads, most tensors come from its heap, and what a calibration or a compile frees stays with the process. On
    `make run`'s main experiment (SmolLM2-135M, 2-core Xeon) the peak RSS went from 3,586 to 2,510 MB and the main
    table's from 2,398 to 1,932 MB, decoding as fast (CHANGELOG.md, 2026-12-06). Called by load_model."""
    libc = glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, threshold)


HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"  # torch's switch: its CPU tensors of 2 MB or more on transparent huge pages
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")  # the kernel's mode: [always], [madvise] or [never]


def use_huge_pages() -> None:
    """Put torch's CPU tensors of 2 MB or more on transparent huge pages (2 MB each) where the kernel gives them on
    request: torch's allocator then aligns them and madvises them (THP_MEM_ALLOC_ENABLE; a value the user set stays).
    A step reads every weight once, through one page-table entry for 2 MB instead of 512: on a 2-core Xeon (AMX,
    THP mode madvise) SmolLM2-135M's compiled target-only decoding ran 2-6% faster in three alternating pairs of
    processes, the same memory (docs/results/huge-pages/xeon-amx.txt). torch reads the variable at its first
    allocation of 2 MB or more and keeps the answer: load_model calls this before loading, which in a run of ours
    comes first."""
    os.environ.setdefault(HUGE_PAGES, "1")


def huge_pages_mode() -> str:
    """The kernel's transparent huge page mode (always, madvise, never), or "unknown" (no Linux sysfs)."""
    try:
        text = THP_MODE.read_text()
    except OSError:
        return "unknown"
    return text[text.find("[") + 1:text.find("]")] if "[" in text else "unknown"


def release_memory(device: str = "cpu") -> None:
    """Hand freed memory back to the system after dropping models: collect the cycles that hold them (a compiled
    model and its runtime), trim glibc's heap (freed tensors that glibc keeps for reuse; about 0.9 GB after the
    default pair on a CPU), and empty CUDA's cache."""
    gc.collect()
    trim_heap()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def trim_heap() -> None:
    """Hand the free pages inside glibc's heap back to the system (malloc_trim; glibc returns only the heap's top on
    its own). Blocks under map_large_allocations' bound that a pass frees stay resident otherwise: on `make run`'s
    main table (SmolLM2-135M, 2-core Xeon) about 0.1 GB after the warm-up and after every few prompts."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)


MADV_PAGEOUT = 21  # Linux 5.4+


def page_out(tensor: torch.Tensor) -> None:
    """Ask the kernel to reclaim the pages that lie wholly inside a CPU tensor's bytes (madvise MADV_PAGEOUT): where
    it is a view of a mapped weights file, its resident file pages go (read again if the tensor is used); anonymous
    memory without swap stays. Its contents never change. A weight packed or copied into other memory holds its file
    pages until the whole file is unmapped otherwise: SmolLM2-135M's packing stood 0.3 GB above its end state."""
    libc = glibc()
    if libc is None or tensor.device.type != "cpu" or not tensor.is_contiguous():
        return
    page = os.sysconf("SC_PAGE_SIZE")
    start = -(-tensor.data_ptr() // page) * page
    end = (tensor.data_ptr() + tensor.numel() * tensor.element_size()) // page * page
    if end > start:
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_PAGEOUT)


@contextlib.contextmanager
def collecting_new_objects_only():
    """Within the block, the garbage collector passes over every object that existed when it began (gc.freeze): a
    calibration drops candidate after candidate (release_memory), and a full collection over what the loaded target,
    its compiled graphs and the libraries hold (about 700,000 objects) took 0.37 s on a 2-core Xeon, six times per
    `make run`. The garbage there already is collected first (frozen, it would stay until the next full collection,
    which may come late). What the block made is collected as usual; afterwards every object is collectable again."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def off_the_file(model: torch.nn.Module) -> torch.nn.Module:
    """A quantized or packed model's floating-point tensors left as loaded (embeddings, norms) moved into memory of
    their own. Loaded as they are, they are views of the mapped weights file, which then stays mapped with every page
    the quantization or packing read: about 0.5 GB of resident file pages a SmolLM2-135M copy for its 0.11 GB
    embedding."""
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.is_floating_point():
            tensor.data = tensor.data.clone()
    return model


def reset_peak_rss() -> None:
    """Restart the kernel's high-water mark (Linux), e.g. after loading the models."""
    Path("/proc/self/clear_refs").write_text("5")


@dataclass
class Peak:
    """Peak memory of one block: process RSS (MB) and, on CUDA, the peak allocated (MB)."""

    rss_mb: float = math.nan
    cuda_mb: float = math.nan


@contextmanager
def peak_memory(device: str, interval: float = 0.01) -> Iterator[Peak]:
    """Measure the block's peak memory; the Peak is filled in when the block ends.

    RSS is sampled by a background thread every `interval` seconds (the OS keeps only a
    process-lifetime peak); it includes every model loaded so far, not only the method's own. The heap is trimmed
    first (trim_heap), so that blocks freed before the block are not counted as its memory.
    """
    trim_heap()
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
