"""Packed linears: the verification pass's matrix products on a small-row kernel of our own (kernels/packed_mm.cpp).

Inductor's C++ GEMM reads a layer's weights once for a pass of 1-4 rows, but from 5 rows on its kernel runs at a third
of the CPU's arithmetic rate, so a pass of 5-9 tokens costs 1.6-3.6 steps (docs/performance.md). The packed kernel
streams each weight panel once, prefetching ahead of itself, and keeps up to 8 rows of outputs in registers, so its
cost stays near one read of the weights up to 8 rows (1.03 one-row passes at 5 rows, 1.13 at 8 on a 2-core Xeon).
`pack_linears` swaps a model's float32 or bfloat16 linears for PackedLinear, which calls it for passes of `rows`
(first, last) rows, and for every pass where it holds its weight as panels only. A bfloat16 linear's panels stay
bfloat16 (half the bytes) and its rows are summed in float32, then rounded to bfloat16. The kernel is
batch-invariant: a row's output does not depend on how many rows the pass has (kernels/packed_mm.cpp). A packed
float32 model holds its linear weights once, as panels, and its prompts run on the kernel too: it keeps each panel in
the L2 cache while tiles of 8 rows pass over it, near the CPU's arithmetic rate (SmolLM2-135M's layer on a 2-core
EPYC: 2.3-3.6 ms for 64 rows against 3.8-5.5 as a batch of products with the panels in place, 74-96 against 81-111
for 2048 rows with F.linear on the weight laid back out; docs/performance.md). An input embedding tied to the output
layer reads its rows out of that layer's panels (PanelEmbedding); bfloat16 linears and a draft head's keep their
weights, which their passes outside `rows` use (F.linear; pack_linears). `packed_int8_copy` makes a weight-only int8
copy instead (PackedInt8Linear: int8 panels and a scale per output, nothing else kept), a draft close to its target
at a quarter of the bytes. The kernel needs AVX-512 and a C++ compiler; it is built once per machine into the specdec
cache folder (about 7 s: the source includes only the ATen headers it uses).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from .machine import off_the_file, page_out
from .timing import interleaved_medians

log = logging.getLogger(__name__)
SOURCE = Path(__file__).parent / "kernels" / "packed_mm.cpp"
PANEL = 48  # outputs per panel, as kernels/packed_mm.cpp packs them


def unavailable_reason() -> str | None:
    """Why the packed kernel cannot run here (None: it can): it needs a CPU with AVX-512."""
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):
        return f"the packed kernel needs AVX-512 (this CPU: {capability})"
    return None


def ninja_on_path() -> None:
    """torch's cpp_extension runs `ninja` from PATH: where none is there, the ninja wheel's (a dependency of
    specdec; a venv's bin folder is not on PATH unless the venv is activated)."""
    if shutil.which("ninja") is None:
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def build_library(name: str, source: Path, flags: tuple[str, ...] = ()) -> None:
    """Build (once per machine, into the specdec cache folder) and load a kernel library of ours, which registers
    its torch.ops.specdec operators (flags: further compiler flags); a RuntimeError where the CPU cannot run it."""
    from torch.utils.cpp_extension import load

    from .offline import cache_dir

    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    ninja_on_path()
    # a folder per library: torch writes its build.ninja into the folder, and ninja, which drops from its log the
    # outputs a build.ninja no longer names, would rebuild the other library at its next load (8 s)
    build = cache_dir() / "kernels" / name
    build.mkdir(parents=True, exist_ok=True)
    cflags = ["-O3", "-mavx512f", "-mfma", "-fopenmp", *flags]  # OpenMP: at::parallel_for
    load(name=name, sources=[str(source)], build_directory=str(build), is_python_module=False, extra_cflags=cflags,
         extra_ldflags=["-fopenmp"])


@functools.cache
def load_kernel() -> None:
    """Build (once per machine, then load) the kernel library, which registers torch.ops.specdec.pack/packed_mm."""
    build_library("specdec_packed_mm", SOURCE)

    @torch.library.register_fake("specdec::packed_mm")
    def _(input, packed, n):  # shapes for the compiler
        return input.new_empty(input.shape[0], n)

    @torch.library.register_fake("specdec::packed_int8_mm")
    def _(input, packed, scales, n):
        return input.new_empty(input.shape[0], n)


class PackedLinear(torch.nn.Module):
    """A linear whose passes of `rows` (first, last) rows run on the packed kernel, and every pass where it keeps no
    weight; the others use F.linear on the kept weight (keep_weight: the same parameter, ties kept)."""

    def __init__(self, linear: torch.nn.Linear, rows: tuple[int, int], keep_weight: bool = False):
        super().__init__()
        load_kernel()
        self.bias, self.rows = linear.bias, rows
        self.weight = linear.weight if keep_weight else None
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.specdec.pack(linear.weight.detach()), persistent=False)

    def dense_weight(self) -> torch.Tensor:
        """The (out, in) weight: the kept parameter, or the panels laid back out (the same bits)."""
        return self.weight if self.weight is not None else unpanel(self.packed, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel() // self.in_features  # rows of this pass (static under torch.compile)
        if self.weight is not None and not self.rows[0] <= n <= self.rows[1]:
            return F.linear(x, self.weight, self.bias)
        return on_rows(x, self.bias, lambda rows: torch.ops.specdec.packed_mm(rows.float(), self.packed,
                                                                              self.out_features).to(x.dtype))

    def unpacked(self) -> torch.nn.Linear:
        """An nn.Linear with this one's weight (the kept parameter, or a new one from the panels) and bias."""
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=False, device="meta")
        dense = self.dense_weight()
        kept = isinstance(dense, torch.nn.Parameter)
        linear.weight = dense if kept else torch.nn.Parameter(dense, requires_grad=False)
        linear.bias = self.bias
        return linear


