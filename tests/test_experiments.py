"""Smoke runs of experiments.run and experiments.report on the offline pair (CPU, a few tokens)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.report import report
from experiments.run import app as run_module
from experiments.run.app import run_experiment

pytestmark = pytest.mark.slow  # every test loads the offline pair: start them early (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
SMOKE = [  # the weak pair loads without quantizing: the fastest pair with all three methods
    "model=smollm2_weak",
    "dataset.categories=[chat,qa]",  # two short prompts: a long one's prefill and scoring would double the time
    "max_new_tokens=8",
    "warmup_tokens=2",
    "threads=1",
]
FIGURES = {"tokens_per_second", "acceptance_by_position", "accepted_length", "speedup_vs_theory"}
NGRAM = ["dataset.n_prompts=2", "max_new_tokens=12", "warmup_tokens=2", "threads=1"]  # with an n-gram pair


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, make_cfg) -> Path:
    """One offline run with W&B offline into a temporary folder, shared by the checks below."""
    folder = tmp_path_factory.mktemp("run")
    run_experiment(make_cfg(*SMOKE, "logger=wandb_offline"), folder)
    return folder


def test_run_writes_results_summary_figures_and_wandb(run_dir: Path) -> None:
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 3  # 2 prompts x (target-only, speculative, naive)
    assert {r["method"] for r in rows} == {"autoregressive", "speculative", "naive"}
    for name in ("summary.md", "summary.csv", "summary.json", "environment.json"):
        assert (run_dir / name).stat().st_size > 0, name
    assert {p.stem for p in (run_dir / "figures").glob("*.png")} == FIGURES
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["git_commit"] and env["packages"]["torch"] and env["device_name"]


def test_run_summary_has_stable_metric_names(run_dir: Path) -> None:
    metrics = json.loads((run_dir / "summary.json").read_text())["metrics"]
    for name in (
        "acceptance_rate", "mean_accepted_length", "alpha", "speedup", "theoretical_speedup", "c",
        "tokens_per_second/autoregressive", "tokens_per_second/speculative", "tokens_per_second/naive",
        "peak_memory_mb/autoregressive", "peak_memory_mb/speculative", "peak_memory_mb/naive",
        "decode_tokens_per_second/autoregressive", "decode_tokens_per_second/speculative",
    ):  # fmt: skip
        assert name in metrics, name
    summary = (run_dir / "summary.md").read_text()
    assert "naive method" in summary and "| speculative |" in summary and "decode_tokens_per_second" in summary
    table = pd.read_csv(run_dir / "summary.csv", index_col=0)  # after the prefill: faster; naive times none apart
    decode, methods = table["decode_tokens_per_second"], ["autoregressive", "speculative"]
    assert (decode[methods] > table.loc[methods, "tokens_per_second"]).all() and pd.isna(decode["naive"])


def test_greedy_speculative_output_is_the_targets(run_dir: Path) -> None:
    """At temperature 0 speculative decoding returns exactly the target's greedy text; naive need not."""
    rows = pd.read_json(run_dir / "results.jsonl", lines=True)
    by = rows.pivot(index="prompt_id", columns="method", values="text")
    assert (by["speculative"] == by["autoregressive"]).all()
    spec = rows[rows["method"] == "speculative"]
    assert (spec["agreement"] == 1.0).all()
    naive = rows[rows["method"] == "naive"]
    assert naive["article_log_likelihood"].notna().all()
    assert (naive["weights_mb"] > rows[rows["method"] == "autoregressive"]["weights_mb"].max()).all()


def summary_and_rows(folder: Path) -> tuple[dict, pd.DataFrame]:
    summary = json.loads((folder / "summary.json").read_text())
    return summary, pd.read_json(folder / "results.jsonl", lines=True)


