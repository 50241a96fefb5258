"""What a number ran on (specdec.runtime.machine), peak memory, and the markdown tables records print with."""

import os
import subprocess
import sys

import pytest
import torch

from specdec.markdown import cell, document, markdown_table, section
from specdec.runtime.machine import (
    HUGE_PAGES,
    collecting_new_objects_only,
    cpu_flags,
    flags_present,
    glibc,
    huge_pages_mode,
    machine,
    machine_label,
    machine_sentence,
    peak_memory,
    use_huge_pages,
)


def test_the_machine_record_names_the_device_the_cpu_flags_and_the_load():
    info = machine("cpu")
    assert info["device"] == "cpu" and info["cpu"]["model"] and info["packages"]["torch"] == torch.__version__
    assert "git_commit" not in info  # the repository's commit is the apps' to add (experiments.records.machine)
    fake = {**info, "cpu": {**info["cpu"], "flags": {"avx2": True, "avx512f": False}}, "load_average": [2.5, 1, 1]}
    assert flags_present(fake) == "avx2" and machine_label(fake).endswith("; avx2")
    assert cpu_flags(fake) == ["avx2"]
    assert cpu_flags({"cpu": {"flags": "unknown (no /proc/cpuinfo)"}}) == []
    assert machine_sentence(fake).startswith(f"Machine: {info['device_name']}; CPU flags: avx2")
    assert "load average 2.5" in machine_sentence(fake)


def test_peak_memory_covers_what_the_block_allocates():
    with peak_memory("cpu") as peak:
        block = torch.ones(64 * 2**20 // 4)  # 64 MB
    assert peak.rss_mb >= block.numel() * 4 / 2**20 and peak.cuda_mb != peak.cuda_mb  # NaN off CUDA


RETAINED = """
import sys, psutil, torch
from specdec.runtime.machine import map_large_allocations
if sys.argv[1] == "mapped":
    map_large_allocations()
big = torch.ones(4 << 20)
del big  # a 16 MB block freed: glibc's own bound for blocks of their own rises to it
before = psutil.Process().memory_info().rss
blocks = [torch.ones(1 << 19) for _ in range(100)]  # 100 blocks of 2 MB
pin = torch.ones(1 << 19)  # one more, kept: on the heap, above them
del blocks
print((psutil.Process().memory_info().rss - before) / 2**20)
"""


@pytest.mark.skipif(glibc() is None, reason="glibc's malloc only (Linux)")
def test_freed_large_blocks_go_back_to_the_system_once_mapped_apart():
    """After a large block is freed, glibc keeps later blocks below its size on its heap, where 200 MB freed under a
    small live block stay with the process; with map_large_allocations (load_model calls it) they are returned."""
    retained = {how: float(subprocess.run([sys.executable, "-c", RETAINED, how], capture_output=True, text=True,
                                          check=True).stdout) for how in ("glibc", "mapped")}  # fmt: skip
    assert retained["glibc"] > 150 and retained["mapped"] < 20, retained


def test_markdown_cells_and_tables():
    assert (cell(float("nan")), cell(None), cell(0.5, "{:.1f}"), cell(3)) == ("-", "-", "0.5", "3")
    assert markdown_table(["x", "y"], [["a", 0.5], ["b", None]]).splitlines() == ["| x | y |", "|---|---|",
                                                                                  "| a | 0.500 |", "| b | - |"]


def test_markdown_documents_are_sections_of_a_sentence_and_a_table():
    lines = section("Two rows:", ["x"], [[1.0], [2.0]], "{:.1f}") + section(None, ["y"], [["z"]])
    assert document(lines) == "Two rows:\n\n| x |\n|---|\n| 1.0 |\n| 2.0 |\n\n| y |\n|---|\n| z |\n"


ON_HUGE_PAGES = """
import torch
block = torch.ones(16 << 20)  # 64 MB, written: its pages are in memory
print(sum(int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages")))
"""


def test_use_huge_pages_asks_torch_for_them_and_keeps_a_users_choice(monkeypatch):
    monkeypatch.delenv(HUGE_PAGES, raising=False)
    use_huge_pages()
    assert os.environ[HUGE_PAGES] == "1"
    monkeypatch.setenv(HUGE_PAGES, "0")
    use_huge_pages()
    assert os.environ[HUGE_PAGES] == "0"


@pytest.mark.skipif(huge_pages_mode() not in ("madvise", "always"), reason="the kernel gives no huge pages here")
def test_torch_puts_a_large_tensor_on_huge_pages_when_asked():
    """What use_huge_pages (load_model calls it) relies on: with the variable set, a fresh process's 64 MB tensor
    lies (at least half of it) on 2 MB pages; in the kernel's madvise mode, with it off, none of its pages are huge."""
    sides = ("1", "0") if huge_pages_mode() == "madvise" else ("1",)  # "always" gives huge pages to every process
    huge_kb = {side: int(subprocess.run([sys.executable, "-c", ON_HUGE_PAGES], capture_output=True, text=True,
                                        check=True, env={**os.environ, HUGE_PAGES: side}).stdout)
               for side in sides}  # fmt: skip
    assert huge_kb["1"] >= 32 * 1024, huge_kb
    assert huge_kb.get("0", 0) < 8 * 1024, huge_kb


class Node:
    def __init__(self):
        self.cycle = self  # garbage only a collection frees


def test_collections_inside_the_block_pass_over_older_objects():
    """gc.freeze for the block: an older garbage cycle survives a collection made inside it, a new one does not, and
    after the block the old one is collected."""
    import gc
    import weakref

    old = Node()
    old_ref = weakref.ref(old)
    with collecting_new_objects_only():
        new = Node()
        new_ref = weakref.ref(new)
        del old, new
        gc.collect()
        assert new_ref() is None and old_ref() is not None
    gc.collect()
    assert old_ref() is None
