"""The training app (experiments.train_draft) on the tiny random pair: it trains, writes the head where `draft=head`
finds it, resumes after an interruption, and reads ShareGPT's cut-off file up to its last whole record."""

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import experiments.train_draft.app as app
from experiments.run.settings import validate
from experiments.train_draft import store
from experiments.train_draft.data import whole_records

CONF = str(Path(__file__).resolve().parents[1] / "conf")
TINY = ["model=tiny_random", "data.source=bundled", "data.conversations=8", "data.self_distill=true",
        "data.answer_tokens=40", "data.chunk=16", "head.vocab=128", "train.steps=30", "train.eval_every=5",
        "train.checkpoint_every=10", "train.batch=4", "logger=none", "threads=1"]


def train_cfg(*overrides: str):
    with initialize_config_dir(CONF, version_base="1.3"):
        return compose("train_draft", overrides=list(overrides))


class Interrupted(Exception):
    pass


def test_training_interrupted_resumes_and_the_pair_finds_the_head(tmp_path, monkeypatch, make_cfg):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    cfg = train_cfg(*TINY)
    calls = {"n": 0}
    loss = app.head_loss

    def interrupting(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 15:
            raise Interrupted
        return loss(*args, **kwargs)

    monkeypatch.setattr(app, "head_loss", interrupting)
    with pytest.raises(Interrupted):
        app.run(cfg, tmp_path / "first")
    folder = store.head_folder(cfg)
    assert torch.load(folder / store.CHECKPOINT, weights_only=False)["state"]["step"] == 10
    assert not (folder / store.META).exists()

    monkeypatch.setattr(app, "head_loss", loss)
    assert app.run(cfg, tmp_path / "second") == folder
    meta = json.loads((folder / store.META).read_text())
    curve = json.loads((folder / "curve.json").read_text())
    assert meta["steps"] == 30 and [p["step"] for p in curve] == [5, 10, 15, 20, 25, 30]  # resumed at 10
    assert meta["teacher"]["tokens"] > 0 and 0 < meta["final"]["alpha"] <= 1
    assert (tmp_path / "second" / "learning_curve.png").stat().st_size > 0
    assert "| step |" in (tmp_path / "second" / "head.md").read_text()

    assert store.trained_heads("random:tiny-target") == [folder]
    validate(make_cfg("model=tiny_random", "draft@model.draft=head"))  # the pair finds the trained head
    validate(make_cfg("model=tiny_random", "tree=head"))


def test_sharegpt_reading_stops_at_the_last_whole_record():
    text = '[\n {"id": "a", "conversations": []},\n {"id": "b", "conversations": [{"from": "human", "va'
    assert [r["id"] for r in whole_records(text)] == ["a"]
    assert [r["id"] for r in whole_records('[{"id": "a"}, {"id": "b"}]')] == ["a", "b"]