def check_rounds(summary: dict, rows: pd.DataFrame, longest: int) -> pd.DataFrame:
    """What every speculative run logs about its rounds; returns its speculative rows."""
    metrics, histograms = summary["metrics"], summary["histograms"]
    spec = rows[rows["method"] == "speculative"]
    rounds = int(spec["target_forwards"].sum())
    assert metrics["rounds"] == rounds > 0
    assert metrics["tokens_per_pass/speculative"] == pytest.approx(spec["emitted"].sum() / rounds)
    assert metrics["tokens_per_pass/autoregressive"] == 1.0
    depth = histograms["accepted_depth"]
    assert len(depth) == longest + 1 and sum(depth) == rounds  # one count per depth 0..longest
    assert metrics["accepted_depth_mean"] == pytest.approx(sum(d * n for d, n in enumerate(depth)) / rounds)
    assert (spec["chosen_k"].map(len) == spec["target_forwards"]).all()  # one chosen k per round
    by = rows.pivot(index="prompt_id", columns="method", values="text")  # greedy: exactly the target's text
    assert (by["speculative"] == by["autoregressive"]).all()
    assert metrics["agreement/speculative"] == 1.0
    return spec


@pytest.fixture(scope="module")
def auto_dir(tmp_path_factory, make_cfg) -> Path:
    """model=smollm2_ngram_auto (k=auto), W&B offline."""
    folder = tmp_path_factory.mktemp("auto")
    run_experiment(make_cfg("model=smollm2_ngram_auto", *NGRAM, "logger=wandb_offline"), folder)
    return folder


@pytest.mark.xdist_group("smollm2_ngram")
def test_k_auto_run_logs_chosen_k_and_the_cost_model(auto_dir: Path) -> None:
    summary, rows = summary_and_rows(auto_dir)
    config = summary["config"]
    assert (config["k"], config["k_max"], config["tree"]) == ("auto", 8, "none")
    spec = check_rounds(summary, rows, longest=8)
    metrics, chosen = summary["metrics"], summary["histograms"]["chosen_k"]
    assert len(chosen) == 9 and sum(chosen) == metrics["rounds"]  # k = 0..k_max, plain steps included
    later = spec.iloc[1:]  # one cost model for the run: it warms up once (on the warm-up and first prompt)
    assert len(later)
    for _, row in later.iterrows():  # then prices every round of the later prompts (no warm-up per prompt)
        assert row["measured_tokens"] == sum(n + 1 for n in row["accepted_per_round"])
    assert metrics["chosen_k_mean"] == pytest.approx(sum(k * n for k, n in enumerate(chosen)) / sum(chosen))
    assert all(0 <= k <= 8 for ks in spec["chosen_k"] for k in ks)
    assert metrics["predicted_tokens_per_second"] > 0 and metrics["measured_tokens_per_second"] > 0
    assert metrics["predicted_over_measured"] == pytest.approx(
        metrics["predicted_tokens_per_second"] / metrics["measured_tokens_per_second"]
    )
    assert "theoretical_speedup" not in metrics  # Thm 3.8 needs a fixed k
    text = (auto_dir / "summary.md").read_text()
    assert "tokens per target pass" in text and "Chosen k: mean" in text and "Cost model" in text
    assert {p.stem for p in (auto_dir / "figures").glob("*.png")} == {
        "tokens_per_second", "acceptance_by_position", "accepted_length", "chosen_k",
    }  # fmt: skip
    assert list((auto_dir / "wandb").glob("offline-run-*/run-*.wandb"))


@pytest.fixture(scope="module")
def tree_dir(tmp_path_factory, make_cfg) -> Path:
    """model=smollm2_ngram tree=ngram: a trie of prompt-lookup matches per pass."""
    folder = tmp_path_factory.mktemp("tree")
    run_experiment(make_cfg("model=smollm2_ngram", "tree=ngram", *NGRAM, "logger=none"), folder)
    return folder


@pytest.mark.xdist_group("smollm2_ngram")
def test_tree_run_logs_tree_size_and_accepted_depth(tree_dir: Path) -> None:
    summary, rows = summary_and_rows(tree_dir)
    config = summary["config"]
    assert (config["tree"], config["tree_node_budget"], config["tree_depth"]) == ("NGramTreeDrafter", 8, 8)
    spec = check_rounds(summary, rows, longest=8)
    metrics = summary["metrics"]
    nodes = [n for ns in spec["tree_nodes"] for n in ns]
    assert len(nodes) == metrics["rounds"] and max(nodes) <= 8
    assert metrics["tree_nodes_mean"] == pytest.approx(sum(nodes) / len(nodes))
    assert 0 < metrics["tree_depth_mean"] <= 8
    assert all(k <= 8 for ks in spec["chosen_k"] for k in ks)  # the tree's depth, cut by the token budget
    assert "Tree size:" in (tree_dir / "summary.md").read_text()


