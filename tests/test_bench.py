"""The benchmark: a Hydra app whose contenders are experiments.run configurations. On toy random-weight
Llama shapes (model=tiny_random, conf/bench/gpu.yaml's path on the CPU) and, composed only, on the
offline pair: bench.json's keys, the ratios and goals, the greedy check, scaling and memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.bench.goals import GOALS, ISSUE_9, target_of
from experiments.bench.ratios import EQUAL_WIDTH
from experiments.bench.table import bench_table
from experiments.run.settings import validate

pytestmark = pytest.mark.slow  # each bench is a subprocess that builds a dozen contenders
ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=tiny_random", "device=cpu", "dtype=float32", "dataset.n_prompts=3", "max_new_tokens=10"]
# the default bench's lookup contenders run the offline n-gram pair; on the toy pair they take its own target
LOOKUP_ON_TINY = {
    "spec_ngram": ["draft@model.draft=ngram"],
    "spec_ngram_auto": ["draft@model.draft=ngram", "k=auto"],
    "tree_ngram": ["draft@model.draft=ngram", "tree=ngram", "tree.depth=4", "tree.nodes=4"],
    "tree_ngram_auto": ["draft@model.draft=ngram", "tree=ngram", "k=auto", "tree.depth=8", "tree.nodes=16", "max_nodes=16"],
    "hf_lookup": ["method=hf", "hf=lookup"],
    "hf_lookup_k2": ["method=hf", "hf=lookup", "k=2"],
    "hf_lookup_k8": ["method=hf", "hf=lookup", "k=8"],
    "hf_lookup_default": ["method=hf", "hf=lookup", "hf.prompt_lookup=10"],
}  # fmt: skip


def contender_override(name: str, overrides: list[str]) -> str:
    return f"bench.contenders.{name}=[{','.join(repr(o) for o in overrides)}]"


def bench(out: Path, *overrides: str, bench_name: str = "bench", failing: tuple[str, ...] = ()) -> dict:
    """python -m experiments.bench with these overrides into `out`; its result. failing: contenders expected to
    fail (the bench then completes and exits with 1, naming them)."""
    done = subprocess.run(
        [sys.executable, "-m", "experiments.bench", *overrides, f"hydra.run.dir={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == (1 if failing else 0), done.stderr[-3000:]
    if failing:
        assert done.stderr.strip().endswith(f"without the failed contenders: {', '.join(failing)}"), done.stderr[-3000:]
    return json.loads((out / f"{bench_name}.json").read_text())


BROKEN = ["quantization=nf4"]  # a contender that fails while it loads: random-weight models load unquantized
OFFLINE_ONLY = ["packed_int8_auto"]  # the int8 copy's pair: random-weight models have no quantized copy


@pytest.fixture(scope="module")
def bench_result(tmp_path_factory) -> dict:
    """The default bench's contenders on the toy pair, three prompts, one repetition; and one that fails."""
    overrides = [*(contender_override(n, o) for n, o in LOOKUP_ON_TINY.items()), "+" + contender_override("broken", BROKEN),
                 *(f"~bench.contenders.{name}" for name in OFFLINE_ONLY)]
    out = tmp_path_factory.mktemp("bench")
    named = ["+bench.pairwise.batch_invariance_cost=[default,ar]", "+bench.agreements.greedy_agreement_bf16=default"]
    result = bench(out, *TINY, *overrides, *named, "bench.pass_widths=5", "bench.memory=false", "bench.load=null",
                   failing=("broken",))  # fmt: skip
    result["folder"] = out
    return result


