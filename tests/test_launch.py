"""`ablate sweep` end to end on the local and debug executors: skip what is done, retry failed runs only
when asked, never start a run that is running elsewhere, exit codes, status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ablate.store import rundir
from in_process import ablate

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "grids" / "tiny.yaml"


def sweep(args: list[str], cwd: Path, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ablate.cli", "sweep", *args, "--poll", "0.2"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def sweep_here(args: list, cwd: Path):
    """`ablate sweep` in this process: for the debug executor, and sweeps that submit nothing."""
    return ablate(["sweep", *args, "--poll", "0.2"], cwd)


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory, data_root):
    """The tiny grid run once with the local executor (each run a submitit subprocess)."""
    root = tmp_path_factory.mktemp("local")
    grid = yaml.safe_load(TINY.read_text())
    grid["launcher"] = {"executor": "local", "local": {"parallel": 2}}
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(grid))
    # a machine with two GPUs, as far as the sweep can tell: each job at once must get one of its own (on
    # this CPU-only machine the job's torch sees no GPU either way and trains on the CPU)
    result = sweep([str(path), "--results", str(root / "results")], root, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    return root, path, result


@pytest.mark.slow
def test_local_executor_runs_every_arm_and_collects(local_sweep):
    root, _, result = local_sweep
    assert result.returncode == 0, result.stdout + result.stderr
    assert "summary: 3 done, 0 failed" in result.stdout
    assert "pending" in result.stdout and "done 3" in result.stdout  # progress lines
    runs = pd.read_parquet(root / "results" / "tiny" / "runs.parquet")
    assert sorted(runs["schedule"]) == ["clm_detour", "clm_detour", "mlm"]
    assert set(runs["status"]) == {"done"}
    assert runs["token_hash"].nunique() == 1
    for status in (root / "results" / "tiny" / "runs").glob("*/status.json"):
        recorded = json.loads(status.read_text())
        assert recorded["executor"] == "local" and recorded["total_time_s"] >= recorded["wall_time_s"] > 0


def test_local_jobs_running_at_once_each_see_a_gpu_of_their_own(local_sweep):
    root, _, result = local_sweep
    runs = root / "results" / "tiny" / "runs"
    seen = {d.name: json.loads((d / "status.json").read_text())["cuda_visible_devices"] for d in runs.iterdir()}
    assert set(seen.values()) == {"0", "1"}, seen
    started_together = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("submitted ")][
        :2
    ]
    assert len(started_together) == 2 and seen[started_together[0]] != seen[started_together[1]], result.stdout


@pytest.mark.slow
def test_running_the_same_sweep_again_submits_nothing(local_sweep):
    root, path, _ = local_sweep
    again = sweep_here([path, "--results", root / "results"], root)
    assert again.returncode == 0
    assert "to run 0; already done 3" in again.stdout and "nothing to submit" in again.stdout


@pytest.mark.slow
def test_failed_runs_are_retried_only_when_asked(tmp_path, data_root):
    first = sweep_here([TINY, "--executor", "debug", "--results", str(tmp_path / "r")], tmp_path)
    assert first.returncode == 0, first.stderr
    run_dir = sorted((tmp_path / "r" / "tiny" / "runs").iterdir())[0]
    rundir.write_status(run_dir, "failed", error="Traceback...\nRuntimeError: out of memory on node 7")

    status = ablate(["status", "tiny", "--results", str(tmp_path / "r")], tmp_path)
    assert "failed" in status.stdout and "out of memory on node 7" in status.stdout

    skipped = sweep_here([TINY, "--executor", "debug", "--results", str(tmp_path / "r")], tmp_path)
    assert skipped.returncode == 1
    assert "failed (not retried; --retry-failed) 1" in skipped.stdout
    assert f"failed {run_dir.name}: log" in skipped.stdout

    retried = sweep_here(
        [TINY, "--executor", "debug", "--retry-failed", "--results", str(tmp_path / "r")], tmp_path
    )
    assert retried.returncode == 0, retried.stdout
    assert "to run 1;" in retried.stdout and rundir.read_status(run_dir)["state"] == "done"


@pytest.mark.slow
def test_a_corrupt_status_is_reported_set_aside_and_the_run_resumes_from_its_checkpoint(tmp_path, data_root):
    from ablate.config.grid import load_grid
    from ablate.launch import worker
    from ablate.launch.scheduler import status_rows, write_sweep_manifest
    from ablate.plan.grid import expand
    from ablate.store.sweep import SweepFolder

    grid = yaml.safe_load(TINY.read_text())
    grid["axes"] = {"schedule": ["clm_detour"], "freeze": ["none"]}  # one run: clm 3 steps, mlm_decay 2
    grid.pop("exclude")
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(grid))
    runs = expand(load_grid(path))
    folder = SweepFolder(tmp_path / "r" / "tiny")
    write_sweep_manifest(folder, load_grid(path), path, runs)
    run_dir = folder.run(runs[0].run_id)
    assert worker.execute(run_dir, stop_after_steps=3) == "interrupted"  # a checkpoint at step 3
    garbage = '{"state": "interrupted", "attempts": 1, "upd'
    (run_dir / "status.json").write_text(garbage)

    [row] = status_rows(folder)
    assert row["state"] == "corrupt" and "checkpoints/step-000000003-p1 (step 3)" in row["detail"]

    result = sweep_here([path, "--executor", "debug", "--results", str(tmp_path / "r")], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"warning: run {run_dir.name}: {run_dir / 'status.json'} is corrupt: not JSON" in result.stdout
    assert f"moved to {run_dir / 'status.json.corrupt-1'} (kept)" in result.stdout
    assert "the worker resumes from checkpoints/step-000000003-p1 (step 3)" in result.stdout
    assert "to run 1;" in result.stdout
    assert (run_dir / "status.json.corrupt-1").read_text() == garbage
    assert "resumed from step-000000003-p1" in (run_dir / "log.txt").read_text()
    status = rundir.read_status(run_dir)
    assert status["state"] == "done" and status["recovered"]["corrupt_file"] == "status.json.corrupt-1"
    curves = json.loads((run_dir / "records" / "curves.json").read_text())
    assert curves["step"] == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_a_run_locked_by_another_process_is_not_started_again(tmp_path, data_root):
    from ablate.config.grid import load_grid
    from ablate.plan.grid import expand

    run_id = expand(load_grid(TINY))[0].run_id
    run_dir = tmp_path / "r" / "tiny" / "runs" / run_id
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from ablate.store.rundir import RunLock; "
                f"assert RunLock({str(run_dir)!r}).acquire(); print('held', flush=True); time.sleep(120)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        result = sweep_here([TINY, "--executor", "debug", "--results", str(tmp_path / "r")], tmp_path)
    finally:
        holder.kill()
    assert "queued or running elsewhere 1" in result.stdout
    # nothing left for this driver to do: exit 0, the held run named, with the command that waits for it
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"left to others: 1 run running elsewhere: {run_id}" in result.stdout
    assert "1 held elsewhere" in result.stdout and "--wait" in result.stdout
    assert not (run_dir / "model").exists()  # the locked run was not run a second time
    assert "2 done" in result.stdout


@pytest.mark.slow
def test_bad_grid_exits_2_and_submits_nothing(tmp_path):
    grid = yaml.safe_load(TINY.read_text())
    grid["axes"]["freeze"] = ["none", "lowest_clm"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(grid))
    result = sweep_here([path, "--results", tmp_path / "r"], tmp_path)
    assert result.returncode == 2
    assert "axes.freeze" in result.stderr and "lowest_clm" in result.stderr and "allowed" in result.stderr
    assert not (tmp_path / "r").exists()


def test_a_run_starting_its_fine_tunings_names_them_in_the_progress_line(tmp_path):
    """Between its pretraining and the first task's first report, a run's progress names its tasks."""
    from ablate.launch.scheduler import _progress_line
    from ablate.store.sweep import SweepFolder, write_progress

    paths = SweepFolder(tmp_path / "s")
    paths.run("a").mkdir(parents=True)
    lock = rundir.RunLock(paths.run("a"))  # held, as its worker holds it: the run is running, not interrupted
    assert lock.acquire()
    try:
        rundir.write_status(paths.run("a"), "running")
        start = {"stage": "finetune", "phase": "fine-tuning ncbi_disease,chemprot", "step": 0, "total_steps": 0}
        write_progress(paths.run("a"), start)  # what the worker writes as its fine-tunings begin
        assert "[a fine-tuning ncbi_disease,chemprot]" in _progress_line(paths, ["a"])[0]
    finally:
        lock.release()


def test_the_sweep_progress_line_counts_runs_and_estimates_from_measured_run_times(tmp_path):
    from ablate.launch.scheduler import _progress_line
    from ablate.store import rundir
    from ablate.store.sweep import SweepFolder

    paths = SweepFolder(tmp_path / "s")
    for rid, state, wall in (
        ("a", "done", 60.0),
        ("b", "done", 120.0),
        ("c", "failed", None),
        ("d", "pending", None),
        ("e", "pending", None),
    ):
        paths.run(rid).mkdir(parents=True)
        rundir.write_status(paths.run(rid), state, **({"wall_time_s": wall} if wall else {}))
    line, counts = _progress_line(paths, ["a", "b", "c", "d", "e"])
    assert counts == {"pending": 2, "running": 0, "done": 2, "failed": 1}
    assert "2/5 runs done, ETA 3m00s" in line  # mean 90 s x 2 runs left, one at a time
    # a run's fine-tuning counts: the whole attempt (total_time_s), not its pretraining alone (wall_time_s)
    rundir.write_status(paths.run("a"), "done", wall_time_s=60.0, total_time_s=240.0)
    assert "2/5 runs done, ETA 6m00s" in _progress_line(paths, ["a", "b", "c", "d", "e"])[0]


def test_a_terminal_gets_a_progress_bar_per_stage_and_a_log_file_plain_lines():
    import io

    from ablate.launch.console import Console

    reports = [{"phase": "mlm", "step": s, "total_steps": 4, "loss": 3.0} for s in (2, 4)] + [
        {
            "stage": "finetune",
            "phase": "fine-tuning chemprot",
            "task": "chemprot",
            "seed": 0,
            "epoch": 1,
            "epochs": 1,
            "step": 6,
            "total_steps": 6,
            "loss": 0.5,
            "dev_metric": "micro_f1",
            "dev": 0.4,
            "eta_s": 0,
        }
    ]
    terminal, log_file = io.StringIO(), io.StringIO()
    for stream, tty in ((terminal, True), (log_file, False)):
        console = Console(stream, tty=tty)
        console.line("phase mlm: mlm, 4 steps")
        for report in reports:
            console.progress(report)
        console.line("done")
        console.close()
    assert log_file.getvalue() == "phase mlm: mlm, 4 steps\ndone\n"
    shown = terminal.getvalue()
    assert "pretraining" in shown and "4/4" in shown and "mlm 4/4 loss 3.000" in shown
    assert "fine-tuning chemprot seed 0" in shown and "6/6" in shown and "dev micro_f1 0.400" in shown
    assert "phase mlm: mlm, 4 steps\n" in shown and "\r" in shown  # the bar redraws in place


@pytest.mark.slow
def test_slurm_tests_without_a_cluster_are_skipped_out_loud(tmp_path):
    """The summary names the skipped Slurm tests in a block of its own, not just an 's' among the dots."""
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "no-slurm.conf"), "ABLATE_SLURM_DIR": str(tmp_path)}
    env.pop("ABLATE_REQUIRE_SLURM", None)
    test = (
        "tests/test_slurm.py::test_a_sweep_run_with_two_slurm_tasks_trains_data_parallel_and_matches_one_process"
    )
    skipped = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "1 Slurm test SKIPPED: no cluster answered" in skipped.stdout
    assert "start it: bash scripts/slurm-local.sh start; export SLURM_CONF=" in skipped.stdout
    assert f"  {test}" in skipped.stdout
