"""Bad config values, unknown keys, missing hardware or data: refused before any model loads, with the fix."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from test_configs import CONF, ROOT

from experiments.run.pair import (
    offline_pairs,
    warn_if_gated,
)
from experiments.run.prompts import load_prompts
from experiments.run.settings import (
    ConfigError,
    validate,
)


def test_unknown_option_lists_the_choices(make_cfg) -> None:
    with pytest.raises(MissingConfigException, match="smollm2"):
        make_cfg("model=no_such_pair")


BAD = [
    (["batch_size=0"], "batch_size must be an integer >= 1"),
    (["batch_size=2", "method=hf", "hf=assisted", "k=4"], "assisted generation and prompt lookup take one sequence"),
    (["batch_size=2", "tree=model", "k=auto"], "batch_size > 1 with a tree takes a fixed depth"),
    (["k=0"], "k must be an integer >= 1"),
    (["k=2.5"], r"'2.5' of type 'float' is incompatible with type hint 'Union\[int, str\]'[\s\S]*full_key: k\n"),
    (["k=often"], "k must be an integer >= 1 or 'auto'"),
    (["k_max=0"], "k_max must be an integer >= 1"),
    (["k_max=abc"], r"'abc' of type 'str' could not be converted to Integer[\s\S]*full_key: k_max"),
    (["max_nodes=0"], "max_nodes must be an integer >= 1"),
    (["model=smollm2_ngram", "model.draft.max_ngram=0"], r"model.draft \(specdec.NGramDrafter\): max_ngram must be"),
    (["model=smollm2_ngram", "model.draft.min_ngram=4"], "need 1 <= min_ngram <= max_ngram"),
    (["model=smollm2_ngram", "+model.draft.window=2"], "unexpected keyword argument 'window'"),
    (["model.draft.candidates.ngram.max_ngram=0"], "model.draft.candidates.ngram"),
    (["~model.draft.candidates.nf4", "~model.draft.candidates.int8", "~model.draft.candidates.dynamic_int8",
      "~model.draft.candidates.packed_int8", "~model.draft.candidates.bfloat16", "~model.draft.candidates.ngram",
      "~model.draft.candidates.head"],
     "model.draft.candidates is empty"),
    (["temperature=-1"], "temperature must be >= 0"),
    (["temperature=hot"], r"'hot' of type 'str' could not be converted to Float[\s\S]*full_key: temperature"),
    (["top_p=0"], "top_p must be in"),
    (["top_p=1.5"], "top_p must be in"),
    (["top_k=-1"], "top_k must be"),
    (["max_new_tokens=0"], "max_new_tokens"),
    (["seed=-1"], "seed"),
    (["threads=0"], "threads"),
    (["method=fast"], r"expected one of \[speculative, naive, autoregressive, hf, llamacpp, all\][\s\S]*full_key: method"),
    (["quantization.mode=int4"], r"expected one of \[none, int8, nf4, fp4[\s\S]*full_key: quantization.mode"),
    (["quantization.applies_to=neither"],
     r"expected one of \[target, draft, both\][\s\S]*full_key: quantization.applies_to"),
    (["dtype=float64"], r"expected one of \[float32, bfloat16, float16\][\s\S]*full_key: dtype"),
    (["device=tpu"], "choices: cpu, cuda, cuda:N"),
    (["model=smollm2_ngram", "method=naive"], "needs a draft model"),
    (["model=smollm2_ngram", "method=hf", "hf=assisted"], "hf.assistant needs a draft model"),
    (["method=hf", "hf=assisted"], "assisted generation drafts a fixed number of tokens: give an integer k"),
    (["method=hf", "hf=lookup"], "prompt lookup drafts a fixed number of tokens.*hf=assisted_default"),
    (["logger.mode=sometimes"], r"expected one of \[offline, online\][\s\S]*full_key: logger.mode"),
    (["dataset.n_prompts=0"], "dataset.n_prompts"),
    (["dataset.source=ftp"], r"expected one of \[json, hub, sharegpt\][\s\S]*full_key: dataset.source"),
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
    (["runtime=compiled", "runtime.widths=[]"], "runtime.widths must be a non-empty list"),
    (["runtime=compiled", "runtime.widths=[1,0]"], "runtime.widths must be an integer >= 1"),
    (["runtime=compiled", "runtime.capacity=16", "runtime.widths=[1,16]"], "runtime.capacity=16 must hold two"),
    (["runtime=compiled", "runtime.packed_rows=[5]"], "runtime.packed_rows must be null or \\[first, last\\]"),
    (["runtime=compiled", "runtime.packed_rows=[5,2]"], "runtime.packed_rows must be an integer >= 5"),
    (["runtime.name=aot"], r"expected one of \[eager, compiled, auto\][\s\S]*full_key: runtime.name"),
    (["runtime.step_graph=sometimes"], r"expected one of \[auto, always, never\][\s\S]*full_key: runtime.step_graph"),
    (["method=llamacpp", "llamacpp.weights=q4"], "llamacpp.weights must be one of f32, bf16, q8_0, got 'q4'"),
    (["llamacpp=speculative", "llamacpp.lookup=3"], "llamacpp.draft and llamacpp.lookup are two kinds"),
    (["llamacpp.k=0"], r"llamacpp.k must be an integer >= 1, got 0"),
    (["then=[article_pairs]"], "then='article_pairs' is not supported; choices: article_pair, "),
]


@pytest.mark.parametrize("overrides,message", BAD)
def test_bad_values_are_refused(overrides: list[str], message: str, make_cfg) -> None:
    """Refused where it is found: by OmegaConf at composition (a type or an Enum's choice; the message is its
    cause's, which names the key), else by validate."""
    with pytest.raises((ConfigCompositionException, ConfigError)) as refused:
        validate(make_cfg(*overrides))
    error = refused.value
    assert re.search(message, str(error.__cause__ if isinstance(error, ConfigCompositionException) else error))


def test_k_auto_is_accepted(make_cfg) -> None:
    cfg = make_cfg("k=auto", "k_max=6")
    validate(cfg)
    assert (cfg.k, cfg.k_max) == ("auto", 6)


def test_pair_keys_reach_the_drafters(make_cfg) -> None:
    """model.fused_4bit and model.reads_target_cache compose into the candidates that read them."""
    assert make_cfg("model.fused_4bit=false").model.draft.candidates.nf4.model.fused_4bit is False
    assert make_cfg("model.reads_target_cache=false").model.draft.candidates.bfloat16.reads_target_cache is False


@pytest.mark.exhaustive  # a process of its own: `make test-all`
def test_a_bad_choice_fails_the_run_in_a_message_not_a_traceback() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "experiments.run", "method=fast", "logger=none"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "expected one of [speculative, naive, autoregressive, hf, llamacpp, all]" in out.stderr and "full_key: method" in out.stderr


def test_misspelled_key_is_refused_at_composition(make_cfg) -> None:
    """The schema (experiments/run/schema.py) fixes the keys: a typo (or a key of earlier versions) fails before
    validate runs."""
    with pytest.raises(ConfigCompositionException, match="temprature"):
        make_cfg("temprature=1")


def test_cuda_refused_without_a_gpu(make_cfg) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError, match="device=cpu"):
        validate(make_cfg("model=gemma2"))


def test_unknown_category_lists_the_choices(make_cfg) -> None:
    with pytest.raises(ConfigError, match="retrieval"):
        load_prompts(make_cfg("dataset.categories=[poetry]").dataset)


@pytest.mark.exhaustive  # a process of its own: `make test-all`
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
