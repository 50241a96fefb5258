"""The config's schema: one dataclass per config group, registered with Hydra's ConfigStore.

This file says what is allowed, once: the keys of every group, the choices of every multiple-choice
key (an Enum, or the library's own table for dtypes and quantizations) and the bounds of every
integer. The YAML files in conf/ hold the values and what they mean. Hydra composes the YAML onto
these dataclasses, so a misspelled key fails at composition; `experiments.settings.validate` then
checks every value against the field metadata below and raises ConfigError naming the key and the
accepted values, before any model loads.

Values whose errors must name the choices are annotated `Any` for OmegaConf (its own type errors
list no choices); the constraint lives in the field's metadata, read by `settings.check_node`.
A new group (e.g. a tree block) is a dataclass here, a field of RunConfig and a folder in conf/.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from specdec.models import DTYPES, QUANTIZATIONS
from specdec.tree_drafters import CHILDREN


class Method(str, Enum):
    """What runs next to the target-only baseline (which always runs: it is the speedup's denominator)."""

    SPECULATIVE = "speculative"
    NAIVE = "naive"  # the article's draft-then-score
    AUTOREGRESSIVE = "autoregressive"  # the target-only baseline alone
    ALL = "all"


class DraftKind(str, Enum):
    MODEL = "model"  # a second language model with the target's tokenizer
    QUANTIZED_COPY = "quantized_copy"  # the target's own weights, quantized
    TRUNCATED_COPY = "truncated_copy"  # the target's first n_layers blocks with its embeddings and head
    NGRAM = "ngram"  # prompt lookup: no draft model
    CALIBRATED = "calibrated"  # the fastest of `candidates` on this machine, measured at the start of the run


class AppliesTo(str, Enum):
    TARGET = "target"
    DRAFT = "draft"
    BOTH = "both"


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
AUTO = "auto"  # k: auto, the draft length chosen each round by specdec.cost.CostModel


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
class DraftConfig:
    """One dataclass for every kind; DRAFT_NEEDS says which keys each kind requires."""

    kind: Any = choice(DraftKind)
    name: Any = None
    gated: bool = False
    quantization: Any = choice(QUANTIZATIONS, default=None, optional=True)
    compute_dtype: Any = choice(DTYPE_CHOICES, default=None, optional=True)
    n_layers: Any = integer(1, default=None, optional=True)
    min_ngram: Any = integer(1, default=None, optional=True)
    max_ngram: Any = integer("min_ngram", default=None, optional=True)
    candidates: Any = None  # calibrated: names from specdec.calibration.CANDIDATES, checked by experiments.pair
    fused_4bit: bool = True  # false: bitsandbytes 4-bit drafts take the non-fused CPU path (force_unfused_4bit)
    reads_target_cache: bool = True  # a copy of the target drafts from the target's KV cache (ModelDrafter)


DRAFT_NEEDS: dict[DraftKind, tuple[str, ...]] = {
    DraftKind.MODEL: ("name",),
    DraftKind.QUANTIZED_COPY: ("quantization",),
    DraftKind.TRUNCATED_COPY: ("n_layers",),
    DraftKind.NGRAM: ("min_ngram", "max_ngram"),
    DraftKind.CALIBRATED: ("candidates", "min_ngram", "max_ngram"),
}


@dataclass
class ModelPairConfig:
    name: str = MISSING
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    device: Any = MISSING
    dtype: Any = choice(DTYPE_CHOICES)
    k: Any = integer(1, default=4, also=(AUTO,))  # the pair's default k (conf/config.yaml: k: ${model.k})
    k_max: Any = integer(1, default=8)


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
    tags: Any = field(default_factory=list)
    dir: Any = None


class TreeKind(str, Enum):
    """What the speculative method verifies each pass: a chain of k tokens, or a token tree (specdec.tree)."""

    NONE = "none"  # a chain: speculative_generate with k (an int or auto)
    NGRAM = "ngram"  # a trie of prompt-lookup matches (NGramTreeDrafter): no draft model
    MODEL = "model"  # the pair's draft model branching at the first depths (ModelTreeDrafter)
    HYBRID = "hybrid"  # an n-gram trie and a model tree under one root (HybridTreeDrafter)


@dataclass
class TreeConfig:
    """One dataclass for every kind; TREE_NEEDS says which keys each kind requires."""

    kind: Any = choice(TreeKind)
    depth: Any = integer(1, default=None, optional=True)
    nodes: Any = integer(1, default=None, optional=True)
    max_nodes: Any = integer(1, default=64)
    max_ngram: Any = integer(1, default=None, optional=True)
    min_ngram: Any = integer(1, default=None, optional=True)
    matches: Any = integer(1, default=None, optional=True)
    branches: Any = None  # a non-empty list of integers >= 1: checked by settings.check_tree
    children: Any = choice(tuple(CHILDREN), default=None, optional=True)


NGRAM_TREE_KEYS = ("depth", "nodes", "max_ngram", "min_ngram", "matches")
MODEL_TREE_KEYS = ("depth", "nodes", "branches", "children")
TREE_NEEDS: dict[TreeKind, tuple[str, ...]] = {
    TreeKind.NONE: (),
    TreeKind.NGRAM: NGRAM_TREE_KEYS,
    TreeKind.MODEL: MODEL_TREE_KEYS,
    TreeKind.HYBRID: NGRAM_TREE_KEYS + ("branches", "children"),
}
TREE_NEEDS_DRAFT_MODEL = (TreeKind.MODEL, TreeKind.HYBRID)


@dataclass
class RunConfig:
    """conf/config.yaml: the groups, then the run's own keys."""

    model: ModelPairConfig = field(default_factory=ModelPairConfig)
    quantization: QuantizationConfig = field(default_factory=QuantizationConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    tree: TreeConfig = field(default_factory=TreeConfig)
    method: Any = choice(Method)
    k: Any = integer(1, also=(AUTO,))
    k_max: Any = integer(1)
    temperature: Any = MISSING  # checked by specdec.sampling.Sampling
    top_k: Any = integer(0)
    top_p: Any = MISSING  # checked by specdec.sampling.Sampling
    max_new_tokens: Any = integer(1)
    warmup_tokens: Any = integer(1)
    seed: Any = integer(0)
    device: Any = MISSING  # cpu, cuda or cuda:N: checked by settings.check_device
    dtype: Any = choice(DTYPE_CHOICES)
    threads: Any = integer(1, default=None, optional=True, also=(AUTO,))  # auto: specdec.timing.choose_threads


ConfigStore.instance().store(name="run_schema", node=RunConfig)
