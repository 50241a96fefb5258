"""The GEMM probe: what the CPU's matrix kernels make of a verification pass's linear layers, apart from the model.

A pass of M tokens multiplies (M, K) activations by every (K, N) weight. Read once, the weights set a memory bound
(their bytes at the bandwidth of a `sum` over a tensor of their size); the multiply-accumulates (M K N per layer)
set an arithmetic one. The probe times a stack of independent linears of one shape, enough of them that the weights
do not stay in cache, at several row counts M, eager and compiled as the runtime compiles (inductor with frozen
weights; `autotune`: its C++ GEMM template benchmarked against ATen's kernels; `packed`: specdec's packed kernel,
specdec.runtime.packed), and reports ms, ms over the memory
bound and GMAC/s. Where ms grows in proportion to M at a constant GMAC/s, the kernel's arithmetic, not the memory,
sets the cost of a wider pass:

    python scripts/gemm_probe.py --threads 2 --rows 1,2,4,5,8 --modes eager,autotune,packed --out gemm.json
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch

from experiments.records import machine
from specdec.runtime.inductor import allow_graphs, cpu_options, inductor_settings
from specdec.runtime.packed import pack_linears
from specdec.runtime.study import memory_bound_ms
from specdec.runtime.timing import interleaved_medians

MODES = ("eager", "compiled", "autotune", "packed")


class Stack(torch.nn.Module):
    """`layers` independent (K -> N) linears without bias, each applied to the same input."""

    def __init__(self, k: int, n: int, layers: int):
        super().__init__()
        self.linears = torch.nn.ModuleList(torch.nn.Linear(k, n, bias=False) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [linear(x) for linear in self.linears]


def interleaved_ms(f, inputs: list[torch.Tensor], repeats: int) -> list[float]:
    """Median ms of f on each input, timed in `repeats` interleaved rounds (so that the machine's drift hits every
    input alike), after two untimed rounds (a compile per shape, warm caches)."""
    medians = interleaved_medians({i: (lambda x=x: f(x)) for i, x in enumerate(inputs)}, repeats, warmup=2)
    return [1000 * medians[i] for i in range(len(inputs))]


def square_gmac_per_s(size: int = 1024, repeats: int = 5) -> float:
    """GMAC/s of a square fp32 matrix product (ATen's kernel): the arithmetic rate a large GEMM reaches here."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    return size**3 / interleaved_ms(lambda x: x @ b, [a], repeats)[0] / 1e6


def runner(stack: Stack, mode: str):
    """The stack as `mode` runs it: eager, or compiled with the runtime's CPU settings (one graph per input shape)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "eager":
        return stack
    if mode == "packed":
        packed = copy.deepcopy(stack)
        pack_linears(packed, (1, 1 << 30))
        return packed
    torch._dynamo.reset()
    options = cpu_options(autotune=mode == "autotune")
    compiled = torch.compile(stack, dynamic=False, options=options)

    def run(x: torch.Tensor) -> list[torch.Tensor]:
        with inductor_settings(options):  # freezing is read from the global config (see inductor_settings)
            return compiled(x)

    return run


def probe(k: int, n: int, layers: int, rows: list[int], modes: list[str], repeats: int = 15) -> dict:
    """ms, ms over the memory bound and GMAC/s of the stack at each row count, in each mode."""
    if min(rows, default=0) < 1 or min(k, n, layers, repeats) < 1:
        raise ValueError(f"rows, k, n, layers and repeats must be >= 1, got rows={rows}, k={k}, n={n}, "
                         f"layers={layers}, repeats={repeats}")
    allow_graphs(len(rows))  # one graph per row count, none silently eager
    with torch.no_grad():
        stack = Stack(k, n, layers).eval()
        bound, bandwidth = memory_bound_ms(stack)
        out = {"shape": {"k": k, "n": n, "layers": layers}, "bound_ms": bound, "bandwidth_gb_s": bandwidth,
               "square_gmac_per_s": square_gmac_per_s(), "threads": torch.get_num_threads(), "modes": {}}
        for mode in modes:
            times = interleaved_ms(runner(stack, mode), [torch.randn(m, k) for m in rows], repeats)
            out["modes"][mode] = {m: {"ms": ms, "vs_bound": ms / bound, "gmac_per_s": m * k * n * layers / ms / 1e6}
                                  for m, ms in zip(rows, times)}
    return out


def table(result: dict) -> str:
    """A markdown table: one row per mode and row count."""
    s = result["shape"]
    title = (f"{s['layers']} linears of {s['k']} -> {s['n']}, {result['threads']} threads; memory bound "
             f"{result['bound_ms']:.2f} ms ({result['bandwidth_gb_s']:.1f} GB/s); a 1024-square matmul "
             f"{result['square_gmac_per_s']:.1f} GMAC/s")
    lines = [title, "", "| mode | rows | ms | ms / bound | GMAC/s |", "|---|---|---|---|---|"]
    for mode, figures in result["modes"].items():
        lines += [f"| {mode} | {m} | {f['ms']:.2f} | {f['vs_bound']:.2f} | {f['gmac_per_s']:.1f} |"
                  for m, f in figures.items()]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python scripts/gemm_probe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--rows", default="1,2,4,5,8", help="row counts M, comma-separated")
    p.add_argument("--shape", default="576x1536", help="K x N of every linear (default: SmolLM2-135M's up projection)")
    p.add_argument("--layers", type=int, default=40, help="linears in the stack (40 of the default shape: 142 MB)")
    p.add_argument("--modes", default="eager,autotune", help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--repeats", type=int, default=15, help="interleaved timed rounds (median)")
    p.add_argument("--out", type=Path, help="write the figures and the machine record as JSON here")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    k, n = (int(x) for x in args.shape.lower().split("x"))
    result = probe(k, n, args.layers, [int(r) for r in args.rows.split(",")], args.modes.split(","), args.repeats)
    result["machine"] = machine()
    print(table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
