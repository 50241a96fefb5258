"""The benchmark's parts without a bench run: config checks, pooled statistics, the greedy check, goals, the schedule, machine records and cost figures."""

from __future__ import annotations

import re

import pytest
import torch
from test_bench import ROOT, TINY

from experiments.bench.goals import goal_entries
from experiments.records import machine, strict_json
from specdec.markdown import markdown_table
from specdec.runtime.machine import machine_sentence


def test_unknown_contender_is_refused():
    """Before anything loads (a ConfigError: `python -m experiments.bench` exits with 2 and the message)."""
    from hydra import compose, initialize_config_dir

    from experiments.bench.contenders import contenders_of
    from experiments.run.pair import Pairs
    from experiments.run.settings import ConfigError

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("bench", overrides=TINY)
        with pytest.raises(ConfigError, match=r"\['warp_drive'\] are not in bench.contenders"):
            contenders_of(cfg, TINY, Pairs(), only=["ar", "warp_drive"])


def test_goal_entries_and_strict_json():
    entries = goal_entries({"vs_hf_assisted": 1.3, "vs_hf_prompt_lookup": float("nan"), "not_a_goal": 2.0})
    assert entries == {
        "vs_hf_assisted": {"value": 1.3, "target": 1.2, "met": True},
        "vs_hf_prompt_lookup": {"value": None, "target": 1.15, "met": None},
    }
    by_machine = goal_entries({"best_vs_target_only_geomean": 1.4, "block_vs_token_tokens_per_pass": 1.0},
                              flags=["avx2", "avx512_bf16"], greedy=True)  # fmt: skip
    assert by_machine["best_vs_target_only_geomean"] == {"value": 1.4, "target": 1.60, "met": False,
                                                         "target_for": "avx512_bf16"}  # fmt: skip
    assert by_machine["block_vs_token_tokens_per_pass"]["met"] and by_machine["block_vs_token_tokens_per_pass"]["target"] == 1.0
    sampled = goal_entries({"best_vs_target_only_geomean": 1.4, "block_vs_token_tokens_per_pass": 1.0}, ["avx2"], False)
    assert sampled["best_vs_target_only_geomean"]["met"] and sampled["best_vs_target_only_geomean"]["target"] == 1.30
    assert not sampled["block_vs_token_tokens_per_pass"]["met"]  # sampled: block must gain 3%
    assert strict_json({"a": [float("inf"), 1.0], "b": float("nan")}) == {"a": [None, 1.0], "b": None}
    assert markdown_table(["x", "y"], [["a", 0.5], ["b", None]]).splitlines() == [
        "| x | y |",
        "|---|---|",
        "| a | 0.500 |",
        "| b | - |",
    ]


def test_machine_records_cpu_features_and_bitsandbytes_path():
    info = machine()
    assert info["cpu"]["model"] and info["packages"]["torch"]
    flags = info["cpu"]["flags"]
    assert isinstance(flags, str) or {"avx512_bf16", "amx_bf16", "avx2"} <= set(flags)
    bnb = info["bitsandbytes_cpu"]
    if bnb["installed"]:  # bitsandbytes 0.50 registers the fused kernel exactly when the CPU has AVX512-BF16
        assert bnb["fused_4bit_gemv"] == bnb["has_avx512bf16"]
        assert bnb["4bit_path"] == ("fused gemv_4bit kernel" if bnb["has_avx512bf16"] else
                                    "dequantize, then torch matmul (no fused kernel)")
    fake = {
        **info,
        "cpu": {**info["cpu"], "flags": {"avx2": True, "avx512_bf16": False}},
        "bitsandbytes_cpu": {"installed": True, "4bit_path": "dequantize, then torch matmul"},
    }
    assert "CPU flags: avx2;" in machine_sentence(fake) and "dequantize" in machine_sentence(fake)
    assert len(info["load_average"]) == 3 and all(x >= 0 for x in info["load_average"])
    assert "load average 2.5" in machine_sentence({**fake, "load_average": [2.5, 1.0, 1.0]})
    import logging  # bitsandbytes' warning about the optional `kernels` package (AVX512-BF16 CPUs) stays silent
    assert not logging.getLogger("bitsandbytes.backends.cpu.ops").isEnabledFor(logging.WARNING)


