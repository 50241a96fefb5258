"""Every config group option and every experiment file composes; bad values are refused before loading."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from experiments.run.pair import (
    describe,
    draft_node,
    draft_quantization,
    pair_key,
    tree_drafter,
)
from experiments.run.prompts import load_prompts
from experiments.run.settings import (
    ConfigError,
    methods_of,
    plan_of,
    quantization_of,
    validate,
)
from specdec import HybridTreeDrafter, ModelTreeDrafter, NGramDrafter, NGramTreeDrafter
from specdec.runtime.tiny import tiny_model

pytestmark = pytest.mark.xdist_group("configs")  # one worker: each command line is composed once (make_cfg's cache)
ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
GROUPS = ("model", "quantization", "runtime", "dataset", "logger", "tree", "hf", "llamacpp", "verify", "experiment")


NEEDS_A_TRAINED_HEAD = {("model", "smollm2_head"), ("model", "gemma3_head"), ("tree", "head")}  # experiments.train_draft makes one


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def cpu(cfg) -> None:
    """Hub pairs default to CUDA; validate them as if asked for the CPU."""
    cfg.device = "cpu"


def test_every_group_has_options() -> None:
    for group in GROUPS:
        assert options(group), f"conf/{group}/ is empty"


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_option_composes_and_validates(group: str, option: str, make_cfg, monkeypatch, tmp_path) -> None:
    if (group, option) in NEEDS_A_TRAINED_HEAD:  # refused, with the fix, where none is trained
        monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
        with pytest.raises(ConfigError, match="no draft head is trained for this target"):
            validate(make_cfg(f"{group}={option}"))
        return
    extra = {"tree": ["model=smollm2_weak"], "hf": ["k=4"]}.get(group, [])  # hf: Hugging Face drafts a fixed k
    extra += {("verify", "traversal"): ["tree=ngram"]}.get((group, option), [])  # verifies trees
    cfg = make_cfg(f"{group}={option}", *extra)
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)  # every interpolation resolves
    cpu(cfg)
    validate(cfg)


def every_value_once(*axes: list[str]) -> list[tuple[str, ...]]:
    """As many jobs as the longest axis: job i takes value i (cycling) of each axis, so every value is in a job."""
    return [tuple(axis[i % len(axis)] for axis in axes) for i in range(max(map(len, axes), default=1))]


# make test: every value of every sweep axis composes and validates in some job; the whole product in make test-all
@pytest.mark.parametrize("jobs", [every_value_once, pytest.param(itertools.product, marks=pytest.mark.exhaustive)],
                         ids=["every-value", "every-job"])
@pytest.mark.parametrize("experiment", options("experiment"))
def test_experiment_sweep_jobs_compose(experiment: str, jobs, make_cfg) -> None:
    """The jobs of an experiment's sweep (hydra.sweeper.params) compose and validate."""
    cfg = make_cfg(f"experiment={experiment}", hydra=True)
    params = cfg.hydra.sweeper.params or {}
    axes = [[f"{key}={value}" for value in str(values).split(",")] for key, values in params.items()]
    for job in jobs(*axes):
        job_cfg = make_cfg(f"experiment={experiment}", *job)
        validate(job_cfg)


def test_experiments_state_only_what_changes(make_cfg) -> None:
    """An experiment file sets a few keys; everything else comes from config.yaml."""
    base = OmegaConf.to_container(make_cfg(), resolve=True)
    for experiment in options("experiment"):
        cfg = OmegaConf.to_container(make_cfg(f"experiment={experiment}"), resolve=True)
        changed = [key for key in base if base[key] != cfg[key]]
        assert 0 < len(changed) <= 5, (experiment, changed)


def test_article_table_matches_the_article(make_cfg) -> None:
    cfg = make_cfg("experiment=article_table")
    assert cfg.max_new_tokens == 200
    assert cfg.method == "all"
    assert cfg.dataset.name == "article"
    assert cfg.dataset.chat is False


