"""Sweeps on Hydra launchers (experiments.run.jobs, experiments.sweeps, experiments.report) on the tiny random pair.

In `make test`: the threads a parallel job gets and the report over a sweep folder as the jobs leave it (markers,
multirun.yaml), without starting a sweep. In `make test-all`: real sweeps through hydra/launcher=joblib and
submitit_local (each job a process of its own), a job that fails, and a re-launch that skips the finished jobs.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.report import report
from experiments.run import jobs as run_jobs
from experiments.run.jobs import threads_per_job
from experiments.sweeps import (
    DONE,
    FAILED,
    expected_jobs,
    finished,
    mark_done,
    record_failure,
    start_afresh,
    sweep_status,
)
from specdec.runtime.machine import cores

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=tiny_random", "dataset.n_prompts=1", "max_new_tokens=6", "warmup_tokens=2"]


def sweep(folder: Path, *overrides: str, logger: str = "none", timeout: int = 300) -> subprocess.CompletedProcess:
    """python -m experiments.run -m <overrides> into folder (its hydra.sweep.dir); args[0] is the launching pid."""
    cmd = [sys.executable, "-m", "experiments.run", "-m", *TINY, f"logger={logger}", *overrides, f"hydra.sweep.dir={folder}"]
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        stdout, stderr = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess([p.pid, *cmd], p.returncode, stdout, stderr)


def environment(run: Path) -> dict:
    return json.loads((run / "environment.json").read_text())


def test_parallel_jobs_share_the_cores():
    """joblib with n_jobs jobs at once: each gets cores // n_jobs threads (auto too; a lower count is kept);
    submitit_local starts every job at once; the basic launcher leaves the setting alone."""
    joblib = OmegaConf.create({"n_jobs": 2})
    share = max(1, cores() // 2)
    assert threads_per_job("auto", "joblib", joblib, jobs=4) == share
    assert threads_per_job(None, "joblib", joblib, jobs=4) == share
    assert threads_per_job(64, "joblib", joblib, jobs=4) == share
    assert threads_per_job(1, "joblib", joblib, jobs=4) == 1
    assert threads_per_job("auto", "joblib", OmegaConf.create({"n_jobs": -1}), jobs=1) == cores()  # one job: all cores
    assert threads_per_job("auto", "submitit_local", OmegaConf.create({}), jobs=3) == max(1, cores() // 3)
    assert threads_per_job("auto", "submitit_slurm", OmegaConf.create({"cpus_per_task": 8}), jobs=3) == 8
    assert threads_per_job("auto", "basic", OmegaConf.create({}), jobs=3) == "auto"


@pytest.mark.parametrize("launcher, kind, threads", [
    ("basic", "basic", "auto"), ("joblib", "joblib", None), ("submitit_local", "submitit_local", None),
    ("slurm_gpu", "submitit_slurm", 8),
])  # fmt: skip
def test_each_launcher_config_composes_and_sets_the_threads(make_cfg, launcher: str, kind: str, threads):
    """hydra/launcher=<config> composes with the run's config (the plugins' own, and conf/hydra/launcher/); its kind
    decides a job's threads: the Slurm preset's cpus_per_task (8), a parallel launcher's share of the cores."""
    cfg = make_cfg("model=tiny_random", f"hydra/launcher={launcher}", hydra=True)
    assert run_jobs.launcher_kind(cfg.hydra.launcher) == kind
    share = max(1, cores() // 2)
    expected = threads if threads is not None else share
    assert threads_per_job("auto", kind, cfg.hydra.launcher, jobs=2) == expected


def fake_job(sweep_dir: Path, num: int, overrides: list[str]) -> Path:
    """The run folder Hydra creates for job num before the job starts (.hydra/overrides.yaml)."""
    folder = sweep_dir / str(num)
    (folder / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), folder / ".hydra" / "overrides.yaml")
    return folder


