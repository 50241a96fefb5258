"""What the schema (experiments/run/schema.py) cannot say, checked once per run before any model loads: integer
bounds, keys that depend on each other, the hardware asked for, and the `_target_` nodes' arguments; then the run's
settings resolved once into a typed `Plan`. Nothing here touches a model, tokenizer or dataset, so a bad value
fails in milliseconds with a ConfigError naming the key and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from specdec.auto.runtime import RuntimeOptions
from specdec.llamacpp import LlamaCppOptions
from specdec.runtime.models import check_device
from specdec.sampling import Sampling

from ..records import REPO_ROOT
from .heads import trained_candidates, with_target
from .schema import AUTO, Method

CONF_DIR = REPO_ROOT / "conf"  # the config tree at the repository's root
BASELINE = Method.autoregressive.value
AT_LEAST = {  # integer keys and their least value (null passes where the schema allows it; k and threads: auto)
    "k": 1, "k_max": 1, "model.k": 1, "model.k_max": 1, "max_nodes": 1, "max_new_tokens": 1, "batch_size": 1,
    "warmup_tokens": 1, "seed": 0, "threads": 1, "runtime.capacity": 16, "runtime.window": 0,
    "dataset.n_per_category": 1, "dataset.n_prompts": 1, "dataset.min_chars": 0, "dataset.max_chars": 1,
    "hf.num_assistant_tokens": 1, "hf.prompt_lookup": 1,
}
RUNTIME_OPTIONS = {field.name for field in fields(RuntimeOptions)}
NODES = ("model.draft.", "tree.", "verify.", "bench.")  # _target_ nodes: their `model: ???` is the run's to fill


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the accepted values."""


def check_choice(value: object, choices: tuple[str, ...], key: str) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not supported; choices: {', '.join(choices)}")


def check_int(value: object, key: str, minimum: int, also: tuple[str, ...] = ()) -> None:
    if value in also:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        accepted = "".join(f" or {a!r}" for a in also)
        raise ConfigError(f"{key} must be an integer >= {minimum}{accepted}, got {value!r}")


def check_bounds(cfg: DictConfig) -> None:
    """Every key set (`???` filled in) and every integer key in its bounds (AT_LEAST)."""
    if missing := [key for key in OmegaConf.missing_keys(cfg) if not key.startswith(NODES)]:
        raise ConfigError(f"{missing[0]} must be set")
    for key, minimum in AT_LEAST.items():
        value = OmegaConf.select(cfg, key)
        if value is not None:
            check_int(value, key, minimum, (AUTO,) if key in ("k", "model.k", "threads") else ())


@contextmanager
def library_check(prefix: str = "") -> Iterator[None]:
    """The library's own check of a value (a ValueError that names the fix), re-raised as a ConfigError; prefix: the
    config node the library's argument sits in."""
    try:
        yield
    except ValueError as e:
        raise ConfigError(f"{prefix}{e}") from e


def sampling_of(cfg: DictConfig) -> Sampling:
    """The library's Sampling from temperature, top_k, top_p."""
    with library_check():
        return Sampling(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)


def candidates_of(cfg: DictConfig) -> DictConfig | None:
    """The drafters a calibrated pair chooses from (model.draft.candidates), or None for one drafter."""
    return cfg.model.draft.get("candidates") if "_target_" not in cfg.model.draft else None


def has_draft_model(cfg: DictConfig) -> bool:
    """Whether the pair loads a draft language model (the naive method and model trees need one)."""
    drafters = candidates_of(cfg) or {"draft": cfg.model.draft}
    return any("model" in node for node in drafters.values())


def needs_draft_model(node: DictConfig) -> bool:
    """A tree (or drafter) node whose `model` the run fills in with the pair's draft model (`model: ???`)."""
    return OmegaConf.is_missing(node, "model")  # (`"model" in node` is False for a missing value)


def methods_of(cfg: DictConfig) -> list[str]:
    """Methods to run, baseline first; method=all runs speculative and naive (naive only with a draft model)."""
    method = Method(cfg.method)
    if method is Method.all:
        return [BASELINE, Method.speculative.value] + ([Method.naive.value] if has_draft_model(cfg) else [])
    return [BASELINE] if method is Method.autoregressive else [BASELINE, method.value]