@pytest.mark.exhaustive  # a process of its own; the docs test composes every README command in `make test`
def test_readme_command_composes() -> None:
    """`python -m experiments.run model=gemma2 k=4 --cfg job`, exactly as documented."""
    out = subprocess.run(
        [sys.executable, "-m", "experiments.run", "model=gemma2", "k=4", "--cfg", "job"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    job = OmegaConf.create(out.stdout)
    assert job.model.target.name == "google/gemma-2-9b-it"
    assert job.model.draft_name == "google/gemma-2-2b-it"
    assert job.model.draft._target_ == "specdec.ModelDrafter" and job.k == 4


def test_hub_pairs_default_to_cuda_bfloat16_and_mark_gated(make_cfg) -> None:
    for option in options("model"):
        cfg = make_cfg(f"model={option}")
        if cfg.model.target.name.startswith("offline:") or option == "tiny_random":
            assert cfg.device == "cpu"
            continue
        assert (cfg.device, cfg.dtype) == ("cuda", "bfloat16")
        assert isinstance(cfg.model.target.gated, bool)
    assert make_cfg("model=gemma2").model.target.gated is True
    assert make_cfg("model=qwen25").model.target.gated is False


def test_auto_and_tree_pairs(make_cfg) -> None:
    """The offline pairs for k=auto and trees extend smollm2_ngram; the command line still overrides them."""
    base = make_cfg("model=smollm2_ngram")
    auto = make_cfg("model=smollm2_ngram_auto")
    assert (auto.k, auto.k_max, bool(auto.tree)) == ("auto", 8, False)
    assert auto.model.draft == base.model.draft and auto.model.target == base.model.target
    assert make_cfg("model=smollm2_ngram_auto", "k=3").k == 3
    tree = make_cfg("model=smollm2_ngram_tree")
    assert (tree.tree._target_, tree.k) == ("specdec.NGramTreeDrafter", 4)
    assert tree.model.draft == base.model.draft
    assert not make_cfg("model=smollm2_ngram_tree", "tree=none").tree
    assert not make_cfg().tree and make_cfg().k == "auto"  # the default: a chain, draft and k chosen each round
    for cfg in (auto, tree):
        validate(cfg)
        assert methods_of(cfg) == ["autoregressive", "speculative"]
        assert pair_key(cfg) == pair_key(base)  # same weights: a sweep over them loads the pair once


@pytest.mark.parametrize("option", [o for o in options("tree") if o != "none" and ("tree", o) not in NEEDS_A_TRAINED_HEAD])
def test_tree_options_validate_with_a_draft_model(option: str, make_cfg) -> None:
    cfg = make_cfg(f"tree={option}", "model=smollm2_weak")
    validate(cfg)
    assert cfg.tree._target_.startswith("specdec.")


def test_k_auto_with_a_tree_chooses_its_depth(make_cfg) -> None:
    """tree_generate gets k="auto" (depth <= k_max, nodes <= max_nodes each round) or the tree's own depth."""
    auto = plan_of(make_cfg("model=smollm2_ngram_auto", "tree=ngram", "k_max=5"))
    assert (auto.tree_k, auto.longest, auto.chain_k) == ("auto", 5, None)
    fixed = plan_of(make_cfg("tree=ngram", "tree.depth=6", "k=3"))
    assert (fixed.tree_k, fixed.longest) == (6, 6)  # an integer k sets chains only
    chain = plan_of(make_cfg("k=3"))
    assert (chain.longest, chain.chain_k, chain.trees) == (3, 3, False)


class FakePair:
    """What pair.tree_drafter reads from a loaded pair: its draft model (None for an n-gram pair)."""

    def __init__(self, draft_model):
        self.draft_model = draft_model


def test_tree_drafters_are_built_from_the_config(make_cfg) -> None:
    draft = FakePair(tiny_model("llama", seed=1))
    ngram = tree_drafter(make_cfg("tree=ngram", "tree.matches=3"), FakePair(None), 64)
    assert isinstance(ngram, NGramTreeDrafter)
    assert (ngram.matches, ngram.depth, ngram.nodes, ngram.max_ngram) == (3, 8, 8, 3)
    model = tree_drafter(make_cfg("tree=model", "tree.branches=[3,2]", "tree.children=distinct"), draft, 64)
    assert isinstance(model, ModelTreeDrafter) and model.model is draft.draft_model
    assert (model.branches, model.depth, model.nodes) == ((3, 2), 4, 8)
    hybrid = tree_drafter(make_cfg("tree=hybrid"), draft, 64)
    assert isinstance(hybrid, HybridTreeDrafter) and hybrid.ngram.nodes == hybrid.nodes == 6
    assert hybrid.most_nodes == 12
    assert model.states.enabled  # model.reads_target_cache (default true): a copy of the target reads its cache
    assert not tree_drafter(make_cfg("tree=model", "model.reads_target_cache=false"), draft, 64).states.enabled
    with pytest.raises(ConfigError, match="needs a draft model"):
        tree_drafter(make_cfg("tree=model"), FakePair(None), 64)
    with pytest.raises(ConfigError, match="up to 12 nodes per pass but max_nodes=8: lower tree.nodes"):
        tree_drafter(make_cfg("tree=hybrid"), draft, 8)


def test_every_drafter_file_is_used_by_a_pair_and_builds(make_cfg) -> None:
    """conf/draft/: each file is some pair's drafter (or candidate) and its node names a specdec class."""
    used = set()
    for option in options("model"):
        draft = make_cfg(f"model={option}").model.draft
        for node in (draft.candidates.values() if "candidates" in draft else [draft]):
            used.add(describe(node).split("(")[0])
    assert used >= {"ModelDrafter", "NGramDrafter"}
    for option in options("draft"):
        node = OmegaConf.load(CONF / "draft" / f"{option}.yaml")
        assert node._target_.startswith("specdec."), option
    assert isinstance(instantiate_ngram(make_cfg("model=smollm2_ngram")), NGramDrafter)


def instantiate_ngram(cfg):
    from hydra.utils import instantiate

    return instantiate(cfg.model.draft)


def test_quantization_options_change_only_the_mode(make_cfg) -> None:
    base = make_cfg("quantization=none").quantization
    for option in options("quantization"):
        q = make_cfg(f"quantization={option}").quantization
        assert (q.mode, q.applies_to, q.compute_dtype) == (option, base.applies_to, base.compute_dtype)


def test_methods_and_quantization_plan(make_cfg) -> None:
    assert methods_of(make_cfg()) == ["autoregressive", "speculative", "naive"]
    assert methods_of(make_cfg("model=smollm2_ngram")) == ["autoregressive", "speculative"]
    assert methods_of(make_cfg("method=naive")) == ["autoregressive", "naive"]
    assert methods_of(make_cfg("method=hf")) == ["autoregressive", "hf"]
    assert methods_of(make_cfg("method=autoregressive")) == ["autoregressive"]

    def quantized(*overrides):
        return draft_quantization(draft_node(make_cfg(*overrides)))

    assert quantized("model=smollm2_nf4") == "nf4"  # the pair's own copy
    assert quantized("model=smollm2_nf4", "quantization=int8") == "int8"  # the group overrides it
    node = draft_node(make_cfg("model=smollm2_nf4", "quantization=int8"))
    assert node.model.name == "offline:smollm2-135m-instruct"  # interpolations still resolve after the merge
    assert quantized("model=smollm2_weak", "quantization=int8") == "none"  # a truncated copy: nothing to quantize
    assert quantization_of(make_cfg("quantization=int8"), "target") == "none"
    assert quantization_of(make_cfg("quantization=nf4", "quantization.applies_to=both"), "target") == "nf4"
    assert quantized("model=gemma2", "quantization=nf4") == "nf4"
    assert quantized("model=smollm2_ngram", "quantization=nf4") == "none"


def test_bundled_and_article_prompts(make_cfg) -> None:
    every = load_prompts(make_cfg("dataset.n_per_category=null").dataset)
    assert len(every) == 28
    assert len({p.category for p in every}) == 7
    default = load_prompts(make_cfg().dataset)
    assert [p.category for p in default] == [
        "chat", "summarization", "translation", "qa", "math", "code", "retrieval",
    ]  # fmt: skip
    article = load_prompts(make_cfg("dataset=article").dataset)
    assert len(article) == 5
    assert article[0].text == "The future of artificial intelligence is "
    two = load_prompts(
        make_cfg(
            "dataset.categories=[math,code]", "dataset.n_per_category=null", "dataset.n_prompts=6"
        ).dataset
    )
    assert [p.category for p in two] == ["math"] * 4 + ["code"] * 2


def test_sweep_jobs_share_a_pair_when_the_weights_are_the_same(make_cfg) -> None:
    nf4 = "model=smollm2_nf4"
    assert pair_key(make_cfg(nf4, "quantization=none")) == pair_key(
        make_cfg(nf4, "quantization=nf4", "k=8", "temperature=1")
    )
    assert pair_key(make_cfg(nf4, "quantization=none")) != pair_key(make_cfg(nf4, "quantization=int8"))
    assert pair_key(make_cfg()) != pair_key(make_cfg("model=smollm2_ngram"))


@pytest.mark.parametrize(
    "overrides, rule",
    [
        (["verify=auto"], "TokenLevel"),  # greedy: every rule accepts the same tokens; the cheapest
        (["verify=auto", "temperature=1"], "BlockVerification"),
        (["verify=auto", "tree=ngram"], "TreeRules"),
        (["verify=auto", "tree=ngram", "temperature=1"], "TraversalVerification"),
        (["verify=token", "temperature=1"], "TokenLevel"),
        (["verify=token", "tree=ngram", "temperature=1"], "TreeRules"),
        (["verify=block", "temperature=0.5"], "BlockVerification"),
        (["verify=traversal", "tree=ngram"], "TraversalVerification"),
    ],
)
def test_verify_resolves_to_the_rule_for_the_shape_and_temperature(overrides, rule, make_cfg) -> None:
    from experiments.run.methods import acceptance_of
    from experiments.run.settings import plan_of

    cfg = make_cfg(*overrides)
    validate(cfg)
    assert type(acceptance_of(cfg, plan_of(cfg))).__name__ == rule
