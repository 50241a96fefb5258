"""Every config group option and every experiment file composes; bad values are refused before loading."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from experiments.run.pair import (
    describe,
    draft_node,
    draft_quantization,
    offline_pairs,
    pair_key,
    tree_drafter,
    warn_if_gated,
)
from experiments.run.prompts import load_prompts
from experiments.run.settings import (
    RENAMED,
    ConfigError,
    check_renamed,
    methods_of,
    plan_of,
    quantization_of,
    validate,
)
from specdec import HybridTreeDrafter, ModelTreeDrafter, NGramDrafter, NGramTreeDrafter
from specdec.runtime.tiny import tiny_model

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
GROUPS = ("model", "quantization", "dataset", "logger", "tree", "hf", "verify", "experiment")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def cpu(cfg) -> None:
    """Hub pairs default to CUDA; validate them as if asked for the CPU."""
    cfg.device = "cpu"


def test_every_group_has_options() -> None:
    for group in GROUPS:
        assert options(group), f"conf/{group}/ is empty"


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_option_composes_and_validates(group: str, option: str, make_cfg) -> None:
    extra = {"tree": ["model=smollm2_weak"], "hf": ["k=4"]}.get(group, [])  # hf: Hugging Face drafts a fixed k
    extra += {("verify", "traversal"): ["tree=ngram"]}.get((group, option), [])  # verifies trees
    cfg = make_cfg(f"{group}={option}", *extra)
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)  # every interpolation resolves
    cpu(cfg)
    validate(cfg)


@pytest.mark.parametrize("experiment", options("experiment"))
def test_experiment_sweep_jobs_compose(experiment: str, make_cfg) -> None:
    """Each job of an experiment's sweep (hydra.sweeper.params) composes and validates."""
    cfg = make_cfg(f"experiment={experiment}", hydra=True)
    params = cfg.hydra.sweeper.params or {}
    axes = [[f"{key}={value}" for value in str(values).split(",")] for key, values in params.items()]
    for job in itertools.product(*axes):
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


def test_unknown_option_lists_the_choices(make_cfg) -> None:
    with pytest.raises(MissingConfigException, match="smollm2"):
        make_cfg("model=no_such_pair")


BAD = [
    (["batch_size=0"], "batch_size must be an integer >= 1"),
    (["batch_size=2", "method=hf", "hf=assisted", "k=4"], "assisted generation and prompt lookup take one sequence"),
    (["batch_size=2", "tree=model", "k=auto"], "batch_size > 1 with a tree takes a fixed depth"),
    (["k=0"], "k must be an integer >= 1"),
    (["k=2.5"], "k must be an integer"),
    (["k=often"], "k must be an integer >= 1 or 'auto'"),
    (["k_max=0"], "k_max must be an integer >= 1"),
    (["max_nodes=0"], "max_nodes must be an integer >= 1"),
    (["model=smollm2_ngram", "model.draft.max_ngram=0"], r"model.draft \(specdec.NGramDrafter\): max_ngram must be"),
    (["model=smollm2_ngram", "model.draft.min_ngram=4"], "need 1 <= min_ngram <= max_ngram"),
    (["model=smollm2_ngram", "+model.draft.window=2"], "unexpected keyword argument 'window'"),
    (["model.draft.candidates.ngram.max_ngram=0"], "model.draft.candidates.ngram"),
    (["~model.draft.candidates.nf4", "~model.draft.candidates.int8", "~model.draft.candidates.dynamic_int8",
      "~model.draft.candidates.bfloat16", "~model.draft.candidates.ngram"], "model.draft.candidates is empty"),
    (["temperature=-1"], "temperature must be >= 0"),
    (["temperature=hot"], "must be numbers"),
    (["top_p=0"], "top_p must be in"),
    (["top_p=1.5"], "top_p must be in"),
    (["top_k=-1"], "top_k must be"),
    (["max_new_tokens=0"], "max_new_tokens"),
    (["seed=-1"], "seed"),
    (["threads=0"], "threads"),
    (["method=fast"], "choices: speculative, naive, autoregressive, hf, all"),
    (["quantization.mode=int4"], "choices: none, int8, nf4, fp4"),
    (["quantization.applies_to=neither"], "choices: target, draft, both"),
    (["dtype=float64"], "choices: float32, bfloat16, float16"),
    (["device=tpu"], "choices: cpu, cuda, cuda:N"),
    (["model=smollm2_ngram", "method=naive"], "needs a draft model"),
    (["model=smollm2_ngram", "method=hf", "hf=assisted"], "hf.assistant needs a draft model"),
    (["method=hf", "hf=assisted"], "assisted generation drafts a fixed number of tokens: give an integer k"),
    (["method=hf", "hf=lookup"], "prompt lookup drafts a fixed number of tokens.*hf=assisted_default"),
    (["logger.mode=sometimes"], "choices: offline, online"),
    (["dataset.n_prompts=0"], "dataset.n_prompts"),
    (["dataset.source=ftp"], "choices: json, hub"),
    (["tree=model", "model=smollm2_ngram"], "tree=ModelTreeDrafter drafts with a draft model.*use tree=ngram"),
    (["tree=hybrid", "model=smollm2_ngram"], "tree=HybridTreeDrafter drafts with a draft model"),
    (["tree=ngram", "tree.depth=null"], "depth must be an integer >= 1, got None"),
    (["tree=ngram", "verify=block"], "verify=block verifies chains.*use verify=traversal"),
    (["verify=traversal"], "verify=traversal verifies token trees.*use verify=block"),
    (["model=gemma3_smollm2", "model.reads_target_cache=true"], "another vocabulary cannot read the target's KV cache"),
    (["tree=model", "model=smollm2_weak", "tree.children=null"], "children must be one of"),
    (["tree=ngram", "tree.matches=0"], "matches must be an integer >= 1"),
    (["tree=ngram", "tree.max_ngram=1", "tree.min_ngram=2"], "need 1 <= min_ngram <= max_ngram"),
    (["tree=model", "model=smollm2_weak", "tree.children=random"], r"choices|one of \['distinct', 'iid', 'top'\]"),
    (["tree=model", "model=smollm2_weak", "tree.branches=[]"], "branches must be a non-empty list"),
    (["tree=model", "model=smollm2_weak", "tree.branches=2"], "branches must be a non-empty list"),
    (["tree=hybrid", "model=smollm2_weak", "tree.branches=[2,0]"], r"branches\[1\] must be an integer >= 1"),
    (["tree=hybrid", "model=smollm2_weak", "tree.ngram.matches=0"], "tree.ngram|matches must be an integer"),
]