def test_a_failing_contender_is_named_and_the_others_complete(bench_result):
    """The broken contender fails while it loads: bench.json and bench.md name it with its error, it has no
    figures, every other contender has its own file, written when it finished."""
    failed = bench_result["failed"]
    assert set(failed) == {"broken"} and failed["broken"]["stage"] == "build"
    assert "random-weight models load unquantized" in failed["broken"]["error"] and failed["broken"]["traceback"]
    assert "broken" not in bench_result["contenders"] and len(bench_result["contenders"]) == 19  # 18 + default
    written = {p.stem for p in (bench_result["folder"] / "contenders").glob("*.json")}
    assert written == set(bench_result["contenders"])
    assert "| broken | build | InstantiationException" in (bench_result["folder"] / "bench.md").read_text()
    for goal in bench_result["goals"].values():  # every goal here was measured; none blames the failure
        assert goal["value"] is not None and "status" not in goal


@pytest.mark.exhaustive  # make test: README's `python -m experiments.bench` composes and validates every contender (test_docs.py)
def test_every_default_contender_composes_and_validates(make_cfg) -> None:
    """Each contender of conf/bench/default.yaml is a valid experiments.run configuration (nothing loads)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("bench")
        assert cfg.logger.kind == "none" and cfg.method == "speculative"
        for name, delta in cfg.bench.contenders.items():
            job = compose("bench", overrides=list(delta))
            validate(job)
            assert job.method != "all", name


def test_bench_json_has_every_contender_ratio_and_goal(bench_result):
    names = set(bench_result["contenders"])
    assert "default" in names and {"ar", "hf_assisted", "tree_model_auto", "spec_ngram"} <= names
    assert bench_result["contenders"]["default"]["overrides"] == []  # the default run's own configuration
    assert bench_result["contenders"]["spec_ngram"]["overrides"] == LOOKUP_ON_TINY["spec_ngram"]
    own_bench = {"default_under_load_vs_target_only", "cross_vocab_vs_hf_uag", "cross_vocab_vs_target_only",
                 "batched_min_vs_target_only",
                 "batched_b4_vs_target_only", "head_vs_best_copy", "head_tokens_per_pass", "head_c",
                 "gemma3_head_vs_target_only", "long_context_vs_short", "ar_vs_llamacpp_f32_long",
                 "default_vs_llamacpp_f32", "default_vs_llamacpp_speculative", "ar_bf16_vs_ar_f32",
                 "ar_bf16_vs_llamacpp_bf16", "batch_invariance_cost", "greedy_agreement_bf16"}  # the load scenario,
    # bench=cross, bench=batch, bench=heads, bench=context, bench=llamacpp, bench=bf16
    for key in set(GOALS) - own_bench:
        assert key in bench_result["ratios"], key
        assert set(bench_result["goals"][key]) >= {"value", "target", "met"}
    # goals of a named pairwise ratio and of a named greedy agreement (bench=bf16's), here on the toy pair
    assert bench_result["goals"]["batch_invariance_cost"]["value"] == bench_result["pairwise"]["batch_invariance_cost"]
    assert bench_result["goals"]["greedy_agreement_bf16"] == {"value": 1.0, "target": 1.0, "met": True}
    assert bench_result["greedy_check"]["agreement"]["default"] == 1.0
    assert bench_result["contenders"][bench_result["best_configuration"]]["owner"] == "ours"
    short = bench_result["ratios"]["short_outputs_vs_target_only"]  # 10 new tokens: outputs that end early
    assert short == pytest.approx(bench_result["vs_target_only"]["default"]["geomean"])
    assert bench_result["costs"]["c"] > 0
    for figures in bench_result["contenders"].values():
        assert figures["tokens_per_second"]["median"] > 0 and figures["tokens_per_second"]["n"] == 1
        assert set(figures["by_category"]) == {"chat", "summarization", "translation"}
    assert bench_result["greedy_check"]["identical"], bench_result["greedy_check"]["mismatches"]
    # greedy: block verification accepts exactly what the token-level rule accepts
    assert bench_result["ratios"]["block_vs_token_tokens_per_pass"] == pytest.approx(1.0)
    table = bench_table(bench_result)
    assert "speedup_vs_hf_assisted" in table and "| spec_ngram | speculative | draft@model.draft=ngram |" in table


@pytest.mark.exhaustive  # a bench process and a memory process of its own: `make test-all`
def test_memory_of_each_contender_in_its_own_process(tmp_path):
    out = bench(tmp_path, *TINY, "bench.only=[default]", "bench.memory=true", "dataset.n_prompts=1", "bench.load=null")
    assert set(out["contenders"]) == set(out["memory"]) == {"default"}
    for memory in out["memory"].values():
        assert memory["peak_rss_mb"] >= memory["rss_after_loading_mb"] > 0


@pytest.mark.exhaustive  # two fresh processes under busy loops: `make test-all`
def test_load_runs_each_in_its_own_process(tmp_path):
    """The load scenario: target-only and the default each in a fresh process under a busy loop that stops 1 s
    into their generation; their ratio is a goal."""
    out = bench(tmp_path, *TINY, "bench.only=[default]", "bench.memory=false", "dataset.n_prompts=1",
                "bench.load.seconds=1")  # fmt: skip
    load = out["load"]
    assert load["seconds"] == 1 and load["processes"] == 1 and set(load["runs"]) == {"ar", "default"}
    for run in load["runs"].values():
        assert run["tokens"] == 10 and run["seconds"] > 0 and len(run["prompts"]) == 1
        assert run["load_stopped_s"] >= run["generation_started_s"]  # the load ran into the generation (until it
        # ended or 1 s had passed: a fast machine may finish 10 tokens sooner)
    ratio = out["ratios"]["default_under_load_vs_target_only"]
    assert ratio == pytest.approx(load["runs"]["default"]["tokens_per_second"] / load["runs"]["ar"]["tokens_per_second"])
    assert out["goals"]["default_under_load_vs_target_only"]["target"] == 0.97
    assert "default_under_load_vs_target_only" in (tmp_path / "bench.md").read_text()


def test_goal_keys_name_their_contenders(bench_result):
    """Every goal ratio with value, target, met; the configuration it came from; chain vs tree; pass cost."""
    goals, best, c = bench_result["goals"], bench_result["best"], bench_result["contenders"]
    for key in ISSUE_9:
        entry = goals[key]
        flags = [f for f, on in bench_result["machine"]["cpu"]["flags"].items() if on]
        assert entry["target"] == target_of(key, flags, greedy=True)[0] and isinstance(entry["value"], float), key
        assert entry["met"] == (entry["value"] >= entry["target"]), key
    ours = [n for n in c if c[n]["owner"] == "ours" and c[n]["drafts"]]
    assert goals["best_vs_target_only_geomean"]["contender"] == best["offline"] == bench_result["best_configuration"]
    assert best["offline"] == max(ours, key=lambda n: bench_result["vs_target_only"][n]["geomean"])
    assert goals["best_vs_target_only_min_category"]["value"] == min(
        bench_result["vs_target_only"][best["offline"]]["by_category"].values()
    )
    assert c[best["ngram"]]["drafts"] == "ngram" and c[best["ngram"]]["owner"] == "ours"
    assert c[best["model"]]["drafts"] in ("model", "hybrid")
    assert goals["vs_hf_prompt_lookup"]["hf_best_fixed_k"] in (2, 4, 8)  # hf_lookup runs at the default k = 4
    assert goals["vs_hf_prompt_lookup"]["against_k"] == 10
    ratios = bench_result["ratios"]
    assert ratios["vs_hf_assisted"] == min(ratios["vs_hf_assisted_default"], ratios["vs_hf_assisted_fixed_k"])
    assert set(bench_result["chain_vs_tree"]) == set(EQUAL_WIDTH)  # chains of k = 4 next to trees of 4 nodes
    for entry in bench_result["chain_vs_tree"].values():
        assert entry["pass_width"] == 5
        assert entry["chain"]["tokens_per_pass"] >= 1.0 and entry["tree"]["tokens_per_pass"] >= 1.0
        assert entry["tree"]["mean_tree_nodes"] <= 4
    costs = bench_result["costs"]  # pass cost vs width: 1..pass_widths and the chains' k + 1, 2k + 1
    assert set(costs["pass_ms_by_width"]) == {"1", "2", "3", "4", "5", "9"}
    assert costs["pass_cost_by_width"]["1"] == 1.0 and costs["target_step_ms"] == costs["pass_ms_by_width"]["1"]
    auto = {"spec_ngram_auto", "tree_model_auto", "tree_ngram_auto"}  # tiny_random's default runs k = 4
    assert {"tree_model_auto"} <= set(bench_result["cost_model"]) <= auto  # lookups may never warm up
    for entry in bench_result["cost_model"].values():
        assert entry["predicted_tokens_per_second"] > 0 and entry["measured_tokens_per_second"] > 0
        assert len(entry["chosen_k_histogram"]) <= 9 and sum(entry["chosen_k_histogram"]) > 0
    table = bench_table(bench_result)
    for key in ISSUE_9:
        assert key in table
    assert "Chain vs tree at the same pass width" in table and "| width | 1 | 2 | 3 | 4 | 5 | 9 |" in table
    assert "efficiency_vs_theory" in bench_result["ratios"] and "efficiency_vs_theory" not in GOALS  # reported, retired


@pytest.mark.exhaustive  # a bench process of its own; test_gpu_batch_study_on_toy_shapes runs in `make test`
def test_gpu_bench_config_on_toy_shapes(tmp_path):
    """bench=gpu's whole path on toy shapes on the CPU, so a GPU session does not spend device time on a bug;
    at temperature 1 the greedy check is skipped and says so."""
    out = bench(tmp_path, "bench=gpu", *TINY, "bench.repetitions=1", "temperature=1", "dataset.n_prompts=2")
    assert set(out["pairwise"]) == {
        "ar/hf_plain", "spec_self/hf_assisted_self", "default/hf_assisted_1b", "default_auto/hf_assisted_default_1b",
        "tree_1b/hf_assisted_default_1b", "tree_auto_1b/hf_assisted_default_1b",
        "spec_ngram_auto/hf_lookup_default", "tree_ngram_auto/hf_lookup_default",
    }  # fmt: skip
    assert all(v > 0 for v in out["pairwise"].values())
    assert out["contenders"]["spec_self"]["stats"]["alpha"] == pytest.approx(1.0)  # the target drafts for itself
    assert out["greedy_check"]["identical"] is None and "temperature" in out["greedy_check"]["skipped"]
    assert "Output check skipped" in (tmp_path / "bench.md").read_text()
    assert out["machine"]["cpu"]["model"] and out["command"].startswith("python -m experiments.bench bench=gpu")


@pytest.mark.exhaustive  # a bench process of its own; `make test-all`
def test_scaling_rows_have_every_contender(tmp_path):
    out = bench(
        tmp_path, "bench=scaling", *TINY, "bench.scaling.lengths=[4,8]", "bench.scaling.prompt_lengths=[300]",
        contender_override("spec_ngram", ["draft@model.draft=ngram"]), bench_name="scaling",
    )  # fmt: skip
    assert [r["new_tokens"] for r in out["by_max_new_tokens"]] == [4, 8]
    assert out["by_prompt_length"][0]["prompt_tokens"] == 300
    assert all(r["target_step_ms_at_end"] > 0 for r in [*out["by_max_new_tokens"], *out["by_prompt_length"]])
    assert all(r[f"{name}_ms_per_token"] > 0 for r in out["by_max_new_tokens"] for name in ("ar", "hf_plain", "spec_ngram"))
    assert "by_prompt_length" in (tmp_path / "scaling.md").read_text()


@pytest.mark.exhaustive  # a bench process of its own; `make test-all`
def test_gpu_batch_study_on_toy_shapes(tmp_path):
    """bench=gpu_batch's path on toy shapes: every contender at every size, ratios over target-only at the same
    size, the two batch goals with their flags, greedy rows identical to target-only's at batch 1."""
    out = bench(tmp_path, "bench=gpu_batch", *TINY, "bench.repetitions=1", "max_new_tokens=6",
                "bench.batching.sizes=[1,2,4]")  # fmt: skip
    assert out["sizes"] == [1, 2, 4] and out["rows"] == 4
    assert set(out["contenders"]) == {"ar", "hf_plain", "default", "default_auto"}
    for name, ratios in out["ratios"].items():
        for s in ("1", "2", "4"):
            expected = out["contenders"][name][s]["tokens_per_second"] / out["contenders"]["ar"][s]["tokens_per_second"]
            assert ratios[s] == pytest.approx(expected)
    assert out["batched_vs_target_only"] == out["ratios"]["default_auto"]
    goals = out["goals"]
    assert goals["batched_b4_vs_target_only"]["value"] == pytest.approx(out["ratios"]["default_auto"]["4"])
    assert goals["batched_min_vs_target_only"]["value"] == pytest.approx(min(out["ratios"]["default_auto"].values()))
    assert all(out["agreement"][name][s] == 1.0 for name in ("ar", "default", "default_auto") for s in ("1", "2", "4"))
    assert "ratio to target-only" in (tmp_path / "bench.md").read_text()




