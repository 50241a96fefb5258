"""The config's schema: one dataclass per config group, registered with Hydra's ConfigStore (conf/config.yaml's
`run_schema`). Hydra composes the YAML onto it, so OmegaConf refuses a misspelled key, a value of the wrong type or
a choice not in its Enum at composition, naming the key and the choices. What a type cannot say (bounds, keys that
depend on each other, the hardware) is checked once by experiments.run.settings.validate.

Drafters, trees and acceptance rules are `_target_` nodes (conf/draft/, conf/tree/, conf/verify/): their
constructors validate their arguments. A new drafter is one class and one YAML file."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from specdec.runtime.models import DTYPES, QUANTIZATIONS

AUTO = "auto"  # k: auto, the draft length chosen each round by specdec.choose.cost.CostModel; threads: auto


class ConfigChoice(str, Enum):
    """A key's choices. OmegaConf reads a member by its name, so name and value are the same word; a member is
    that string wherever the config is read (str, format, repr, ==, hash)."""

    __str__, __format__, __repr__ = str.__str__, str.__format__, str.__repr__


class Method(ConfigChoice):
    """What runs next to the target-only baseline (which always runs: it is the speedup's denominator)."""

    speculative = "speculative"
    naive = "naive"  # the article's draft-then-score
    autoregressive = "autoregressive"  # the target-only baseline alone
    hf = "hf"  # Hugging Face generate (plain, assisted or prompt lookup: conf/hf/)
    llamacpp = "llamacpp"  # llama.cpp on the target's weights (target-only, draft model or lookup: conf/llamacpp/)
    all = "all"  # speculative and naive


def choices(name: str, *values: str) -> type[ConfigChoice]:
    return ConfigChoice(name, [(value, value) for value in values], module=__name__)


Dtype = choices("Dtype", *DTYPES)  # the library's tables (specdec.runtime.models)
Quantization = choices("Quantization", *QUANTIZATIONS)
AppliesTo = choices("AppliesTo", "target", "draft", "both")
RuntimeName = choices("RuntimeName", "eager", "compiled", "auto")  # conf/runtime/: auto decides per run
StepGraph = choices("StepGraph", "auto", "always", "never")  # specdec.auto.runtime.add_step_graph
DraftCache = choices("DraftCache", "bfloat16", "model")  # specdec.auto.runtime.draft_cache_dtype
DatasetSource = choices("DatasetSource", "json", "hub", "sharegpt")  # JSON Lines file; Hub dataset, streamed; ShareGPT
LoggerKind = choices("LoggerKind", "wandb", "none")
WandbMode = choices("WandbMode", "offline", "online")
IntOrAuto = int | str  # an integer or "auto"


@dataclass
class QuantizationConfig:
    mode: Quantization = MISSING
    applies_to: AppliesTo = MISSING
    compute_dtype: Dtype = MISSING


@dataclass
class TargetConfig:
    name: str = MISSING
    gated: bool = False


@dataclass
class ModelPairConfig:
    name: str = MISSING
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: Any = MISSING  # a drafter's _target_ node (conf/draft/), or {candidates: {name: node}}
    draft_name: str | None = None
    device: str = MISSING
    dtype: Dtype = MISSING
    k: IntOrAuto = 4
    k_max: int = 8
    reads_target_cache: bool = True
    fused_4bit: bool = True


@dataclass
class RuntimeConfig:
    name: RuntimeName = MISSING
    widths: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    capacity: int = 512
    autotune: bool = False
    packed_rows: list[int] | None = None
    cpp_wrapper: bool = False
    cuda_graphs: bool = True
    step_graph: StepGraph = StepGraph.never
    dynamic_width: bool = False
    invariant: bool | None = None
    window: int = 64
    drafts: bool = False
    heads: bool = True
    draft_cache: DraftCache = DraftCache.bfloat16
    fused: bool = True
    direct: bool = True


@dataclass
class DatasetConfig:
    name: str = MISSING
    source: DatasetSource = MISSING
    path: str = MISSING
    template: str = MISSING
    split: str = "train"
    subset: str | None = None
    revision: str | None = None
    id_field: str | None = None
    category_field: str | None = None
    categories: list[str] | None = None
    n_per_category: int | None = None
    n_prompts: int | None = None
    min_chars: int | None = None
    max_chars: int | None = None
    chat: bool = True


@dataclass
class LoggerConfig:
    kind: LoggerKind = MISSING
    mode: WandbMode | None = None
    project: str | None = None
    entity: str | None = None
    group: str | None = None
    job_type: str | None = None
    tags: list[str] = field(default_factory=list)
    dir: str | None = None


@dataclass
class HfConfig:
    assistant: bool = False
    num_assistant_tokens: IntOrAuto | None = None
    schedule: str | None = None
    confidence_threshold: float | None = None
    prompt_lookup: IntOrAuto | None = None


@dataclass
class LlamaCppConfig:  # specdec.llamacpp.LlamaCppOptions checks the values
    weights: str = "f32"
    draft: str | None = None
    lookup: int | None = None
    k: int = 8
    threads: int = 2
    context: int = 8192


@dataclass
class RunConfig:
    model: ModelPairConfig = field(default_factory=ModelPairConfig)
    quantization: QuantizationConfig = field(default_factory=QuantizationConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    tree: Any = None  # a tree drafter's _target_ node (conf/tree/); empty: chains
    verify: Any = None  # the acceptance rule's _target_ node (conf/verify/)
    hf: HfConfig = field(default_factory=HfConfig)
    llamacpp: LlamaCppConfig = field(default_factory=LlamaCppConfig)
    bench: Any = None  # experiments.bench only: its contenders and schedule (conf/bench/)
    method: Method = MISSING
    k: IntOrAuto = MISSING
    k_max: int = MISSING
    max_nodes: int = 64
    temperature: float = MISSING
    top_k: int = MISSING
    top_p: float = MISSING
    max_new_tokens: int = MISSING
    batch_size: int = 1
    warmup_tokens: int = MISSING
    seed: int = MISSING
    device: str = MISSING  # cpu, cuda or cuda:N
    dtype: Dtype = MISSING
    threads: IntOrAuto | None = None
    skip_finished: bool = True
    then: list[str] = field(default_factory=list)  # experiments run next in this process (conf/experiment/ names)


ConfigStore.instance().store(name="run_schema", node=RunConfig)
