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

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "grids" / "tiny.yaml"


def sweep(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablate.cli", "sweep", *args, "--poll", "0.2"], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablate.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory, data_root):
    """The tiny grid run once with the local executor (each run a submitit subprocess)."""
    root = tmp_path_factory.mktemp("local")
    grid = yaml.safe_load(TINY.read_text())
    grid["launcher"] = {"executor": "local", "local": {"parallel": 2}}
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(grid))
    result = sweep([str(path), "--results", str(root / "results")], root)
    return root, path, result


def test_local_executor_runs_every_arm_and_collects(local_sweep):
    root, _, result = local_sweep
    assert result.returncode == 0, result.stdout + result.stderr
    assert "summary: 3 done, 0 failed" in result.stdout
    assert "pending" in result.stdout and "done 3" in result.stdout       # progress lines
    runs = pd.read_parquet(root / "results" / "tiny" / "runs.parquet")
    assert sorted(runs["schedule"]) == ["clm_detour", "clm_detour", "mlm"]
    assert set(runs["status"]) == {"done"}
    assert runs["token_hash"].nunique() == 1
    for status in (root / "results" / "tiny" / "runs").glob("*/status.json"):
        assert json.loads(status.read_text())["executor"] == "local"


def test_running_the_same_sweep_again_submits_nothing(local_sweep):
    root, path, _ = local_sweep
    again = sweep([str(path), "--results", str(root / "results")], root)
    assert again.returncode == 0
    assert "to run 0; already done 3" in again.stdout and "nothing to submit" in again.stdout


def test_failed_runs_are_retried_only_when_asked(tmp_path, data_root):
    first = sweep([str(TINY), "--executor", "debug", "--results", str(tmp_path / "r")], tmp_path)
    assert first.returncode == 0, first.stderr
    run_dir = sorted((tmp_path / "r" / "tiny" / "runs").iterdir())[0]
    rundir.write_status(run_dir, "failed", error="Traceback...\nRuntimeError: out of memory on node 7")

    status = cli(["status", "tiny", "--results", str(tmp_path / "r")], tmp_path)
    assert "failed" in status.stdout and "out of memory on node 7" in status.stdout

    skipped = sweep([str(TINY), "--executor", "debug", "--results", str(tmp_path / "r")], tmp_path)
    assert skipped.returncode == 1
    assert "failed (not retried; --retry-failed) 1" in skipped.stdout
    assert f"failed {run_dir.name}: log" in skipped.stdout

    retried = sweep([str(TINY), "--executor", "debug", "--retry-failed", "--results", str(tmp_path / "r")],
                    tmp_path)
    assert retried.returncode == 0, retried.stdout
    assert "to run 1;" in retried.stdout and rundir.read_status(run_dir)["state"] == "done"


def test_a_run_locked_by_another_process_is_not_started_again(tmp_path, data_root):
    from ablate.config.grid import load_grid
    from ablate.plan.grid import expand

    run_id = expand(load_grid(TINY))[0].run_id
    run_dir = tmp_path / "r" / "tiny" / "runs" / run_id
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from ablate.store.rundir import RunLock; "
        f"assert RunLock({str(run_dir)!r}).acquire(); print('held', flush=True); time.sleep(120)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = sweep([str(TINY), "--executor", "debug", "--results", str(tmp_path / "r")], tmp_path)
    finally:
        holder.kill()
    assert "queued or running elsewhere 1" in result.stdout
    assert result.returncode == 1                      # not everything is done yet
    assert not (run_dir / "model").exists()            # the locked run was not run a second time
    assert "2 done" in result.stdout


def test_bad_grid_exits_2_and_submits_nothing(tmp_path):
    grid = yaml.safe_load(TINY.read_text())
    grid["axes"]["freeze"] = ["none", "lowest_clm"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(grid))
    result = sweep([str(path), "--results", str(tmp_path / "r")], tmp_path)
    assert result.returncode == 2
    assert "axes.freeze" in result.stderr and "lowest_clm" in result.stderr and "allowed" in result.stderr
    assert not (tmp_path / "r").exists()


def test_the_sweep_progress_line_counts_runs_and_estimates_from_measured_run_times(tmp_path):
    from ablate.launch.scheduler import _progress_line
    from ablate.store import rundir
    from ablate.store.sweep import SweepFolder

    paths = SweepFolder(tmp_path / "s")
    for rid, state, wall in (("a", "done", 60.0), ("b", "done", 120.0), ("c", "failed", None), ("d", "pending", None),
                             ("e", "pending", None)):
        paths.run(rid).mkdir(parents=True)
        rundir.write_status(paths.run(rid), state, **({"wall_time_s": wall} if wall else {}))
    line, counts = _progress_line(paths, ["a", "b", "c", "d", "e"])
    assert counts == {"pending": 2, "running": 0, "done": 2, "failed": 1}
    assert "2/5 runs done, ETA 3m00s" in line          # mean 90 s x 2 runs left, one at a time


def test_a_terminal_gets_a_progress_bar_per_stage_and_a_log_file_plain_lines():
    import io

    from ablate.launch.console import Console

    reports = [{"phase": "mlm", "step": s, "total_steps": 4, "loss": 3.0} for s in (2, 4)] + [
        {"stage": "finetune", "phase": "fine-tuning chemprot", "task": "chemprot", "seed": 0, "epoch": 1,
         "epochs": 1, "step": 6, "total_steps": 6, "loss": 0.5, "dev_metric": "micro_f1", "dev": 0.4, "eta_s": 0}]
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
    assert "phase mlm: mlm, 4 steps\n" in shown and "\r" in shown          # the bar redraws in place
