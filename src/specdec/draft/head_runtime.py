"""A draft head's forward on the compiled runtime (specdec.runtime.compiled): one graph per pass width over a slot
cache, the head's output layer W_S inside the graph.

A head drafts one token per forward, so its cost per draft token is a chain of small matrix-vector products plus
the Python of an eager decoder layer; against a compiled target step of about 20-30 ms those few milliseconds are a
large c. Compiled, the forward (fc, the body's layers, W_S) is one graph with frozen weights, as the target's is.

The head's cache holds one position per slot, in order (slot i is position i: it only ever holds the sequence's
true positions and one path drafted after them), so the mask of a query at position p is every slot <= p; padding
queries of a bucket sit after the live ones and their slots are dropped after the pass.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..runtime.compiled import CAPACITY, RUNTIMES, CompiledForward, check_compilable
from ..runtime.inductor import use_inductor_cache
from ..runtime.layers import slot_cache
from ..runtime.masks import model_mask
from ..runtime.packed import use_packed_kernel
from .head import DraftHead

HEAD_WIDTHS = (1, 2, 4)  # buckets: a drafting step reads one position, a catch-up the tokens accepted plus one


class CompiledHead(CompiledForward):
    """DraftHead.forward and W_S under torch.compile over a slot cache (see the module's docstring)."""

    def __init__(self, head: DraftHead, widths: tuple[int, ...] = HEAD_WIDTHS, capacity: int = CAPACITY,
                 autotune: bool = False, cpp_wrapper: bool = False):
        super().__init__(head, widths, capacity, autotune, cpp_wrapper, window=0)  # run builds its own mask, over
        # every slot

    def run(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, cache
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """f^ (B, n, d) and the logits on S (B, n, N) for features (B, n, d), the tokens after them and their
        positions (B, n), written into the cache's slots at those positions."""
        capacity = cache.layers[0].capacity
        seen = torch.arange(capacity, device=positions.device)[None, None, :] <= positions[:, :, None]
        predicted = self.model(features, tokens, positions, cache, model_mask(seen, self.model.body))
        return predicted, self.model.subset_logits(predicted)

    def new_cache(self) -> DynamicCache:
        return slot_cache(self.model.body, self.capacity)

    def forward(self, cache: DynamicCache, length: int, features: torch.Tensor, tokens: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of n positions after the `length` the cache holds, padded to its bucket (eager when wider than
        every bucket, or into an empty cache, which it allocates); the padding's slots are dropped after it."""
        width = tokens.shape[1]
        bucket = self.bucket(width)
        padded = bucket or width
        for layer in cache.layers:
            layer.reserve(length + padded)
        if padded > width:
            features, tokens, positions = padded_inputs(features, tokens, positions, padded)
        inputs = (*(x.clone(memory_format=torch.contiguous_format) for x in (features, tokens, positions)), cache)
        # fresh strides: a graph guards on them, and a slice of the target's features carries its sequence's length
        held = all(layer.held() for layer in cache.layers)
        predicted, logits = (self if bucket is not None and held else self.run)(*inputs)
        for layer in cache.layers:
            layer.keep_slots(length + width)
        return predicted[:, :width], logits[:, :width]

    def build(self) -> None:
        """Compile (or load from inductor's disk cache) every width's graph now, on a cache of its own, so that no
        timed draft pays a first compile."""
        with torch.inference_mode():  # as drafting runs: a graph guards on its inputs' dispatch keys
            self.build_widths(self.new_cache(), self.model.embed.weight)  # the target's embedding: its features' dtype

    def build_widths(self, cache: DynamicCache, like: torch.Tensor) -> None:
        """One dummy pass of each width into `cache` (the first, into the empty cache, runs eager: it allocates)."""
        length, d = 0, like.shape[1]
        for width in (1, *self.widths):
            features = torch.zeros(1, width, d, dtype=like.dtype, device=like.device)
            tokens = torch.zeros(1, width, dtype=torch.long, device=like.device)
            self.forward(cache, length, features, tokens, length + torch.arange(width, device=like.device)[None])
            length += width


def padded_inputs(features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, width: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pass widened to `width` with copies of its last query at the next positions (dropped afterwards)."""
    extra = width - tokens.shape[1]
    after = positions[:, -1:] + torch.arange(1, extra + 1, device=positions.device)
    return (torch.cat([features, features[:, -1:].expand(-1, extra, -1)], dim=1),
            torch.cat([tokens, tokens[:, -1:].expand(-1, extra)], dim=1), torch.cat([positions, after], dim=1))


def compile_head(head: DraftHead, widths: tuple[int, ...] = HEAD_WIDTHS, capacity: int = CAPACITY,
                 autotune: bool = False, packed_rows: tuple[int, int] | None = None, cpp_wrapper: bool = False
                 ) -> CompiledHead:
    """Draft with `head` on the compiled runtime from now on (every HeadDrafter of it: their caches become slot
    caches at their next sequence). Compiles lazily, one graph per width bucket at its first use (or all at once:
    CompiledHead.build). Registered with the models' runtimes (specdec.runtime.compiled.RUNTIMES). packed_rows and
    cpp_wrapper as for a model (specdec.runtime.compiled.compile_model): the head's float32 linears, W_S among them,
    on the packed kernel for passes of that many rows; its graphs' calls in C++."""
    check_compilable(head.body)
    use_inductor_cache()
    if packed_rows is not None:
        use_packed_kernel(head, packed_rows, keep_weights=True)  # the head reads its weights' dtype and device
    RUNTIMES[head] = CompiledHead(head, widths, capacity, autotune, cpp_wrapper)
    return RUNTIMES[head]


def compiled_head(head: DraftHead) -> CompiledHead | None:
    """The head's compiled runtime, or None for the eager one."""
    runtime = RUNTIMES.get(head)
    return runtime if isinstance(runtime, CompiledHead) else None