def test_status_of_a_partial_sweep(tmp_path: Path):
    """A sweep of 2 x 2 jobs while it runs: one finished, one failed (its error line), one started (its log's last
    line), one not started; the report lists them and says that no run finished with a summary yet."""
    task = ["model=tiny_random", "k=1,2", "temperature=0,1"]
    OmegaConf.save(OmegaConf.create({"hydra": {"sweeper": {"params": None}, "overrides": {"task": task}}}),
                   tmp_path / "multirun.yaml")  # fmt: skip
    jobs = expected_jobs(tmp_path)
    assert jobs == [["model=tiny_random", f"k={k}", f"temperature={t}"] for k in (1, 2) for t in (0, 1)]
    mark_done(fake_job(tmp_path, 0, jobs[0]), jobs[0], 1.5)
    try:
        raise ValueError("random:tiny-draft: random-weight models load unquantized")
    except ValueError as e:
        record_failure(fake_job(tmp_path, 1, jobs[1]), jobs[1], e, 0.5)
    (fake_job(tmp_path, 2, jobs[2]) / "run.log").write_text("loading\nprompt 3 of 7\n")
    assert finished(tmp_path / "0", jobs[0]) and not finished(tmp_path / "0", jobs[1])
    rows = sweep_status(tmp_path)
    assert [r["status"] for r in rows] == ["finished", "failed", "started, no marker (running or killed)", "not started"]
    assert rows[1]["detail"] == "ValueError: random:tiny-draft: random-weight models load unquantized"
    assert rows[2]["detail"].endswith("prompt 3 of 7") and rows[3]["run"] == "-"
    text = report(tmp_path)
    assert "4 job(s): 1 finished, 1 failed, 1 started, no marker (running or killed), 1 not started." in text
    assert "| 1 | k=1 temperature=1 | 1 | failed | ValueError: random:tiny-draft" in text
    assert "No finished run yet" in text
    (tmp_path / "0" / "results.jsonl").write_text("{}\n")
    start_afresh(tmp_path / "0")  # a job run again: no marker of the earlier attempt, its rows set aside
    start_afresh(tmp_path / "1")
    assert not any((tmp_path / n / m).exists() for n in "01" for m in (DONE, FAILED, "results.jsonl"))
    assert (tmp_path / "0" / "results.jsonl.replaced").read_text() == "{}\n"