def test_pass_costs_time_a_draft_with_another_vocabulary():
    """bench=cross: the target's ids are out of the draft's range; the draft step is timed on ids it has."""
    from specdec.runtime.study import pass_costs
    from specdec.runtime.tiny import tiny_model

    target, draft = tiny_model("llama", vocab_size=64), tiny_model("llama", vocab_size=32)
    figures = pass_costs(target, draft, torch.tensor([[60, 61, 3]]), k=2, max_width=3)
    assert figures["draft_step_ms"] > 0 and figures["c"] > 0
    assert list(figures["pass_ms_by_width"]) == [1, 2, 3, 5] and figures["pass_cost_by_width"][1] == 1


def test_pass_ms_times_every_width_next_to_the_weights_read():
    """The runtime study's rounds: one pass of each width and one read of the weights, the cache cropped back."""
    from specdec.runtime.study import memory_bound_ms, pass_ms, weight_bytes
    from specdec.runtime.tiny import tiny_model

    model = tiny_model("llama", seed=0)
    ms, read_ms = pass_ms(model, torch.arange(1, 9)[None], [1, 2, 4], repeats=2)
    assert set(ms) == {1, 2, 4} and all(t > 0 for t in ms.values()) and read_ms > 0
    bound_ms, gbps = memory_bound_ms(model, repeats=2)
    assert bound_ms > 0 and gbps == pytest.approx(weight_bytes(model) / (bound_ms / 1000) / 1e9)


@pytest.mark.parametrize("overrides, message", [
    (["bench.repetitions=0"], "bench.repetitions must be an integer >= 1, got 0"),
    (["bench=batch", "bench.batching.sizes=[0]"], "bench.batching.sizes must be an integer >= 1, got 0"),
    (["bench=batch", "bench.batching.sizes=[]"], "bench.batching.sizes is empty"),
    (["bench=batch", "bench.batching.baseline=nosuch"], "bench.batching.baseline='nosuch' is not supported"),
    (["bench.reference=nosuch"], "bench.reference='nosuch' is not supported; choices: default, ar"),
])
def test_the_bench_keys_are_checked_before_anything_runs(overrides, message):
    """A bad bench key fails in milliseconds with its choices, not after the whole bench ran."""
    from hydra import compose, initialize_config_dir

    from experiments.bench.contenders import check_bench
    from experiments.run.settings import ConfigError

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("bench", overrides=[*TINY, *overrides])
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_bench(cfg.bench)


