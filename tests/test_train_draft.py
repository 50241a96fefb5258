"""The training app (experiments.train_draft) on the tiny random pair: it trains, writes the head where `draft=head`
finds it, and resumes after an interruption."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.run.heads import with_target
from experiments.run.settings import ConfigError, validate
from experiments.train_draft import app, store
from specdec.draft import head_store
from specdec.train import loop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import head_calibration

CONF = str(Path(__file__).resolve().parents[1] / "conf")
TINY = ["model=tiny_random", "data.source=bundled", "data.conversations=8", "data.self_distill=true",
        "data.answer_tokens=40", "data.max_tokens=2048", "data.chunk=16", "head.vocab=128", "train.steps=30",
        "train.eval_every=5", "train.checkpoint_every=10", "train.batch=4", "logger=none", "threads=1"]


def train_cfg(*overrides: str):
    with initialize_config_dir(CONF, version_base="1.3"):
        return compose("train_draft", overrides=list(overrides))


class Interrupted(Exception):
    pass


def test_training_interrupted_resumes_and_the_pair_finds_the_head(tmp_path, monkeypatch, make_cfg):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    cfg = train_cfg(*TINY)
    calls = {"n": 0}
    loss = loop.head_loss

    def interrupting(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 15:
            raise Interrupted
        return loss(*args, **kwargs)

    monkeypatch.setattr(loop, "head_loss", interrupting)
    with pytest.raises(Interrupted):
        app.run(cfg, tmp_path / "first")
    folder = store.head_folder(cfg)
    assert torch.load(folder / head_store.CHECKPOINT, weights_only=False)["state"]["step"] == 10
    assert not (folder / head_store.META).exists()

    monkeypatch.setattr(loop, "head_loss", loss)
    assert app.run(cfg, tmp_path / "second") == folder
    meta = json.loads((folder / head_store.META).read_text())
    curve = json.loads((folder / "curve.json").read_text())
    assert meta["steps"] == 30 and [p["step"] for p in curve] == [5, 10, 15, 20, 25, 30]  # resumed at 10
    assert meta["teacher"]["tokens"] > 0 and 0 < meta["final"]["alpha"] <= 1
    assert 0 < meta["teacher"]["answer_positions"] < meta["teacher"]["chunk_tokens"]  # the prompts are not answers
    assert 0 <= meta["final"]["answer_alpha"] <= 1
    assert (tmp_path / "second" / "learning_curve.png").stat().st_size > 0
    assert "| step |" in (tmp_path / "second" / "head.md").read_text()

    table = head_calibration.calibration(folder)  # confidence against greedy match on the same validation positions
    assert table["thresholds"][0]["share"] == 1 and abs(sum(b["share"] for b in table["bins"]) - 1) < 1e-6
    assert table["thresholds"][0]["greedy_match"] == pytest.approx(meta["final"]["answer_greedy_match"], abs=1e-6)

    assert head_store.trained_heads("random:tiny-target") == [folder]
    validate(make_cfg("model=tiny_random", "draft@model.draft=head"))  # the pair finds the trained head
    validate(make_cfg("model=tiny_random", "tree=head"))
    node = OmegaConf.create({"checkpoint": folder.name, "target": None})  # the folder's bare name, as printed
    assert with_target(node, lambda: "target") == {"target": "target", "checkpoint": str(folder)}
    assert head_store.head_path("no-such-head") == "no-such-head"  # left for the loader to report
    validate(make_cfg("model=tiny_random", "draft@model.draft=head", f"model.draft.checkpoint={folder.name}"))
    with pytest.raises(ConfigError, match="no trained draft head at no-such-head"):
        validate(make_cfg("model=tiny_random", "draft@model.draft=head", "model.draft.checkpoint=no-such-head"))


def contender(drafts, k, tps, overrides=(), draft_s=0.0, forwards=0, emitted=10, passes=10):
    by_category = {"chat": {"median": tps}, "code": {"median": tps}}
    stats = {"emitted": emitted, "target_forwards": passes, "draft_forwards": forwards,
             "seconds": {"draft": draft_s}}
    return {"owner": "ours", "drafts": drafts, "k": k, "overrides": list(overrides), "by_category": by_category,
            "tokens_per_second": {"median": tps}, "stats": stats}


def test_head_keys_of_the_bench():
    """head_vs_best_copy over the best copy (a switch over a copy, lookup and the head is none), head_c from drafting seconds per draft token over a target step, and
    tokens per pass of the best fixed-k chain (a tree is not a chain)."""
    from experiments.bench.ratios import head_ratios
    from specdec.comparison import ContenderFigures

    contenders = {
        "ar": contender(None, 4, 10.0),
        "copy": contender("model", "auto", 11.0),
        "default": {**contender("model", "auto", 13.0), "draft_kinds": ["head", "model", "ngram"]},  # a switch
        "head_k3": contender("head", 3, 13.2, draft_s=0.6, forwards=100, emitted=30, passes=12),
        "head_stopped": contender("head", 3, 13.5, overrides=["model.draft.confidence=0.4"], draft_s=0.9, forwards=50,
                                  emitted=30, passes=15),  # a confidence stop: not a fixed-k chain
        "head_tree": contender("head", 4, 14.0, overrides=["model=gemma3_head", "tree=head"], draft_s=0.9, forwards=100, emitted=40,
                               passes=10),
    }
    keys = head_ratios(ContenderFigures(contenders), {"costs": {"target_step_ms": 60.0}})
    assert keys["head_vs_best_copy"] == pytest.approx(14.0 / 11.0)
    assert keys["head_c"] == pytest.approx(0.6 / 100 / 0.060)  # of the chain
    assert keys["head_tokens_per_pass"] == pytest.approx(30 / 12)  # the best fixed-k chain
    assert keys["gemma3_head_vs_target_only"] == pytest.approx(1.4)
    assert head_ratios(ContenderFigures({"ar": contenders["ar"]}), {}) == {}
    del contenders["copy"]
    keys = head_ratios(ContenderFigures(contenders), {"costs": {"target_step_ms": 60.0}})
    assert math.isnan(keys["head_vs_best_copy"])
    from experiments.bench.goals import goal_entries

    goals = goal_entries({"head_c": 0.08, "head_tokens_per_pass": 2.0})
    assert goals["head_c"]["met"] and not goals["head_tokens_per_pass"]["met"]  # a cost is met at or below
