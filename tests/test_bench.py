"""The benchmark machinery on tiny random Llama models: one repetition, bench.json keys, the greedy check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from experiments import bench, gpu_bench
from experiments.bench_results import bench_table
from experiments.bench_scaling import run_scaling, scaling_table
from experiments.contenders import CONTENDERS, Setting, check_identical, interleaved
from experiments.goals import GOALS, goal_entries
from experiments.prompts import Prompt
from experiments.records import machine, machine_sentence, markdown_table, strict_json, write_result
from specdec.tiny import tiny_model

CATEGORIES = ["summarization", "retrieval", "code"]


@pytest.fixture(scope="module")
def result() -> dict:
    target, draft = (
        tiny_model("llama", seed=0, vocab_size=96),
        tiny_model("llama", seed=1, vocab_size=96, n_layers=1),
    )
    g = torch.Generator().manual_seed(0)
    prompts = [Prompt(f"p{i}", category, "") for i, category in enumerate(CATEGORIES)]
    ids = {p.id: torch.randint(0, 96, (1, 12), generator=g) for p in prompts}
    return bench.run_bench(Setting(target, draft, k=3), prompts, ids, max_new_tokens=10, repetitions=1)


def test_bench_json_has_every_contender_ratio_and_goal(result, tmp_path):
    assert set(result["contenders"]) == set(bench.DEFAULT_CONTENDERS)
    for key in GOALS:
        assert key in result["ratios"], key
        assert set(result["goals"][key]) >= {"value", "target", "met"}
    assert result["best_configuration"] in ("spec_model", "spec_ngram")
    assert result["costs"]["c"] > 0
    for figures in result["contenders"].values():
        assert figures["tokens_per_second"]["median"] > 0
        assert figures["tokens_per_second"]["n"] == 1
        assert set(figures["by_category"]) == set(CATEGORIES)
    ratios = result["ratios"]
    assert ratios["vs_hf_assisted"] == min(ratios["vs_hf_assisted_default"], ratios["vs_hf_assisted_same_k"])
    write_result(tmp_path, "bench", result, bench_table(result))
    loaded = json.loads((tmp_path / "bench.json").read_text())
    assert loaded["ratios"]["speedup_vs_hf_assisted"] == pytest.approx(ratios["speedup_vs_hf_assisted"])
    assert loaded["goals"]["vs_hf_prompt_lookup"]["target"] == GOALS["vs_hf_prompt_lookup"]
    table = (tmp_path / "bench.md").read_text()
    assert (
        "speedup_vs_hf_assisted" in table and "contender (tok/s) | code | retrieval | summarization" in table
    )


def test_greedy_outputs_of_all_contenders_are_identical(result):
    assert result["greedy_check"]["identical"], result["greedy_check"]["mismatches"]


def test_greedy_check_catches_a_different_output():
    outputs = {
        "ar": {"p": [1, 2, 3]},
        "hf_plain": {"p": [1, 2, 3]},
        "hf_assisted": {"p": [1, 5, 3]},
        "hf_lookup": {"p": [1, 2]},
    }
    check = check_identical(outputs)
    assert not check["identical"]
    assert {(m["contender"], m["first_difference"]) for m in check["mismatches"]} == {
        ("hf_assisted", 1),
        ("hf_lookup", 2),
    }


def test_goal_entries_and_strict_json():
    entries = goal_entries({"vs_hf_assisted": 1.3, "vs_hf_prompt_lookup": float("nan"), "not_a_goal": 2.0})
    assert entries == {
        "vs_hf_assisted": {"value": 1.3, "target": 1.2, "met": True},
        "vs_hf_prompt_lookup": {"value": None, "target": 1.15, "met": None},
    }
    assert strict_json({"a": [float("inf"), 1.0], "b": float("nan")}) == {"a": [None, 1.0], "b": None}
    assert markdown_table(["x", "y"], [["a", 0.5], ["b", None]]).splitlines() == [
        "| x | y |",
        "|---|---|",
        "| a | 0.500 |",
        "| b | - |",
    ]


def test_interleaved_rotates_who_runs_first():
    order = list(interleaved(["a", "b", "c"], ["p", "q"], repetitions=2))
    assert len(order) == 12
    firsts = [order[i][2] for i in range(0, 12, 3)]
    assert firsts == ["a", "b", "c", "a"]


def test_machine_records_cpu_features_and_bitsandbytes_path():
    info = machine()
    assert info["cpu"]["model"] and info["packages"]["torch"]
    flags = info["cpu"]["flags"]
    assert isinstance(flags, str) or {"avx512_bf16", "amx_bf16", "avx2"} <= set(flags)
    bnb = info["bitsandbytes_cpu"]
    if bnb["installed"]:
        assert bnb["fused_4bit_gemv"] in (True, False)
        # bitsandbytes 0.50 registers the fused kernel only with AVX512-BF16
        assert bnb["fused_4bit_gemv"] <= bnb["has_avx512bf16"]
    fake = {
        **info,
        "cpu": {**info["cpu"], "flags": {"avx2": True, "avx512_bf16": False}},
        "bitsandbytes_cpu": {"installed": True, "4bit_path": "dequantize, then torch matmul"},
    }
    assert "CPU flags: avx2;" in machine_sentence(fake) and "dequantize" in machine_sentence(fake)


def test_unknown_contender_is_refused():
    with pytest.raises(SystemExit):
        bench.parse(["--contenders", "ar,warp_drive"])
    assert "spec_ngram" in CONTENDERS


def test_scaling_rows_have_every_contender():
    target = tiny_model("llama", seed=0, vocab_size=96)
    prompt = torch.randint(0, 96, (1, 8))
    filler = torch.randint(0, 96, (1, 64))
    out = run_scaling(Setting(target, None, k=2), prompt, lengths=[4, 8], prompt_lengths=[16], filler=filler)
    assert [r["new_tokens"] for r in out["by_max_new_tokens"]] == [4, 8]
    assert out["by_prompt_length"][0]["prompt_tokens"] == 16
    assert all(r["spec_ngram_ms_per_token"] > 0 for r in out["by_max_new_tokens"])
    assert "by_prompt_length" in scaling_table(out)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit path")
def test_gpu_bench_exits_cleanly_without_cuda():
    done = subprocess.run(
        [sys.executable, "-m", "experiments.gpu_bench"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0
    assert "no CUDA" in done.stdout
    assert gpu_bench.main is not None


def test_gpu_bench_dry_run_on_cpu(tmp_path):
    """The GPU script's whole path on toy shapes, so a GPU session does not spend device time on a bug."""
    assert (
        gpu_bench.main(
            ["--dry-run", "--context", "12", "--new-tokens", "6", "--repeats", "1", "--out", str(tmp_path)]
        )
        == 0
    )
    result = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert set(result["verify_ms_by_k"]) == {"1", "2", "4", "8", "16"}
    assert set(result["loops"]["tokens_per_second"]) == {
        "ar",
        "hf_plain",
        "spec_self",
        "hf_assisted_self",
        "spec_1b",
        "hf_assisted_1b",
    }
    assert result["loops"]["identical_to_ar"]["hf_plain"]
    assert result["machine"]["cpu"]["model"]
    assert (tmp_path / "gpu_bench.md").read_text().startswith(result["date"])