def test_report_on_a_run(run_dir: Path) -> None:
    text = report(run_dir)
    out = run_dir / "report"
    assert "Best k" in text
    assert (out / "runs.csv").exists() and (out / "best_k.csv").exists()
    assert {p.stem for p in out.glob("*.png")} == {"speedup_vs_k", "alpha", "measured_on_theory"}


def test_interrupted_run_keeps_finished_prompts(tmp_path: Path, monkeypatch, make_cfg) -> None:
    """Ctrl-C after the first prompt: its rows, a summary from them, and a clean exit code 130."""
    real = run_module.rows_of
    calls = []

    def interrupt_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "rows_of", interrupt_second)
    with pytest.raises(SystemExit) as stop:
        run_experiment(make_cfg(*SMOKE, "logger=none"), tmp_path)
    assert stop.value.code == 130
    rows = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(rows) == 3  # the first prompt's three methods
    assert json.loads((tmp_path / "summary.json").read_text())["prompts_done"] == 1


@pytest.mark.exhaustive  # two processes; run_experiment and report run in-process in `make test`
def test_cli_sweep_and_report(tmp_path: Path) -> None:
    """`python -m experiments.run -m k=2,auto ...` then `python -m experiments.report <sweep folder>`."""
    sweep = tmp_path / "sweep"
    args = ["model=smollm2_ngram", "dataset.n_prompts=1", "max_new_tokens=6", "warmup_tokens=2", "threads=1"]
    out = subprocess.run(
        [sys.executable, "-m", "experiments.run", "-m", "k=2,auto", *args, "logger=none",
         f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(list(sweep.glob("*/summary.json"))) == 2
    out = subprocess.run(
        [sys.executable, "-m", "experiments.report", str(sweep)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    best = pd.read_csv(sweep / "report" / "best_k.csv")
    assert best["k_tried"].astype(str).tolist() == ["2"]  # k=auto has no single k
    scheduled = pd.read_csv(sweep / "report" / "schedule.csv")
    assert scheduled["schedule"].tolist() == ["k=auto"] and scheduled["chosen_k_mean"].notna().all()


@pytest.mark.exhaustive  # a batched run of its own; tests/test_batch.py checks the batched loop in `make test`
def test_batched_run_groups_prompts_and_reports_throughput(tmp_path: Path, make_cfg) -> None:
    """batch_size=2: both prompts in one batch for every method; greedy rows equal target-only's; throughput is
    every row's tokens over the batch's wall time, and each row keeps its own latency."""
    run_experiment(make_cfg(*SMOKE, "batch_size=2", "logger=none"), tmp_path)
    summary, rows = summary_and_rows(tmp_path)
    assert summary["config"]["batch_size"] == 2
    assert set(rows["batch"]) == {0} and set(rows["batch_size"]) == {2}
    assert set(rows["method"]) == {"autoregressive", "speculative", "naive"}
    spec = rows[rows["method"] == "speculative"]
    assert (spec["agreement"] == 1.0).all()  # every row exactly the target's greedy output
    base = rows[rows["method"] == "autoregressive"]
    throughput = base["emitted"].sum() / base["batch_seconds"].iloc[0]
    table = pd.read_csv(tmp_path / "summary.csv", index_col=0)
    assert table.loc["autoregressive", "tokens_per_second"] == pytest.approx(throughput)
    assert (base["seconds_total"] <= base["batch_seconds"] + 1e-6).all()  # a row's latency is within its batch


def test_the_summary_says_where_greedy_outputs_part_and_why():
    """A greedy speculative output that left target-only's (a target that is not batch-invariant: bf16, quantized):
    one sentence with the first token where they part, the prompt, and that it is rounding; none when identical."""
    from experiments.run.summary import rounding_sentence

    rows = pd.DataFrame({"method": ["autoregressive", "speculative", "speculative", "naive"],
                         "prompt_id": ["a", "a", "b", "a"], "parted_at": [None, 17.0, 5.0, 0.0],
                         "dtype": "bfloat16", "target_quantization": "none"})  # fmt: skip
    sentence = rounding_sentence(rows, greedy=True)
    assert "on 2 of 2 outputs, first at token 5 of prompt b" in sentence and "rounding" in sentence
    assert rounding_sentence(rows.assign(parted_at=None), greedy=True) == ""
    assert rounding_sentence(rows, greedy=False) == ""