def quantization_of(cfg: DictConfig, role: str) -> str:
    """Quantization the quantization group gives the target or a draft model ("none" if it does not apply)."""
    q = cfg.quantization
    return q.mode if q.applies_to in (role, "both") else "none"


class ModelUsed(Exception):
    """Raised by StandInModel: the constructor got past its argument checks."""


class StandInModel:
    """Takes a draft model's (or a tokenizer's) place while a drafter node is checked: its first use ends the
    build."""

    def __getattr__(self, name: str):
        if name.startswith("_"):  # introspection (OmegaConf, Hydra) is not a use
            raise AttributeError(name)
        raise ModelUsed(name)


def check_target(node: object, key: str) -> None:
    """A drafter or tree node names its class with _target_ and its constructor accepts its arguments: built
    here with a stand-in for any draft model (constructors check their arguments before they use the model),
    so a bad value fails in milliseconds, before any weights load."""
    if not OmegaConf.is_dict(node) or "_target_" not in node:
        raise ConfigError(f"{key} must name a drafter class with _target_ (see conf/draft/ and conf/tree/), got {node!r}")
    takes_model = "model" in node or OmegaConf.is_missing(node, "model")
    stand_ins = {"model": StandInModel()} if takes_model else {}
    stand_ins |= {key: StandInModel() for key in ("draft_tokenizer", "target_tokenizer", "target") if key in node}  # nor
    # tokenizers: a cross-vocabulary drafter's (specdec.draft.cross_vocab) load in seconds
    stand_ins |= with_target(node, StandInModel)  # a head: its checkpoint resolved as when it is built
    try:
        instantiate(node, **stand_ins)
    except InstantiationException as e:
        if isinstance(e.__cause__, ModelUsed):  # the arguments passed; the build stopped at the model
            return
        cause = e.__cause__ if isinstance(e.__cause__, (ValueError, TypeError)) else e
        raise ConfigError(f"{key} ({node._target_}): {cause}") from e


def check_drafters(cfg: DictConfig) -> None:
    """model.draft is one drafter node, or candidates to calibrate; a tree that drafts with the pair's draft
    model needs a pair that has one."""
    candidates = candidates_of(cfg)
    if candidates is None:
        check_target(cfg.model.draft, "model.draft")
    kept = trained_candidates(candidates or {})
    if candidates is not None and not kept:
        raise ConfigError("model.draft.candidates is empty: keep at least one drafter to calibrate (a head counts once "
                          "trained)")
    for name, node in kept.items():
        check_target(node, f"model.draft.candidates.{name}")
    if cfg.tree:
        check_target(cfg.tree, "tree")
    check_target(cfg.verify, "verify")
    rule = cfg.verify._target_.rsplit(".", 1)[-1]
    if cfg.tree and rule == "BlockVerification":
        raise ConfigError(
            "verify=block verifies chains, but tree= verifies a token tree per pass: use verify=traversal (block "
            "verification carried to trees), verify=token, or tree=none"
        )
    if not cfg.tree and rule == "TraversalVerification":
        raise ConfigError(
            "verify=traversal verifies token trees, but tree=none verifies a chain: use verify=block (traversal "
            "verification on a chain is block verification), or a tree (tree=model, tree=ngram)"
        )
    if cfg.tree and needs_draft_model(cfg.tree) and not has_draft_model(cfg):
        raise ConfigError(
            f"tree={cfg.tree._target_.rsplit('.', 1)[-1]} drafts with a draft model, but model={cfg.model.name} "
            "drafts with an n-gram lookup; use tree=ngram, or a pair with a draft model (model=smollm2_weak, "
            "model=smollm2)"
        )


def check_hf_k(cfg: DictConfig) -> None:
    """Hugging Face's assisted generation and prompt lookup (hf=assisted, hf=lookup) draft a fixed number of
    tokens, k by default: refuse k=auto there, saying what to use instead."""
    for key, what in (("num_assistant_tokens", "assisted generation"), ("prompt_lookup", "prompt lookup")):
        if OmegaConf.select(cfg, f"hf.{key}") == AUTO:
            raise ConfigError(
                f"hf.{key} is k, and k=auto (this pair's default), but Hugging Face's {what} drafts a fixed number "
                f"of tokens: give an integer k (k=4) or hf.{key}; Hugging Face's own dynamic schedule is "
                "hf=assisted_default"
            )