def test_a_contender_that_raises_while_running_is_recorded(tmp_path, monkeypatch):
    """A contender that raises in its second timed run (as Hugging Face's universal assisted generation does after
    rewriting the draft's output layer in place): recorded with its stage and error and not run again; the others
    finish, each contender's file is written, and the goal that needed it is not measured."""
    from hydra import compose, initialize_config_dir

    from experiments.bench.app import run_bench
    from experiments.bench.contenders import Failures, contenders_of
    from experiments.run.pair import Pairs
    from experiments.run.prompts import load_prompts
    from specdec.runtime.models import encode_prompt

    lookup = "bench.contenders.hf_lookup_default=['method=hf','hf=lookup','hf.prompt_lookup=10']"
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("bench", overrides=[*TINY, lookup])
        failures = Failures()
        contenders = contenders_of(cfg, TINY, Pairs(), ["default", "ar", "hf_lookup_default"], failures)
    calls, real = [], contenders["hf_lookup_default"].run

    def crash_on_the_second_timed_run(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the warm-up, the first prompt, then this
            raise RuntimeError("the assistant's output layer was replaced in place")
        return real(*args, **kwargs)

    monkeypatch.setattr(contenders["hf_lookup_default"], "run", crash_on_the_second_timed_run)
    prompts = load_prompts(cfg.dataset)
    tokenizer = contenders["default"].setup.pair.tokenizer
    ids = {p.id: encode_prompt(tokenizer, p.text, chat=cfg.dataset.chat) for p in prompts}
    result = run_bench(contenders, prompts, ids, max_new_tokens=4, pass_widths=2, failures=failures, out=tmp_path)
    assert len(prompts) == 3 and len(calls) == 3  # not run on the third prompt
    assert result["failed"]["hf_lookup_default"]["stage"] == "run"
    assert result["failed"]["hf_lookup_default"]["error"] == "RuntimeError: the assistant's output layer was replaced in place"
    assert set(result["contenders"]) == {"default", "ar"}
    assert {p.stem for p in (tmp_path / "contenders").glob("*.json")} == {"default", "ar"}
    goal = result["goals"]["vs_hf_prompt_lookup"]
    assert goal["value"] is None and goal["status"] == "not measured" and goal["failed_contenders"] == ["hf_lookup_default"]
    assert result["greedy_check"]["identical"]  # between the contenders that finished


def test_cross_vocab_vs_target_only_needs_only_target_only_beside_ours():
    """bench=cross reports our best cross-vocabulary configuration over target-only whether or not Hugging Face's
    universal assisted generation ran too; a same-vocabulary bench does not report it."""
    from experiments.bench.ratios import other_ratios
    from specdec.comparison import ContenderFigures

    def contender(tps):
        return {"owner": "ours", "drafts": "model", "tokens_per_second": {"median": tps},
                "by_category": {"chat": {"median": tps}, "code": {"median": tps}}}

    f = ContenderFigures({"ar": contender(10.0), "default": contender(10.3), "tli_auto": contender(9.8)})
    settings = {"max_new_tokens": 48, "draft": "StringDrafter(model=load_model(...))"}
    keys = other_ratios(f, {"settings": settings})
    assert keys["cross_vocab_vs_target_only"] == pytest.approx(1.03)
    assert "cross_vocab_vs_hf_uag" not in keys
    same_vocabulary = other_ratios(f, {"settings": {**settings, "draft": "ModelDrafter(model=load_model(...))"}})
    assert "cross_vocab_vs_target_only" not in same_vocabulary


def test_long_context_vs_short_is_the_decoding_rate_at_2048_over_64():
    """bench=context: the target's step after 2048 prompt tokens against after 64 (the prefill left out), held to its
    goal; not reported where either depth is missing."""
    from specdec.runtime.study import context_ratios

    rows = [{"prompt_tokens": 64, "target_step_ms_at_end": 20.0, "ar_ms_per_token": 30.0},
            {"prompt_tokens": 2048, "target_step_ms_at_end": 25.0, "ar_ms_per_token": 300.0}]
    ratios = context_ratios(rows)
    assert ratios == {"long_context_vs_short": 0.8}
    assert goal_entries(ratios)["long_context_vs_short"]["met"] is True
    assert context_ratios(rows[:1]) == {}
    beside = context_ratios(rows, {"64": 30.0, "2048": 12.0})  # llama-bench's tokens/s by depth (JSON keys)
    assert beside["llamacpp_long_context_vs_short"] == pytest.approx(0.4)
    assert beside["ar_vs_llamacpp_f32_long"] == pytest.approx(40.0 / 12.0)  # 1000 / 25 ms over 12 tokens/s
    assert goal_entries(beside)["ar_vs_llamacpp_f32_long"]["met"] is True


def test_llamacpp_ratios_compare_the_default_with_its_target_only_and_its_best_speculation():
    """bench=llamacpp: the default over llama.cpp's F32 target-only and over the faster of its speculative
    configurations, per category and then their geometric mean; nothing without llama.cpp's contenders."""
    from experiments.bench.ratios import llamacpp_ratios
    from specdec.comparison import ContenderFigures

    def contender(owner, drafts, chat, code):
        return {"owner": owner, "drafts": drafts, "tokens_per_second": {"median": (chat + code) / 2},
                "by_category": {"chat": {"median": chat}, "code": {"median": code}}}

    f = ContenderFigures({"ar": contender("ours", None, 40, 40), "default": contender("ours", "model", 80, 60),
                          "llamacpp_f32": contender("llamacpp", None, 50, 40),
                          "llamacpp_spec_k8": contender("llamacpp", "model", 40, 60),
                          "llamacpp_lookup": contender("llamacpp", "ngram", 55, 30)})  # fmt: skip
    keys = llamacpp_ratios(f)
    assert keys["default_vs_llamacpp_f32"] == pytest.approx((80 / 50 * 60 / 40) ** 0.5)
    assert keys["ar_vs_llamacpp_f32"] == pytest.approx((40 / 50 * 40 / 40) ** 0.5)
    assert keys["default_vs_llamacpp_speculative"] == pytest.approx((80 / 40 * 60 / 60) ** 0.5)  # k8: the better one
    assert llamacpp_ratios(ContenderFigures({"ar": f.c["ar"], "default": f.c["default"]})) == {}
