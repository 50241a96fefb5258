"""Direct calls of compiled graphs: a pass of inputs like ones seen before calls inductor's compiled function itself,
its inputs gathered by one generated function, instead of going through dynamo's frame evaluation.

Every call of a torch.compile'd function runs bytecode that dynamo wrote for it: it gathers the graph's inputs (for
a model whose weights are graph inputs, every parameter and buffer: about 400-600 tensors in SmolLM2-135M) by
attribute lookups, selects the graph by its guards, and wraps the call in dynamo's context managers. On a 2-core
AMD EPYC that took 1.3-1.6 ms of a packed int8 copy's 8.7-11.9 ms step (docs/performance.md, The runtime). Here the
backend is inductor as torch.compile runs it (GraphRecorder: the same settings, the same disk cache), and it keeps,
for each graph it compiles, the source of each input (dynamo's names for them: "L['self'].model._modules[...]",
"L['cache'].layers[0].key_buffer.size()[2]"). After a call through dynamo ran a graph and returned exactly the
graph's two outputs, `bind` gives that graph's direct call to the call's key (call_key: what tells a runtime's
graphs apart, and the global state dynamo guards): the inputs that live on the runtime's model are read once, the
others by a generated function at each call.

What the bytecode does besides the call is not replayed. For transformers' models that is the reset of its output
collector (transformers.utils.output_capturing), which every call leaves as it found it; a graph that returns more
than the values the call returns (a state to store back) is never called directly.
"""

from __future__ import annotations

import inspect

import torch
from torch import _TorchCompileInductorWrapper


class GraphRecorder(_TorchCompileInductorWrapper):
    """torch.compile's inductor backend with `options` (the same compile and disk cache), recording each compiled
    graph's input sources and which graph ran last, with what it returned."""

    def __init__(self, options: dict[str, object]):
        super().__init__(None, options, False)
        self.last: tuple[RecordedGraph, object] | None = None  # the graph called last, and its outputs

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, **kwargs):
        compiled = super().__call__(gm, example_inputs, **kwargs)
        graph = RecordedGraph(compiled, input_sources(gm))

        def call(*args):
            out = compiled(*args)
            self.last = graph, out
            return out

        return call

    def ran(self, out) -> RecordedGraph | None:
        """The graph that ran since the last `forget`, if the call returned its outputs as they are."""
        if self.last is None:
            return None
        graph, returned = self.last
        same = (isinstance(out, tuple) and isinstance(returned, (tuple, list)) and len(out) == len(returned)
                and all(a is b for a, b in zip(out, returned)))
        return graph if same and graph.sources is not None else None

    def forget(self) -> None:
        self.last = None


def input_sources(gm: torch.fx.GraphModule) -> list[str] | None:
    """Dynamo's source of each of the graph's inputs, as Python over the frame's locals L and globals G (None where
    dynamo left one unnamed)."""
    names = []
    for node in gm.graph.find_nodes(op="placeholder"):
        source = getattr(node, "_dynamo_source", None)
        if source is None:
            return None
        names.append(source.name if isinstance(source.name, str) else source.name())
    return names


class RecordedGraph:
    """A compiled graph (inductor's function of its flat inputs) and the source of each input."""

    def __init__(self, compiled, sources: list[str] | None):
        self.compiled, self.sources = compiled, sources
        self.calls: dict[int, DirectCall | None] = {}  # by input count: one per graph, whatever the key

    def bind(self, run, owner: object, inputs: tuple) -> DirectCall | None:
        """The direct call of this graph for `run(*inputs)`, a method of `owner` (L['self']), or None where a source
        does not evaluate. Made once: every key this graph serves (a window, a width, a capacity) shares it."""
        if len(inputs) not in self.calls:
            self.calls[len(inputs)] = self.direct_call(run, owner, inputs)
        return self.calls[len(inputs)]

    def direct_call(self, run, owner: object, inputs: tuple) -> DirectCall | None:
        params = list(inspect.signature(run).parameters)[1: 1 + len(inputs)]  # after self
        frame = {"L": {"self": owner, **dict(zip(params, inputs))}, "G": run.__globals__}
        per_call = tuple(f"L['{name}']" for name in params)
        gathered, held = [], []
        try:
            for source in self.sources:
                if source.startswith(per_call):
                    gathered.append(source)
                    continue
                held.append(eval(source, frame))  # dynamo's own source names
                gathered.append(f"S[{len(held) - 1}]")
            gather = eval(f"lambda L, S: [{', '.join(gathered)}]")
            gather(frame["L"], held)  # every per-call source evaluates
        except Exception:  # noqa: BLE001 (a source of another form: the call goes through dynamo)
            return None
        return DirectCall(self.compiled, gather, held, params)


class DirectCall:
    """One graph called with its inputs gathered from a call's arguments and the tensors held for it."""

    def __init__(self, compiled, gather, held: list, params: list[str]):
        self.compiled, self.gather, self.held, self.params = compiled, gather, held, params

    def __call__(self, inputs: tuple) -> tuple:
        return tuple(self.compiled(*self.gather(dict(zip(self.params, inputs)), self.held)))


def call_key(inputs: tuple) -> tuple:
    """What tells a compiled runtime's graphs apart in a call: each tensor's shape, strides, dtype, device and kind
    (inference or not, requiring grad or not; a mask dictionary's, each), a cache's capacity and its buffers', and
    the global state dynamo guards (grad mode, torch's thread count, the default dtype, autocast...)."""
    return global_state(), torch.is_inference_mode_enabled(), *(described(x) for x in inputs)


def global_state() -> object:
    """Dynamo's own record of the global state its graphs are guarded on (a few microseconds)."""
    guard = getattr(torch._C._dynamo.guards, "GlobalStateGuard", None)
    if guard is None:  # (another torch: the state this module knows of)
        return torch.is_grad_enabled(), torch.get_num_threads(), torch.get_default_dtype()
    return guard().__getstate__()


def described(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return x.shape, x.stride(), x.dtype, x.device, x.is_inference(), x.requires_grad
    if isinstance(x, dict):
        return tuple((name, described(value)) for name, value in x.items())
    layers = getattr(x, "layers", None)
    if layers:
        first = layers[0]
        buffer = getattr(first, "key_buffer", None)
        return getattr(first, "capacity", None), None if buffer is None else described(buffer)
    return x