def validate(cfg: DictConfig) -> None:
    """Refuse every value that cannot work, before any model or dataset loads."""
    check_hf_k(cfg)
    check_bounds(cfg)
    sampling_of(cfg)
    check_drafters(cfg)
    if cfg.method == Method.naive and not has_draft_model(cfg):
        raise ConfigError(
            f"method=naive needs a draft model, but model={cfg.model.name} drafts with an n-gram lookup; "
            "use model=smollm2 (or another pair with a draft model), or method=speculative"
        )
    if cfg.method == Method.hf and cfg.hf.assistant and not has_draft_model(cfg):
        raise ConfigError(f"hf.assistant needs a draft model, but model={cfg.model.name} has none; use hf=lookup")
    if cfg.dataset.categories is not None and not cfg.dataset.categories:
        raise ConfigError("dataset.categories must be a non-empty list or null, got []")
    with library_check():
        check_device(cfg.device)
    with library_check("runtime."):
        runtime_options(cfg.runtime)
    with library_check():
        LlamaCppOptions(**cfg.llamacpp)
    if cfg.batch_size > 1 and cfg.method == Method.hf and (cfg.hf.assistant or cfg.hf.prompt_lookup):
        raise ConfigError("Hugging Face assisted generation and prompt lookup take one sequence (transformers "
                          "refuses a batch): use hf=plain with batch_size > 1, or batch_size=1")
    if cfg.batch_size > 1 and cfg.tree and cfg.k == AUTO:
        raise ConfigError("batch_size > 1 with a tree takes a fixed depth: k='auto' prices one sequence's trees; "
                          "set k to an int, or tree=none for chains with k=auto")
    experiments = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
    for name in cfg.get("then") or []:
        check_choice(name, tuple(experiments), "then")


def runtime_options(runtime: DictConfig) -> RuntimeOptions:
    """The library's runtime options from a runtime node (eager's and a bench profile's leave keys out: defaults)."""
    options = {key: runtime[key] for key in runtime if key in RUNTIME_OPTIONS}
    for key in ("widths", "packed_rows"):
        if options.get(key) is not None:
            options[key] = tuple(options[key])
    return RuntimeOptions(**options)


def placement(cfg: DictConfig) -> dict:
    """How the library puts a run's models on their runtime (specdec.auto.runtime.put_on_runtime's keywords)."""
    return {"runtime": runtime_options(cfg.runtime), "device": str(cfg.device), "max_new_tokens": cfg.max_new_tokens}


@dataclass(frozen=True)
class Plan:
    """The run's own settings, typed, resolved from the validated config once."""

    methods: list[str]
    sampling: Sampling
    k: int | str  # an int or "auto"
    k_max: int
    max_nodes: int
    max_new_tokens: int
    warmup_tokens: int
    seed: int
    device: str
    threads: int | str | None  # an int, "auto" or None (torch's default)
    chat: bool  # prompts through the chat template
    trees: bool  # the speculative method verifies a token tree per pass (cfg.tree)
    tree_k: int | str | None  # tree_generate's k: "auto", else the tree's own depth (an integer k sets chains)
    longest: int  # the longest draft a round may verify: k_max for k=auto, else the tree's depth or k
    batch_size: int = 1  # prompts decoded together

    @property
    def chain_k(self) -> int | None:
        """The fixed draft length of a chain (what Thm 3.8 is checked at); None for k=auto and trees."""
        return None if self.trees or self.k == AUTO else self.k

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy


def plan_of(cfg: DictConfig) -> Plan:
    """Validate cfg and resolve the run's settings once per run (the drafters stay config nodes until the pair
    builds them)."""
    validate(cfg)
    trees, auto = bool(cfg.tree), cfg.k == AUTO
    depth = cfg.tree.get("depth") if trees else None
    return Plan(
        methods_of(cfg), sampling_of(cfg), cfg.k, cfg.k_max, cfg.max_nodes, cfg.max_new_tokens,
        cfg.warmup_tokens, cfg.seed, str(cfg.device), cfg.threads, cfg.dataset.chat, trees,
        tree_k=AUTO if auto else depth, longest=cfg.k_max if auto else (depth or cfg.k_max) if trees else cfg.k,
        batch_size=cfg.batch_size,
    )  # fmt: skip
