"""The apps' side of the setup: the config mapped to the library's options (specdec.auto), the candidates a pair
builds, what a run writes about the choices (threads.md, calibration.md, runtime.md). The choices themselves are the
library's, and so are their records' markdown: tests/test_calibration.py, test_runtime_auto.py."""

import json
import logging

import pytest
import torch

from experiments.run.heads import say_left_out, trained_candidates
from experiments.run.settings import ConfigError, runtime_options, validate
from specdec.auto.runtime import AUTO_MIN_NEW_TOKENS, RuntimeOptions, compiles
from specdec.runtime.probes import ThreadChoice
from specdec.runtime.tiny import tiny_model


def test_auto_is_the_default_runtime_and_maps_to_the_librarys_options(make_cfg, monkeypatch):
    from specdec.runtime import packed

    monkeypatch.setattr(packed, "unavailable_reason", lambda: None)  # the packed kernel runs here
    cfg = make_cfg()
    assert cfg.runtime.name == "auto" and cfg.max_new_tokens >= AUTO_MIN_NEW_TOKENS
    options = runtime_options(cfg.runtime)
    assert options == RuntimeOptions("auto", widths=(16,), dynamic_width=True, packed_rows=(1, 16), cpp_wrapper=True,
                                     step_graph="never", drafts=False, heads=True)  # fmt: skip
    assert compiles(options, str(cfg.device), cfg.max_new_tokens)
    assert runtime_options(make_cfg("runtime=eager").runtime) == RuntimeOptions("eager")


def test_bad_candidates_fail_in_the_config_before_loading(make_cfg):
    with pytest.raises(ConfigError, match=r"model.draft.candidates.nf4 \(specdec.ModelDrafter\).*unexpected"):
        validate(make_cfg("+model.draft.candidates.nf4.speed=2"))
    with pytest.raises(ConfigError, match="model.draft.candidates.extra must name a drafter class"):
        validate(make_cfg("+model.draft.candidates.extra=7"))


def test_default_pair_is_calibrated(make_cfg, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))  # no head trained here
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")  # the packed kernel runs
    cfg = make_cfg()
    assert cfg.model.name == "smollm2"
    assert list(cfg.model.draft.candidates) == ["packed_int8", "ngram", "dynamic_int8", "nf4", "bfloat16", "int8",
                                                "head"]  # loaded in this order, the fastest where we measured first
    assert list(trained_candidates(cfg.model.draft.candidates)) == ["packed_int8", "ngram", "dynamic_int8", "nf4",
                                                                    "bfloat16", "int8"]
    with caplog.at_level(logging.INFO, logger="experiments.run.heads"):
        validate(cfg)  # validation leaves the untrained head out quietly: the pair names it once, when it loads
        assert not caplog.records
        say_left_out(cfg.model.draft.candidates, trained_candidates(cfg.model.draft.candidates))
    assert [r.getMessage() for r in caplog.records] == [
        "candidate head left out: no draft head is trained for this target (make train-draft)"]
    smaller = make_cfg("~model.draft.candidates.nf4", "~model.draft.candidates.int8")
    validate(smaller)
    assert list(smaller.model.draft.candidates) == ["packed_int8", "ngram", "dynamic_int8", "bfloat16", "head"]


def test_nf4_candidate_can_be_forced_onto_the_non_fused_path(tmp_path, make_cfg):
    """model.fused_4bit=false: the nf4 candidate never uses bitsandbytes' fused CPU kernel."""
    pytest.importorskip("bitsandbytes")
    from bitsandbytes.nn import Linear4bit
    from hydra.utils import instantiate

    tiny = tiny_model("llama", seed=0, scale=20.0, vocab_size=32, hidden_size=64, intermediate_size=128)
    tiny.save_pretrained(tmp_path)
    cfg = make_cfg("model.fused_4bit=false", f"model.target.name={tmp_path}")
    drafter = instantiate(cfg.model.draft.candidates.nf4)
    layers = [m for m in drafter.model.modules() if isinstance(m, Linear4bit)]
    assert layers and not any(m.support_avx512bf16_for_cpu for m in layers)


