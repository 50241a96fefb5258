"""`make gpu-check` (scripts/gpu_check.py) rehearsed on the CPU with toy shapes: its one JSON holds every part with
sane figures, the GPU tests' counts come from pytest's own report, and the time budget skips or stops parts with a
recorded reason instead of running past it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from specdec.runtime.compiled import compiled_forward

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from gpu_check import SHAPES, Budget, OutOfTime, failed, gpu_tests, load_pair, main, pass_cost_grid, run_part

TINY = SHAPES["tiny"]


@pytest.mark.xdist_group("inductor")  # it compiles: on the worker that has paid inductor's first compile
@pytest.mark.exhaustive  # 9-11 s of compiling: `make test-all`
def test_the_rehearsal_writes_one_json_with_every_part(tmp_path, capsys):
    out = tmp_path / "gpu-check.json"
    argv = ["--device", "cpu", "--shapes", "tiny", "--no-tests", "--repeats", "2", "--repetitions", "1",
            "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["command"].endswith("scripts/gpu_check.py " + " ".join(argv))
    assert result["machine"]["torch"] and result["machine"]["device_name"] and result["machine"]["git_commit"]
    parts = result["parts"]
    assert parts["gpu_tests"] == {"skipped": "--no-tests"}
    assert all(parts[name]["seconds"] > 0 for name in ("load", "target_only_vs_hf", "pass_costs"))
    assert 0 < result["seconds"] < result["budget_s"]

    versus = parts["target_only_vs_hf"]
    assert versus["target_only_compiled"] and versus["outputs_equal"] and versus["first_difference"] is None
    assert len(versus["target_only_tokens"]) == TINY.new_tokens and versus["target_only_tokens"] == versus["hf_tokens"]
    assert min(rate["median"] for rate in versus["tokens_per_s"].values()) > 0 and versus["target_only_over_hf"] > 0

    grid = parts["pass_costs"]
    assert grid["skipped"] == [] and grid["buckets"] == {"1": 1, "2": 4, "3": 4, "4": 4, "5": None, "6": None}
    assert set(grid["by_depth"]) == {str(d) for d in TINY.depths}
    for row in grid["by_depth"].values():
        assert set(row["target_pass_ms_by_width"]) == {str(w) for w in TINY.widths}
        assert min(row["target_pass_ms_by_width"].values()) > 0 and row["target_pass_cost_by_width"]["1"] == 1.0
        assert row["draft_step_ms"] > 0 and row["c"] == pytest.approx(row["draft_step_ms"]
                                                                      / row["target_pass_ms_by_width"]["1"])
    target = result["runtimes"]["target"]
    assert target["compiled"] and target["eager_reason"] is None and target["cuda_graphs"] is None  # (a CPU)
    assert set(target["compile_seconds"]) == {"1x1", "1x4"} and result["runtimes"]["draft"]["compiled"]
    assert "outputs equal" in capsys.readouterr().out


def test_the_gpu_tests_part_counts_pytests_report(tmp_path):
    """Part 1 on a test file of its own: the gpu-marked tests run (one passes, one fails, one skips), the others
    not, and the counts and the failure's id come from the JUnit XML report."""
    tests = tmp_path / "test_marked.py"
    tests.write_text("import pytest\npytestmark = pytest.mark.gpu\n\n"
                     "def test_passes():\n    pass\n\n"
                     "def test_fails():\n    assert False\n\n"
                     "@pytest.mark.skip(reason='no device')\ndef test_skips():\n    pass\n")
    (tmp_path / "test_unmarked.py").write_text("def test_not_selected():\n    assert False\n")
    record = gpu_tests("cpu", workers=0, timeout_s=60, path=tmp_path)
    assert {key: record[key] for key in ("tests", "passed", "failed", "errors", "skipped")} == {
        "tests": 3, "passed": 1, "failed": 1, "errors": 0, "skipped": 1}
    assert record["returncode"] == 1 and len(record["not_passed"]) == 1
    assert record["not_passed"][0].endswith("test_marked::test_fails")  # the class name holds the path from the
    # rootdir where pytest runs from elsewhere (a clone under /tmp, as tmp_path is)
    assert failed({"parts": {"gpu_tests": record}}) == [f"gpu_tests: {record['not_passed']}"]


def test_a_part_past_the_budget_is_skipped_or_stopped_with_what_it_measured():
    now = [0.0]
    budget = Budget(100.0, clock=lambda: now[0])
    parts: dict = {}
    now[0] = 60.0
    assert "skipped" in run_part(parts, "compile", budget, 50.0, lambda record: record.update(ran=True))

    def stops(record):
        record["measured"] = 1.5
        raise OutOfTime("the budget of 100 s ran out")

    assert run_part(parts, "grid", budget, 10.0, stops) == {"measured": 1.5, "stopped": "the budget of 100 s ran out",
                                                           "seconds": pytest.approx(0.0, abs=1.0)}
    assert "error" in run_part(parts, "broken", budget, 0.0, lambda record: 1 / 0)
    assert failed({"parts": parts}) == ["grid: the budget of 100 s ran out",
                                        "broken: ZeroDivisionError: division by zero"]

    short = Budget(0.1)  # SIGALRM at the end of a real budget stops a part that runs on
    with pytest.raises(OutOfTime), short.hard_stop():
        time.sleep(5)


def test_measurements_that_would_not_fit_are_skipped_with_their_reason():
    """With the budget spent, no pass runs (none compiles): each is listed with the seconds it would have needed."""
    target, draft = load_pair(TINY, "cpu")
    grid: dict = {}
    pass_cost_grid(grid, target, draft, TINY, "cpu", repeats=2, budget=Budget(0.0))
    assert len(grid["skipped"]) == len(TINY.depths) * (len(TINY.widths) + 1)
    assert {entry["model"] for entry in grid["skipped"]} == {"target", "draft"}
    assert all("needs about" in entry["reason"] for entry in grid["skipped"])
    assert all(row == {"target_pass_ms_by_width": {}} for row in grid["by_depth"].values())
    assert not compiled_forward(target).record.seconds