@pytest.mark.exhaustive  # compiles the toy target (seconds per graph, twice); tests/test_compiled.py covers the runtime
def test_runtime_study_writes_pass_costs_and_goals(tmp_path):
    """bench=runtime on the toy pair: each profile's pass costs over widths 1..3, the compile cold and warm (the
    warm one loaded from inductor's disk cache), outputs equal to eager target-only's, and the runtime goals; a
    profile with dtype=bfloat16 runs on a bf16 copy, checked against its own target-only."""
    result = bench(
        tmp_path, "bench=runtime", *TINY, "bench.runtime_study.max_width=3", "bench.runtime_study.repeats=2",
        "~bench.runtime_study.profiles.autotune", "~bench.runtime_study.profiles.autotune_bf16",
        "~bench.runtime_study.profiles.autotune_packed", "~bench.runtime_study.profiles.packed_cpp",
        "bench.runtime_study.profiles.compiled.widths=[1,2]",
        "bench.runtime_study.profiles.packed.widths=[1,2]", "bench.runtime_study.report=compiled",
        "bench.runtime_study.profiles.dynamic.widths=[3]", "bench.runtime_study.profiles.dynamic.cpp_wrapper=false",
        bench_name="runtime",
    )  # fmt: skip
    assert set(result["profiles"]) == {"eager", "compiled", "packed", "dynamic", "eager_bf16"}  # packed: where AVX-512 is
    bf16, eager = result["profiles"]["eager_bf16"], result["profiles"]["eager"]
    assert bf16["dtype"] == "bfloat16" and eager["dtype"] == "float32"
    compiled = result["profiles"]["compiled"]
    assert set(compiled["pass_cost"]) == {"1", "2", "3"} and compiled["pass_cost"]["1"] == 1.0
    assert compiled["compile"]["cold"]["misses"] == 2 and compiled["compile"]["warm"]["hits"] == 2
    dynamic = result["profiles"]["dynamic"]  # one graph for widths 1-3
    assert dynamic["compile"]["cold"]["misses"] == 1 and dynamic["compile"]["warm"]["hits"] == 1
    assert set(dynamic["pass_cost"]) == {"1", "2", "3"} and dynamic["logits_max_abs_diff_vs_eager"] < 1e-4
    assert all(p["outputs_equal_eager_target_only"] for p in result["profiles"].values())
    assert compiled["logits_max_abs_diff_vs_eager"] < 1e-4
    assert result["profiles"]["packed"]["logits_max_abs_diff_vs_eager"] < 1e-4
    assert set(result["goals"]) == {"pass_cost_max_width_2_to_5", "pass_cost_width_9", "target_step_vs_memory_bound",
                                    "ar_vs_hf_plain"}
    assert result["goals"]["pass_cost_width_9"]["met"] is None  # widths above 3 were not measured
    assert "Memory bound" in (tmp_path / "runtime.md").read_text()