@pytest.mark.parametrize("overrides,message", BAD)
def test_bad_values_are_refused(overrides: list[str], message: str, make_cfg) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(*overrides))


def test_k_auto_is_accepted(make_cfg) -> None:
    cfg = make_cfg("k=auto", "k_max=6")
    validate(cfg)
    assert (cfg.k, cfg.k_max) == ("auto", 6)


def test_renamed_keys_name_the_new_key(make_cfg) -> None:
    """A key of earlier versions is refused on the command line with the key that replaced it, and the new
    key composes."""
    for old, new in RENAMED.items():
        with pytest.raises(ConfigError, match=f"{re.escape(old)} was renamed: use {re.escape(new)}"):
            check_renamed([f"{old}=x"])
    check_renamed(["~model.draft.candidates.nf4", "model.fused_4bit=false", "max_nodes=16"])  # the new keys pass
    assert make_cfg("model.fused_4bit=false").model.draft.candidates.nf4.model.fused_4bit is False
    assert make_cfg("model.reads_target_cache=false").model.draft.candidates.bfloat16.reads_target_cache is False


def test_a_renamed_key_fails_the_run_before_hydra(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "experiments.run", "model.draft.fused_4bit=false", "logger=none"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "use model.fused_4bit" in out.stderr


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


@pytest.mark.parametrize("option", [o for o in options("tree") if o != "none"])
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


def test_misspelled_key_is_refused_at_composition(make_cfg) -> None:
    """The schema (experiments/run/schema.py) fixes the keys: a typo fails before validate runs."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="temprature"):
        make_cfg("temprature=1")


def test_quantization_options_change_only_the_mode(make_cfg) -> None:
    base = make_cfg("quantization=none").quantization
    for option in options("quantization"):
        q = make_cfg(f"quantization={option}").quantization
        assert (q.mode, q.applies_to, q.compute_dtype) == (option, base.applies_to, base.compute_dtype)


def test_cuda_refused_without_a_gpu(make_cfg) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError, match="device=cpu"):
        validate(make_cfg("model=gemma2"))


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


def test_unknown_category_lists_the_choices(make_cfg) -> None:
    with pytest.raises(ConfigError, match="retrieval"):
        load_prompts(make_cfg("dataset.categories=[poetry]").dataset)


def test_hub_dataset_offline_says_what_to_do() -> None:
    """Without the Hub, a hub dataset fails at once with the offline alternatives in the message."""
    code = (
        "from hydra import compose, initialize_config_dir\n"
        "from experiments.run.prompts import load_prompts\n"
        f"with initialize_config_dir({str(CONF)!r}, version_base='1.3'):\n"
        "    load_prompts(compose('config', overrides=['dataset=mt_bench']).dataset)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode != 0
    assert "dataset=bundled or dataset=article" in out.stderr


def test_sweep_jobs_share_a_pair_when_the_weights_are_the_same(make_cfg) -> None:
    nf4 = "model=smollm2_nf4"
    assert pair_key(make_cfg(nf4, "quantization=none")) == pair_key(
        make_cfg(nf4, "quantization=nf4", "k=8", "temperature=1")
    )
    assert pair_key(make_cfg(nf4, "quantization=none")) != pair_key(make_cfg(nf4, "quantization=int8"))
    assert pair_key(make_cfg()) != pair_key(make_cfg("model=smollm2_ngram"))


def test_gated_model_without_token_says_how_to_log_in(monkeypatch, caplog, make_cfg) -> None:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    warn_if_gated(make_cfg("model=gemma2").model.target)
    assert "hf auth login" in caplog.text
    assert "smollm2" in caplog.text  # names the offline pairs
    pairs = offline_pairs()
    for pair in ("smollm2", "smollm2_int8", "smollm2_ngram", "smollm2_weak", "smollm2_ngram_auto", "smollm2_ngram_tree"):
        assert pair in pairs
    assert not {"gemma2", "llama3", "qwen25"} & set(pairs)


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