@pytest.mark.exhaustive  # two sweeps of real processes (about 30 s on 2 cores)
def test_joblib_sweep_and_a_relaunch_that_skips_finished_jobs(tmp_path: Path):
    """k=1,2 through hydra/launcher=joblib: each job in a worker process of its own with its share of the cores, an
    offline W&B run grouped by the sweep, done.json last; then k=1,2,3 into the same folder runs only k=3, and the
    report has all three."""
    out = sweep(tmp_path, "k=1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", logger="wandb_offline")
    assert out.returncode == 0, out.stderr[-3000:]
    envs = [environment(tmp_path / str(n)) for n in (0, 1)]
    assert all(e["launch"]["wandb_group"] == tmp_path.name and e["launch"]["wandb_job_type"] == "joblib" for e in envs)
    assert all(list((tmp_path / str(n) / "wandb").glob("offline-run-*")) for n in (0, 1))
    assert all(e["launch"]["launcher"] == "joblib" and e["launch"]["jobs_in_sweep"] == 2 for e in envs)
    assert all(e["torch_threads"] == max(1, cores() // 2) and e["host"] and e["cpu"]["flags"] for e in envs)
    assert out.args[0] not in {e["launch"]["pid"] for e in envs}  # jobs ran in worker processes, not the launching one
    first = {n: (tmp_path / str(n) / DONE).read_text() for n in (0, 1)}
    again = sweep(tmp_path, "k=1,2,3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", logger="wandb_offline")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("skipped (finished earlier, skip_finished=true)") == 2
    assert {n: (tmp_path / str(n) / DONE).read_text() for n in (0, 1)} == first  # not run again
    assert environment(tmp_path / "2")["launch"]["jobs_in_sweep"] == 3
    text = report(tmp_path)
    assert "3 job(s): 3 finished." in text and "3 finished run(s)." in text


@pytest.mark.exhaustive  # a sweep of real processes (about 20 s on 2 cores)
def test_a_failing_job_leaves_the_others_and_the_report_lists_it(tmp_path: Path):
    """quantization=none,nf4 on the random pair: the nf4 job fails while loading (random weights load unquantized),
    the other finishes; the sweep exits non-zero, the report has the one run and names the failure."""
    out = sweep(tmp_path, "k=2", "quantization=none,nf4", "hydra/launcher=joblib")
    assert out.returncode != 0
    assert (tmp_path / "0" / DONE).exists() and not (tmp_path / "1" / DONE).exists()
    failure = json.loads((tmp_path / "1" / FAILED).read_text())
    assert "random-weight models load unquantized" in failure["error"] and failure["traceback"]
    text = report(tmp_path)
    assert "2 job(s): 1 finished, 1 failed." in text and "1 finished run(s)." in text
    assert "| 1 | quantization=nf4 | 1 | failed |" in text and "random-weight models load unquantized" in text
    redo = sweep(tmp_path, "k=2", "quantization=none", "skip_finished=false")  # asked to run it again: it does
    assert redo.returncode == 0 and "skipped" not in redo.stdout
    assert json.loads((tmp_path / "0" / DONE).read_text())["seconds"] > 0


@pytest.mark.exhaustive  # submitit's local executor: real jobs in processes of their own (about 30 s)
def test_submitit_local_sweep(tmp_path: Path):
    out = sweep(tmp_path, "k=1,2", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10")
    assert out.returncode == 0, out.stderr[-3000:]
    for n in (0, 1):
        env = environment(tmp_path / str(n))
        assert env["launch"]["launcher"] == "submitit_local" and (tmp_path / str(n) / DONE).exists()
        assert env["torch_threads"] == max(1, cores() // 2)
    assert list((tmp_path / ".submitit").glob("*/*_result.pkl"))  # submitit's own record of each job
    assert "2 job(s): 2 finished." in report(tmp_path)


def fake_run(folder: Path, k: int, speedup: float, device: str, flags: dict[str, bool]) -> None:
    """A finished run's summary.json and environment.json, as experiments.run writes them (the keys the report reads)."""
    folder.mkdir(parents=True)
    config = {"model": "tiny_random", "draft": "ModelDrafter", "draft_quantization": "none", "target_quantization": "none",
              "k": k, "tree": "none", "temperature": 0.0, "top_p": 1.0, "dataset": "bundled"}  # fmt: skip
    metrics = {"speedup": speedup, "tokens_per_second/autoregressive": 100.0 * (1 + k), "alpha": None, "c": None}  # null: no figures
    (folder / "summary.json").write_text(json.dumps({"config": config, "metrics": metrics}))
    env = {"device_name": device, "cpu": {"flags": flags}, "host": device.split()[0], "launch": {"launcher": "joblib"}}
    (folder / "environment.json").write_text(json.dumps(env))


def test_the_report_never_compares_timings_of_two_machines(tmp_path: Path):
    """k=1 and k=2 on one machine, k=4 on another (a faster one): the best k is chosen per machine, never across."""
    fake_run(tmp_path / "0", 1, 0.9, "AMD EPYC, 2 logical cores", {"avx2": True, "avx512f": False})
    fake_run(tmp_path / "1", 2, 1.1, "AMD EPYC, 2 logical cores", {"avx2": True, "avx512f": False})
    fake_run(tmp_path / "2", 4, 1.5, "AMD EPYC, 2 logical cores", {"avx2": True, "avx512f": True})
    text = report(tmp_path)
    assert "They ran on 2 different machines" in text
    best = pd.read_csv(tmp_path / "report" / "best_k.csv")
    by_machine = dict(zip(best["machine"], zip(best["k_tried"].astype(str), best["best_k"])))
    assert by_machine == {"AMD EPYC, 2 logical cores; avx2": ("1,2", 2),
                          "AMD EPYC, 2 logical cores; avx2, avx512f": ("4", 4)}  # fmt: skip
    runs = pd.read_csv(tmp_path / "report" / "runs.csv")
    assert runs["machine"].nunique() == 2


def test_then_runs_each_experiment_in_this_process_into_its_own_folder(tmp_path, monkeypatch):
    """`then=[article_pair]` (make run): the experiment composed as `experiment=article_pair threads=null` composes it,
    run with the same pair cache, into its own run folder with its config, its log and done.json."""
    from hydra import initialize_config_dir

    from experiments.run import app
    from experiments.run.pair import Pairs
    from experiments.run.settings import CONF_DIR

    calls = []

    def recorded(cfg, run_dir, overrides, pairs, launch):
        calls.append((cfg, run_dir, overrides, pairs))
        logging.getLogger("experiments.run.app").warning("ran")

    monkeypatch.setattr(app, "run_experiment", recorded)
    monkeypatch.chdir(tmp_path)
    pairs = Pairs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        run_jobs.run_then("article_pair", pairs)
    (cfg, run_dir, overrides, shared), = calls
    assert shared is pairs and overrides == ["experiment=article_pair", "threads=null"] and "hydra" not in cfg
    assert cfg.threads is None  # the threads the run before chose, not a second probe
    assert cfg.model.name == "gemma3_smollm2" and cfg.max_new_tokens == 32 and cfg.then == []
    assert run_dir.parent.parent == Path("outputs") and run_dir.name.endswith("_gemma3_smollm2")
    assert OmegaConf.load(run_dir / ".hydra" / "config.yaml").max_new_tokens == 32
    assert "ran" in (run_dir / "run.log").read_text() and (run_dir / "done.json").exists()


def test_then_runs_models_that_this_run_does_not_load_go_to_the_background(make_cfg):
    """make run's `then=[article_pair]`: its Gemma 3 target converts while the SmolLM2 run computes; SmolLM2, which
    this run loads itself, is not handed to the background process."""
    from hydra import initialize_config_dir

    from experiments.run.jobs import then_models

    runs = [make_cfg("then=[article_pair]"), make_cfg("model=gemma3_smollm2", "then=[article_pair]"), make_cfg()]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):  # as in the app: compose needs Hydra
        assert [then_models(cfg) for cfg in runs] == [["offline:gemma-3-270m"], [], []]