@pytest.mark.parametrize("reads", [True, False])
def test_model_candidates_read_the_target_cache_unless_told_not_to(reads, make_cfg):
    """model.reads_target_cache reaches every model candidate; the n-gram candidate has no cache."""
    from hydra.utils import instantiate

    cfg = make_cfg(f"model.reads_target_cache={str(reads).lower()}")
    for name, node in cfg.model.draft.candidates.items():
        if "model" in node:
            assert node.reads_target_cache is reads, name
    assert "reads_target_cache" not in cfg.model.draft.candidates.ngram
    assert not hasattr(instantiate(cfg.model.draft.candidates.ngram), "reads_target_cache")



def test_the_summary_carries_the_thread_choice(tmp_path):
    """threads=auto: threads.md joins summary.md and threads.json joins summary.json (write_choices writes both)."""
    import pandas as pd

    from experiments.records import machine, write_json
    from experiments.run.summary import write_choices, write_summary

    write_json(tmp_path / "environment.json", machine())
    write_choices(tmp_path, ThreadChoice(2, {1: 3.0, 2: 2.0}, 5, 7), None)
    text = write_summary(tmp_path, {"k": 4}, pd.DataFrame(), {}, {}, "", 0)
    assert "threads=auto chose 2" in text and not (tmp_path / "calibration.md").exists()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["threads"] == {"threads": 2, "probe_ms": {"1": 3.0, "2": 2.0}, "width": 5, "prompt_tokens": 7}
    assert "calibration" not in summary




def test_threads_auto_is_a_setting_and_its_choice_is_written(make_cfg):
    validate(make_cfg("threads=auto"))
    with pytest.raises(ConfigError, match="threads"):
        validate(make_cfg("threads=many"))


def test_without_avx512_a_packed_int8_candidate_is_left_out(monkeypatch, caplog):
    """The default pair lists the packed_int8 copy among its candidates: where the kernel cannot run, calibration
    leaves it out with one logged line, and the other candidates stay."""
    from omegaconf import OmegaConf

    from experiments.run.heads import loaded_candidates
    from specdec.runtime import packed

    candidates = OmegaConf.create({"ngram": {"_target_": "specdec.NGramDrafter"},
                                   "packed_int8": {"model": {"quantization": "packed_int8", "device": "cpu"}}})
    monkeypatch.setattr(packed.torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    with caplog.at_level(logging.INFO):
        assert list(loaded_candidates(candidates)) == ["ngram"]
    assert "candidate packed_int8 left out: the packed kernel needs AVX-512 (this CPU: AVX2)" in caplog.text
    monkeypatch.setattr(packed.torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert list(loaded_candidates(candidates)) == ["ngram", "packed_int8"]
    candidates.packed_int8.model.device = "cuda"
    assert list(loaded_candidates(candidates)) == ["ngram"]


@pytest.mark.exhaustive  # compiles the toy pair's target and draft; the library's checks run in `make test`
@pytest.mark.xdist_group("inductor")
def test_a_run_on_the_compiled_runtime_reports_its_compile(tmp_path, make_cfg):
    """python -m experiments.run runtime=compiled runtime.drafts=true on the toy random pair: target and draft
    compiled, greedy output still the target's, and runtime.md / .json say which graphs compiled in how long."""
    import json

    import pandas as pd

    from experiments.run.app import run_experiment

    run_experiment(make_cfg("model=tiny_random", "device=cpu", "dtype=float32", "dataset.n_prompts=2",
                            "max_new_tokens=8", "warmup_tokens=2", "threads=1", "method=speculative", "k=3",
                            "runtime=compiled", "runtime.drafts=true", "runtime.capacity=128", "logger=none"), tmp_path)
    runtime = json.loads((tmp_path / "runtime.json").read_text())
    assert set(runtime) == {"target", "draft"}
    assert set(runtime["target"]["seconds"]) == {"1x1", "1x2", "1x4", "1x8"}  # every bucket (conf/runtime/compiled.yaml),
    # built when the model loaded
    assert set(runtime["target"]["pass_ms"]) == {"1", "2", "4", "8"}  # and timed, so a pass pads to the cheapest
    assert runtime["target"]["eager_reason"] is None
    assert "Runtime: compiled" in (tmp_path / "summary.md").read_text()
    rows = pd.read_json(tmp_path / "results.jsonl", lines=True)
    assert (rows[rows["method"] == "speculative"]["agreement"] == 1.0).all()