def unpanel(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The (n, K) weight whose panels (P, K, PANEL) pack() made: each panel's columns back as rows."""
    return packed.transpose(1, 2).reshape(-1, packed.shape[1])[:n]


class PanelEmbedding(torch.nn.Module):
    """An input embedding tied to a packed output layer, read out of that layer's panels: token n's row is column
    n % PANEL of panel n // PANEL (pack's layout), so that the tied weight is held once. The same rows, bit for bit,
    as the embedding it replaces, times its embed_scale where it has one (Gemma's scaled embeddings)."""

    def __init__(self, embedding: torch.nn.Embedding, output: PackedLinear):
        super().__init__()
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.padding_idx = embedding.padding_idx
        self.register_buffer("packed", output.packed, persistent=False)  # the output layer's panels themselves
        if getattr(embedding, "embed_scale", None) is not None:
            self.register_buffer("embed_scale", embedding.embed_scale, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        panel = self.packed.shape[-1]
        rows = self.packed[input_ids // panel, :, input_ids % panel]  # (..., d)
        scale = getattr(self, "embed_scale", None)
        return rows if scale is None else rows * scale.to(rows.dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.packed.dtype

    @property
    def weight(self) -> torch.Tensor:
        """The (V, d) weight laid back out of the panels (new memory: for a copy, not for a pass)."""
        return unpanel(self.packed, self.num_embeddings)


class PackedInt8Linear(torch.nn.Module):
    """A linear with int8 weights, one float32 scale per output (symmetric, weight-only: activations stay float32),
    on the packed kernel for passes of any number of rows: a quarter of the float32 bytes to read per step. Keeps no
    float32 weight (a tied one stays with the embedding). Built from an nn.Linear or a PackedLinear, a block of
    outputs at a time (weight_blocks): each output's scale and rounding are its own, so the panels are those of the
    whole weight quantized at once, without its float32 temporaries (a 49k-token output layer's: about 0.4 GB)."""

    def __init__(self, linear: torch.nn.Linear | PackedLinear):
        super().__init__()
        load_kernel()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        packed, scales = zip(*(torch.ops.specdec.pack_int8(block) for block in weight_blocks(linear)))
        self.register_buffer("packed", torch.cat(packed))
        self.register_buffer("scales", torch.cat(scales))
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return on_rows(x, self.bias, lambda rows: torch.ops.specdec.packed_int8_mm(rows, self.packed, self.scales,
                                                                                   self.out_features))


def weight_blocks(linear: torch.nn.Linear | PackedLinear, panels: int = 64) -> Iterator[torch.Tensor]:
    """A linear's (out, in) float32 weight by blocks of `panels` x PANEL outputs, each new memory: a PackedLinear's
    laid back out of its panels a block at a time, never the whole weight at once."""
    if isinstance(linear, PackedLinear) and linear.weight is None:
        for first in range(0, linear.packed.shape[0], panels):
            block = linear.packed[first : first + panels]
            yield unpanel(block, min(block.shape[0] * PANEL, linear.out_features - first * PANEL))
    else:
        yield from linear.weight.detach().float().split(panels * PANEL)


def on_rows(x: torch.Tensor, bias: torch.Tensor | None, product) -> torch.Tensor:
    """A linear's output (..., N) for x (..., K): product of x's rows as one (n, K) matrix (the packed kernel's
    input), back in x's shape, plus the bias."""
    rows = x.reshape(x.numel() // x.shape[-1], x.shape[-1])
    y = product(rows)
    y = y.view(*x.shape[:-1], y.shape[-1])
    return y if bias is None else y + bias


def children_where(model: torch.nn.Module, keep) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """(parent, attribute name, child) of every submodule for which keep(child) holds."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if keep(child)]


def cpu_linears(model: torch.nn.Module, dtypes: tuple[torch.dtype, ...] = (torch.float32,)
                ) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:  # fmt: skip
    """(parent, attribute name, child) of every plain nn.Linear on the CPU whose weight has one of `dtypes`."""
    return children_where(model, lambda child: type(child) is torch.nn.Linear
                          and child.weight.dtype in dtypes and child.weight.device.type == "cpu")


def pack_linears(model: torch.nn.Module, rows: tuple[int, int], keep_weights: bool = False) -> int:
    """Swap every float32 or bfloat16 CPU nn.Linear of `model` for a PackedLinear (in place), every bfloat16 one
    keeping its weight (a bfloat16 prompt on the panels ran 1.07-1.50x slower than on the weights, 40-2048 tokens;
    float32 0.88-1.03x), and every one's with keep_weights (a draft head reads them); returns how many. A float32
    output layer tied to the input embedding keeps no weight either: the embedding reads its rows out of the
    panels (PanelEmbedding), so the tied weight is held once (0.11 GB less for SmolLM2-135M, 0.67 GB for Gemma 3
    270M's vocabulary of 262k)."""
    if rows[0] < 1 or rows[1] < rows[0]:
        raise ValueError(f"rows must be (first, last) with 1 <= first <= last, got {rows}")
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embedding = model.get_input_embeddings() if output is not None else None
    tied = embedding is not None and getattr(embedding, "weight", None) is getattr(output, "weight", False)
    swaps = cpu_linears(model, (torch.float32, torch.bfloat16))
    for parent, name, child in swaps:
        keep = keep_weights or child.weight.dtype != torch.float32
        setattr(parent, name, PackedLinear(child, rows, keep_weight=keep))
        if not keep:
            page_out(child.weight)  # its pages of the weights file, now that the panels hold it
    packed_output = model.get_output_embeddings() if output is not None else None
    if tied and isinstance(packed_output, PackedLinear) and packed_output.weight is None:
        model.set_input_embeddings(PanelEmbedding(embedding, packed_output))
    return len(swaps)


def packed_int8_copy(model: torch.nn.Module) -> int:
    """Swap every float32 CPU nn.Linear of `model` (the tied output layer included) for a PackedInt8Linear, in
    place: a weight-only int8 copy of a float32 model (specdec.runtime.models, quantization='packed_int8'). Returns
    how many. Needs the packed kernel (AVX-512)."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"quantization='packed_int8' runs on the packed kernel: {reason}")
    swaps = cpu_linears(model)
    for parent, name, child in swaps:
        setattr(parent, name, PackedInt8Linear(child))
    return len(swaps)


def row_cost(model: torch.nn.Module, rows: int, repeats: int = 5) -> float | None:
    """What the model's packed linears cost at `rows` rows over their cost at one row: the median of `repeats`
    interleaved rounds, each calling every packed linear of the model once on random inputs (None: the model has no
    packed linear that takes `rows` rows). On the kernel's target a pass of up to 8 rows costs about one row's
    read of the weights (1.0); where the loads fall behind the arithmetic (a CPU the kernel's prefetch distances
    do not suit), more (docs/performance.md)."""
    linears = [m for m in model.modules() if isinstance(m, PackedLinear) and m.rows[0] <= 1 and rows <= m.rows[1]]
    if not linears:
        return None
    inputs = {(n, m.in_features): torch.randn(n, m.in_features) for n in (1, rows) for m in linears}

    def every_linear(n: int) -> None:
        for m in linears:
            torch.ops.specdec.packed_mm(inputs[n, m.in_features], m.packed, m.out_features)

    jobs = {n: functools.partial(every_linear, n) for n in (1, rows)}
    with torch.inference_mode():
        seconds = interleaved_medians(jobs, repeats, warmup=0)
    return seconds[rows] / seconds[1]


def all_packed(model: torch.nn.Module) -> bool:
    """Whether `model` has packed linears and no nn.Linear besides (so no linear needs frozen weights)."""
    kinds = {type(module) for module in model.modules()}
    return bool(kinds & {PackedLinear, PackedInt8Linear}) and torch.nn.Linear not in kinds


def unpack_linears(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, PackedLinear]]:
    """Give every PackedLinear of `model` back its nn.Linear (in place); returns (parent, name, PackedLinear) of
    each, for repack_linears."""
    swaps = children_where(model, lambda child: isinstance(child, PackedLinear))
    for parent, name, child in swaps:
        setattr(parent, name, child.unpacked())
    return swaps


def repack_linears(swaps: list[tuple[torch.nn.Module, str, PackedLinear]]) -> None:
    """Put back the PackedLinears unpack_linears took out."""
    for parent, name, child in swaps:
        setattr(parent, name, child)


def use_packed_kernel(model: torch.nn.Module, rows: tuple[int, int], keep_weights: bool = False) -> None:
    """Swap the model's float32 and bfloat16 CPU linears for packed ones (pack_linears), or say why not."""
    reason = unavailable_reason() if model.device.type == "cpu" else "the packed kernel runs on a CPU"
    if reason:
        log.warning("%s keeps inductor's linears: %s", type(model).__name__, reason)
        return
    pack_linears(model, rows, keep_weights)
    if not keep_weights:
        off_the_file(model)  # what is left of the weights file (embeddings, norms) into memory of its own: unmapped
    packed = sum(isinstance(module, PackedLinear) for module in model.modules())
    log.info("%s: %d linears on the packed kernel for passes of %d-%d rows", type(model).__name__, packed, *rows)
