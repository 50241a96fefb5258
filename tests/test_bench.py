"""The benchmark machinery on tiny random Llama models: one repetition, bench.json keys, the greedy check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from experiments import bench, gpu_bench
from experiments.bench_figures import pooled_stats
from experiments.bench_scaling import run_scaling, scaling_table
from experiments.bench_table import bench_table
from experiments.contenders import CONTENDERS, EQUAL_WIDTH, Setting, check_identical
from experiments.goals import GOALS, ISSUE_9, goal_entries
from experiments.prompts import Prompt
from experiments.records import machine, machine_sentence, markdown_table, strict_json, write_result
from experiments.schedule import interleaved
from specdec import Sampling
from specdec.tiny import tiny_model

CATEGORIES = ["summarization", "retrieval", "code"]
MAX_WIDTH = 5


def tiny_pair() -> tuple:
    return tiny_model("llama", seed=0, vocab_size=96), tiny_model("llama", seed=1, vocab_size=96, n_layers=1)


def tiny_prompts() -> tuple[list[Prompt], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    prompts = [Prompt(f"p{i}", category, "") for i, category in enumerate(CATEGORIES)]
    # the second half repeats the first, so the n-gram drafters find matches
    ids = {p.id: torch.randint(0, 96, (1, 6), generator=g).repeat(1, 2) for p in prompts}
    return prompts, ids


@pytest.fixture(scope="module")
def result() -> dict:
    previous = torch.get_num_threads()  # a module fixture runs before conftest's one-thread fixture
    torch.set_num_threads(1)
    target, draft = tiny_pair()
    prompts, ids = tiny_prompts()
    setting = Setting(target, draft, k=3, nodes=4)
    names = tuple(CONTENDERS)  # the defaults and the rest: hf_plain, tree_hybrid, the chains as wide as a tree
    out = bench.run_bench(setting, prompts, ids, contenders=names, max_new_tokens=10, max_width=MAX_WIDTH)
    torch.set_num_threads(previous)
    return out


def test_bench_json_has_every_contender_ratio_and_goal(result, tmp_path):
    assert set(bench.DEFAULT_CONTENDERS) < set(CONTENDERS)
    assert set(result["contenders"]) == set(CONTENDERS)
    for key in GOALS:
        assert key in result["ratios"], key
        assert set(result["goals"][key]) >= {"value", "target", "met"}
    assert CONTENDERS[result["best_configuration"]].owner == "ours"
    assert result["costs"]["c"] > 0
    for figures in result["contenders"].values():
        assert figures["tokens_per_second"]["median"] > 0
        assert figures["tokens_per_second"]["n"] == 1
        assert set(figures["by_category"]) == set(CATEGORIES)
    ratios = result["ratios"]
    write_result(tmp_path, "bench", result, bench_table(result))
    loaded = json.loads((tmp_path / "bench.json").read_text())
    assert loaded["ratios"]["speedup_vs_hf_assisted"] == pytest.approx(ratios["speedup_vs_hf_assisted"])
    assert loaded["goals"]["vs_hf_prompt_lookup"]["target"] == GOALS["vs_hf_prompt_lookup"]
    table = (tmp_path / "bench.md").read_text()
    assert (
        "speedup_vs_hf_assisted" in table and "contender (tok/s) | code | retrieval | summarization" in table
    )


def test_issue_9_keys_name_their_contenders(result):
    """Every issue-9 ratio with value, target, met; the configuration it came from; chain vs tree; pass cost."""
    goals, best, c = result["goals"], result["best"], result["contenders"]
    for key in ISSUE_9:
        entry = goals[key]
        assert entry["target"] == GOALS[key] and isinstance(entry["value"], float), key
        assert entry["met"] == (entry["value"] >= entry["target"]), key
    ours = [n for n in c if CONTENDERS[n].owner == "ours" and CONTENDERS[n].drafts]
    assert goals["best_vs_target_only_geomean"]["contender"] == best["offline"] == result["best_configuration"]
    assert best["offline"] == max(ours, key=lambda n: result["vs_target_only"][n]["geomean"])
    assert goals["best_vs_target_only_geomean"]["value"] == result["vs_target_only"][best["offline"]]["geomean"]
    assert goals["best_vs_target_only_min_category"]["value"] == min(
        result["vs_target_only"][best["offline"]]["by_category"].values()
    )
    assert CONTENDERS[best["ngram"]].drafts == "ngram" and CONTENDERS[best["ngram"]].owner == "ours"
    assert CONTENDERS[best["model"]].drafts in ("model", "hybrid")
    assert goals["vs_hf_prompt_lookup"]["hf_best_fixed_k"] in (2, 3, 8)  # hf_lookup runs at the setting's k = 3
    ratios = result["ratios"]
    assert ratios["vs_hf_assisted"] == min(ratios["vs_hf_assisted_default"], ratios["vs_hf_assisted_fixed_k"])
    # chain vs tree at the same pass width, per drafter
    assert set(result["chain_vs_tree"]) == set(EQUAL_WIDTH)
    for entry in result["chain_vs_tree"].values():
        assert entry["pass_width"] == 5
        assert entry["chain"]["tokens_per_pass"] >= 1.0 and entry["tree"]["tokens_per_pass"] >= 1.0
        assert entry["tree"]["mean_tree_nodes"] <= 4
    # pass cost vs width, measured: 1..max_width and the chains' k + 1, 2k + 1
    costs = result["costs"]
    assert set(costs["pass_ms_by_width"]) == {1, 2, 3, 4, 5, 7}
    assert costs["pass_cost_by_width"][1] == 1.0 and costs["target_step_ms"] == costs["pass_ms_by_width"][1]
    # k="auto": the cost model's predicted rate next to the measured one, and the chosen k
    auto = {"spec_model_auto", "spec_ngram_auto", "tree_model_auto", "tree_ngram_auto", "spec_model_shared_auto",
            "tree_model_shared_auto"}  # fmt: skip
    assert {"spec_model_auto", "spec_ngram_auto"} <= set(result["cost_model"]) <= auto
    for entry in result["cost_model"].values():
        assert entry["predicted_tokens_per_second"] > 0 and entry["measured_tokens_per_second"] > 0
        assert len(entry["chosen_k_histogram"]) <= 9 and sum(entry["chosen_k_histogram"]) > 0
    table = bench_table(result)
    for key in ISSUE_9:
        assert key in table
    assert "Chain vs tree at the same pass width" in table and "| width | 1 | 2 | 3 | 4 | 5 | 7 |" in table


def test_pooled_chosen_k_histograms_add_up():
    run = {key: 1.0 for key in ("emitted", "drafted", "accepted", "target_forwards", "draft_forwards")}
    run.update(overlap_sum=0.5, overlap_count=1, tree_rounds=0, tree_nodes_sum=0, tree_depth_sum=0,
               predicted_tokens=2.0, predicted_seconds=1.0, measured_tokens=1, measured_seconds=2.0)
    pooled = pooled_stats([{**run, "chosen_k_histogram": [1, 2]}, {**run, "chosen_k_histogram": [0, 1, 4]}])
    assert pooled["chosen_k_histogram"] == [1, 3, 4]
    assert pooled["predicted_tokens_per_second"] == 2.0 and pooled["measured_tokens_per_second"] == 0.5


def test_greedy_outputs_of_all_contenders_are_identical(result):
    assert result["greedy_check"]["identical"], result["greedy_check"]["mismatches"]


def test_temperature_one_skips_the_output_check_and_says_so():
    target, draft = tiny_pair()
    prompts, ids = tiny_prompts()
    setting = Setting(target, draft, k=3, nodes=3, sampling=Sampling(temperature=1.0))
    names = ("ar", "spec_ngram", "tree_ngram", "tree_model_auto", "hf_lookup_default", "hf_assisted_default")
    out = bench.run_bench(setting, prompts[:2], ids, contenders=names, max_new_tokens=6, max_width=3)
    assert out["settings"]["temperature"] == 1.0
    # k = nodes: the fixed-k chain is the tree's equal-width partner
    assert out["chain_vs_tree"]["ngram"]["chain"]["contender"] == "spec_ngram"
    assert out["chain_vs_tree"]["ngram"]["pass_width"] == 4 and "model" not in out["chain_vs_tree"]
    assert out["greedy_check"]["identical"] is None and "temperature" in out["greedy_check"]["skipped"]
    assert "Output check skipped" in bench_table(out)
    assert set(out["goals"]) >= set(ISSUE_9)


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
    assert len(info["load_average"]) == 3 and all(x >= 0 for x in info["load_average"])
    assert "load average 2.5" in machine_sentence({**fake, "load_average": [2.5, 1.0, 1.0]})


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
    assert [int(w) for w in result["pass_ms_by_width"]] == list(gpu_bench.PASS_WIDTHS)
    loops = result["loops"]
    assert set(loops["tokens_per_second"]) == set(gpu_bench.LOOPS)
    assert {"spec_auto_1b", "tree_1b", "tree_auto_1b", "spec_ngram_auto", "tree_ngram_auto"} <= set(loops["stats"])
    assert all(loops["identical_to_ar"].values()), loops["identical_to_ar"]  # greedy: every loop, trees included
    assert loops["stats"]["tree_1b"]["mean_tree_nodes"] <= 7
    assert sum(loops["stats"]["spec_auto_1b"]["chosen_k_histogram"]) > 0
    assert set(loops["ours_vs_hf"]) == set(gpu_bench.RATIOS)
    assert result["machine"]["cpu"]["model"]
    assert (tmp_path / "gpu_bench.md").read_text().startswith(result["date"])
