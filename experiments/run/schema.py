"""The config's schema: one dataclass per config group, registered with Hydra's ConfigStore.

This file says what is allowed, once: the keys of every group, the choices of every multiple-choice
key (an Enum, or the library's own table for dtypes and quantizations) and the bounds of every
integer. The YAML files in conf/ hold the values and what they mean. Hydra composes the YAML onto
these dataclasses, so a misspelled key fails at composition; `experiments.run.settings.validate` then
checks every value against the field metadata below and raises ConfigError naming the key and the
accepted values, before any model loads.

Values whose errors must name the choices are annotated `Any` for OmegaConf (its own type errors
list no choices); the constraint lives in the field's metadata, read by `settings.check_node`.

Drafters and trees are not described here: their nodes (model.draft, tree) name a class with `_target_`
and hold its constructor's arguments (conf/draft/, conf/tree/), and the constructor validates them
(hydra.utils.instantiate builds them; experiments.run.pair). A new drafter is one class and one YAML file.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from specdec.runtime.models import DTYPES, QUANTIZATIONS


class Method(str, Enum):
    """What runs next to the target-only baseline (which always runs: it is the speedup's denominator)."""

    SPECULATIVE = "speculative"
    NAIVE = "naive"  # the article's draft-then-score
    AUTOREGRESSIVE = "autoregressive"  # the target-only baseline alone
    HF = "hf"  # Hugging Face generate (plain, assisted or prompt lookup: conf/hf/)
    ALL = "all"  # speculative and naive


class AppliesTo(str, Enum):
    TARGET = "target"
    DRAFT = "draft"
    BOTH = "both"


class RuntimeKind(str, Enum):
    EAGER = "eager"  # PyTorch as loaded
    COMPILED = "compiled"  # torch.compile over a preallocated cache (specdec.runtime.compiled)
    AUTO = "auto"  # compiled where it measured faster and the compile pays back, else eager (experiments.run.runtime)


class DatasetSource(str, Enum):
    JSON = "json"  # a local JSON Lines file
    HUB = "hub"  # a Hugging Face Hub dataset, streamed


class LoggerKind(str, Enum):
    WANDB = "wandb"
    NONE = "none"


class WandbMode(str, Enum):
    OFFLINE = "offline"
    ONLINE = "online"


DTYPE_CHOICES = tuple(DTYPES)  # the library's table: float32, bfloat16, float16
AUTO = "auto"  # k: auto, the draft length chosen each round by specdec.choose.cost.CostModel


def values(choices: type[Enum] | tuple[str, ...]) -> tuple[str, ...]:
    return tuple(c.value for c in choices) if isinstance(choices, type) else tuple(choices)


def choice(choices: type[Enum] | tuple[str, ...], default: Any = MISSING, optional: bool = False) -> Any:
    """A key that takes one of `choices` (None too when optional)."""
    return field(default=default, metadata={"choices": values(choices), "optional": optional})


def integer(minimum: int | str, default: Any = MISSING, optional: bool = False, also: tuple[str, ...] = ()) -> Any:
    """An integer >= minimum (a number, or the name of a sibling key); `also` lists accepted strings."""
    return field(default=default, metadata={"minimum": minimum, "optional": optional, "also": also})


@dataclass
class QuantizationConfig:
    mode: Any = choice(QUANTIZATIONS)
    applies_to: Any = choice(AppliesTo)
    compute_dtype: Any = choice(DTYPE_CHOICES)


@dataclass
class TargetConfig:
    name: str = MISSING
    gated: bool = False


@dataclass
class ModelPairConfig:
    name: str = MISSING
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: Any = MISSING  # a drafter's _target_ node (conf/draft/), or {candidates: {name: node}} to calibrate
    draft_name: Any = None  # a second draft model's hub id or folder (conf/draft/model.yaml reads it)
    device: Any = MISSING
    dtype: Any = choice(DTYPE_CHOICES)
    k: Any = integer(1, default=4, also=(AUTO,))  # the pair's default k (conf/config.yaml: k: ${model.k})
    k_max: Any = integer(1, default=8)
    reads_target_cache: bool = True  # copies of the target draft from its KV cache (ModelDrafter, model trees)
    fused_4bit: bool = True  # false: 4-bit copies take bitsandbytes' non-fused CPU path (force_unfused_4bit)


@dataclass
class RuntimeConfig:
    """How the models' forwards run (conf/runtime/)."""

    name: Any = choice(RuntimeKind)
    widths: Any = field(default_factory=lambda: [1, 2, 4, 8])  # compiled pass widths (tokens per row)
    capacity: Any = integer(16, default=512)  # cache slots per row, preallocated
    autotune: bool = False  # inductor max_autotune: its C++ GEMM template against ATen's kernels
    packed_rows: Any = None  # [first, last]: passes of these many rows run the linears on the packed kernel
    cpp_wrapper: bool = False  # a CPU graph's calls in compiled C++, not Python
    cuda_graphs: bool = True  # on a GPU, a pass seen before on a cache replays as a CUDA graph
    step_graph: Any = choice(("auto", "always", "never"), default="never")  # a 1-token graph next to `widths`
    dynamic_width: bool = False  # on a CPU, one graph per row count for every width up to the widest, unpadded
    window: Any = integer(0, default=64)  # attention reads the slots in use rounded up to this many (0: all)
    drafts: bool = False  # draft models run on it too (false: they stay eager)
    heads: bool = True  # trained draft heads' forwards run on it too (specdec.draft.head_runtime)


@dataclass
class DatasetConfig:
    name: Any = MISSING
    source: Any = choice(DatasetSource)
    path: Any = MISSING
    template: Any = MISSING
    split: str = "train"
    subset: Any = None
    revision: Any = None
    id_field: Any = None
    category_field: Any = None
    categories: Any = None
    n_per_category: Any = integer(1, default=None, optional=True)
    n_prompts: Any = integer(1, default=None, optional=True)
    chat: bool = True


@dataclass
class LoggerConfig:
    kind: Any = choice(LoggerKind)
    mode: Any = choice(WandbMode, default=None, optional=True)
    project: Any = None
    entity: Any = None
    group: Any = None
    job_type: Any = None
    tags: Any = field(default_factory=list)
    dir: Any = None


@dataclass
class HfConfig:
    """method=hf: Hugging Face generate on the pair, next to our loops (conf/hf/)."""

    assistant: bool = False  # assisted generation with the pair's draft model
    num_assistant_tokens: Any = integer(1, default=None, optional=True)  # draft tokens per round; null: HF's
    schedule: Any = None  # num_assistant_tokens_schedule: constant, heuristic, ...; null: HF's default
    confidence_threshold: Any = None  # assistant_confidence_threshold; null: HF's default
    prompt_lookup: Any = integer(1, default=None, optional=True)  # prompt_lookup_num_tokens; null: no lookup


@dataclass
class RunConfig:
    """conf/config.yaml: the groups, then the run's own keys."""

    model: ModelPairConfig = field(default_factory=ModelPairConfig)
    quantization: QuantizationConfig = field(default_factory=QuantizationConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    tree: Any = None  # a tree drafter's _target_ node (conf/tree/); empty: chains
    verify: Any = None  # the acceptance rule, a _target_ node (conf/verify/): token, block (chains), traversal (trees)
    hf: HfConfig = field(default_factory=HfConfig)
    bench: Any = None  # experiments.bench only: its contenders and schedule (conf/bench/)
    method: Any = choice(Method)
    k: Any = integer(1, also=(AUTO,))
    k_max: Any = integer(1)
    max_nodes: Any = integer(1, default=64)  # tree nodes one target pass verifies at most
    temperature: Any = MISSING  # checked by specdec.sampling.Sampling
    top_k: Any = integer(0)
    top_p: Any = MISSING  # checked by specdec.sampling.Sampling
    max_new_tokens: Any = integer(1)
    batch_size: Any = integer(1, default=1)  # prompts decoded together (specdec.state); 1: one at a time
    warmup_tokens: Any = integer(1)
    seed: Any = integer(0)
    device: Any = MISSING  # cpu, cuda or cuda:N: checked by settings.check_device
    dtype: Any = choice(DTYPE_CHOICES)
    threads: Any = integer(1, default=None, optional=True, also=(AUTO,))  # auto: specdec.runtime.probes.choose_threads
    skip_finished: bool = True  # a sweep job whose run folder holds done.json is skipped (experiments.run.jobs)


ConfigStore.instance().store(name="run_schema", node=RunConfig)
