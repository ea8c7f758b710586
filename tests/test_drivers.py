"""Two drivers of one sweep: every run's pretraining and each (task, seed) fine-tuning runs once, each driver
says what the other is doing, and a run finished or queued elsewhere after a driver decided to run it is not
submitted. Deterministic: the first driver is held after a checkpoint (ABLATE_PAUSE_AT) while the second
looks at the sweep; a real live process stands for another driver. Tiny random-init BERT, debug executor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ablate.cli import main
from ablate.launch import drivers, worker
from ablate.launch.scheduler import Scheduler, classify
from ablate.config.launcher import Launcher
from ablate.store import rundir
from held import start_held
from in_process import ablate

REPO = Path(__file__).resolve().parents[1]
FINETUNE = {"epochs": 1, "max_train_examples": 8, "max_eval_examples": 8, "max_length": 32}


def two_run_grid(folder: Path) -> Path:
    grid = yaml.safe_load((REPO / "tests" / "grids" / "tiny.yaml").read_text())
    grid["axes"] = {"schedule": ["mlm", "clm_detour"], "freeze": ["none"]}
    grid.pop("exclude")
    grid["base"]["eval"] = {"tasks": ["ncbi_disease"], "seeds": [0, 1], "finetune": FINETUNE}
    path = folder / "two.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def sweep_cmd(grid: Path, results: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ablate.cli",
        "sweep",
        str(grid),
        "--executor",
        "debug",
        "--results",
        str(results),
        "--poll",
        "0.2",
    ]


def count(text: str, needle: str) -> int:
    return text.count(needle)


@pytest.mark.slow
def test_two_drivers_of_one_sweep_run_each_pretraining_and_fine_tuning_once(tmp_path, data_root):
    grid, results, release = two_run_grid(tmp_path), tmp_path / "results", tmp_path / "release"
    # its first run holds after its step-2 checkpoint until `release` exists
    first, seen = start_held(sweep_cmd(grid, results), {**os.environ, "ABLATE_PAUSE_AT": f"2:{release}"})

    second = ablate(sweep_cmd(grid, results)[3:], tmp_path)  # a second driver: this test's own process
    assert f"another driver (pid {first.pid} on " in second.stdout, second.stdout + second.stderr
    assert (
        "to run 0; already done 0; failed (not retried; --retry-failed) 0; queued or running elsewhere 2"
        in second.stdout
    )
    assert "nothing to submit" in second.stdout and "left to others: " in second.stdout
    assert (
        "0 done, 0 failed, 2 held elsewhere" in second.stdout and second.returncode == 0
    )  # nothing was its to do

    release.touch()
    rest, _ = first.communicate(timeout=600)
    assert first.returncode == 0, "".join(seen) + rest
    assert f"another driver (pid {second_pid(results)} on " in rest and "queued or running elsewhere 2" in rest, (
        rest
    )
    for run_dir in sorted((results / "tiny" / "runs").iterdir()):
        status, log = rundir.read_status(run_dir), (run_dir / "log.txt").read_text()
        assert status["state"] == "done" and status["attempts"] == 1, status
        assert count(log, "done: ") == 1 and count(log, "evaluating on") == 1, log
        for seed in (0, 1):
            assert count(log, f"ncbi_disease seed {seed}: test entity_f1 =") == 1, log
        assert sorted(p.name for p in (run_dir / "scores" / "ncbi_disease").glob("seed-*.json")) == [
            "seed-0.json",
            "seed-1.json",
        ]


def second_pid(results: Path) -> int:
    """The second driver's pid, as drivers.json keeps it (ended)."""
    entries = rundir.read_json(results / "tiny" / drivers.DRIVERS_FILE)["drivers"]
    return next(d["pid"] for d in entries if d.get("ended") and "queued or running elsewhere 2" in d["did"])


def prepared_run(tmp_path: Path) -> Path:
    """One run folder of the tiny grid, written as a sweep writes it."""
    from ablate.config.grid import load_grid
    from ablate.launch.scheduler import write_sweep_manifest
    from ablate.plan.grid import expand
    from ablate.store.sweep import SweepFolder

    path = two_run_grid(tmp_path)
    grid = load_grid(path)
    runs = expand(grid)[:1]
    paths = SweepFolder(tmp_path / "results" / grid.sweep)
    write_sweep_manifest(paths, grid, path, runs)
    return paths.run(runs[0].run_id)


@pytest.mark.slow
def test_a_run_finished_after_the_driver_decided_to_run_it_is_not_submitted(tmp_path, data_root):
    run_dir = prepared_run(tmp_path)
    assert classify(run_dir, retry_failed=False) == "submit"
    assert worker.execute(run_dir) == "done"  # another driver's job finishes it meanwhile
    said = []
    scheduler = Scheduler("debug", Launcher(), tmp_path / "jobs", "tiny", said.append)
    scheduler.submit([run_dir])
    assert said == [f"not submitted {run_dir.name}: finished meanwhile (by another driver or job)"]
    assert not scheduler.busy and rundir.read_status(run_dir)["attempts"] == 1
    assert scheduler.poll() == [run_dir] and scheduler.poll() == []  # ended here: a tune settles its trial


def test_a_slurm_job_whose_run_says_it_ended_is_asked_about_at_once(tmp_path):
    """submitit asks Slurm about a job at most every half of its age, up to 10 minutes apart: a run whose own
    status is final is asked about now, so what waits on it (transplants, children, the sweep's end) follows
    within a poll; a run still running is left to submitit's pace."""

    class Job:  # what Scheduler.poll asks of a submitit job
        job_id = "7"

        def __init__(self):
            self.asked = []

        def done(self, force_check: bool = False) -> bool:
            self.asked.append(force_check)
            return force_check

    scheduler = Scheduler("debug", Launcher(), tmp_path / "jobs", "tiny")
    scheduler.kind = "slurm"
    running, finished = tmp_path / "running", tmp_path / "finished"
    for run_dir, state in ((running, "running"), (finished, "done")):
        run_dir.mkdir()
        rundir.write_status(run_dir, state)
    jobs = {running: Job(), finished: Job()}
    scheduler.active = dict(jobs)
    assert scheduler.poll() == [finished]
    assert jobs[running].asked == [False] and jobs[finished].asked == [True]
    assert list(scheduler.active) == [running]


def test_a_run_another_live_driver_has_queued_is_left_to_it(tmp_path, data_root):
    run_dir = prepared_run(tmp_path)
    other = {"host": drivers.me()["host"], "pid": os.getppid()}  # a live process that is not this one
    rundir.write_status(run_dir, "pending", driver=other)
    assert classify(run_dir, retry_failed=False) == "skip-active"
    said = []
    scheduler = Scheduler("debug", Launcher(), tmp_path / "jobs", "tiny", said.append)
    scheduler.submit([run_dir])
    assert said == [
        f"not submitted {run_dir.name}: pending by another driver (pid {os.getppid()} on {other['host']})"
    ]
    assert rundir.read_status(run_dir)["driver"] == other and not scheduler.busy
    rundir.write_status(run_dir, "pending", driver={**other, "pid": dead_pid()})  # that driver died
    assert classify(run_dir, retry_failed=False) == "submit"


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def held_sweep(tmp_path: Path, driver: dict) -> tuple[Path, list[Path]]:
    """The two-run grid's sweep folder written as a sweep writes it, every run queued by `driver`."""
    from ablate.config.grid import load_grid
    from ablate.launch.scheduler import write_sweep_manifest
    from ablate.plan.grid import expand
    from ablate.store.sweep import SweepFolder

    path = two_run_grid(tmp_path)
    grid = load_grid(path)
    runs = expand(grid)
    paths = SweepFolder(tmp_path / "results" / grid.sweep)
    write_sweep_manifest(paths, grid, path, runs)
    for run in runs:
        rundir.write_status(paths.run(run.run_id), "pending", driver=driver)
    return path, [paths.run(r.run_id) for r in runs]


def test_a_driver_whose_runs_another_live_driver_holds_names_it_and_exits_0(tmp_path, data_root, capsys):
    other = {"host": drivers.me()["host"], "pid": os.getppid()}  # a live process that is not this one
    grid, run_dirs = held_sweep(tmp_path, other)
    assert main(["sweep", str(grid), "--executor", "debug", "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    ids = ", ".join(d.name for d in run_dirs)
    assert "nothing to submit" in out
    assert (
        f"left to others: 2 runs pending by another driver (pid {other['pid']} on {other['host']}): {ids}" in out
    )
    assert "summary: 0 done, 0 failed, 2 held elsewhere;" in out and f"`ablate sweep {grid} --wait`" in out
    assert all(rundir.read_status(d)["driver"] == other for d in run_dirs)  # left as they were


@pytest.mark.slow
def test_wait_watches_the_held_runs_and_runs_what_their_driver_left_unfinished(tmp_path, data_root):
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    grid, run_dirs = held_sweep(tmp_path, {"host": drivers.me()["host"], "pid": other.pid})
    waiting = subprocess.Popen(
        sweep_cmd(grid, tmp_path / "results") + ["--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for line in waiting.stdout:  # blocks until the driver waits: no race
        seen.append(line)
        if "waiting for the 2 runs held elsewhere" in line:
            break
    assert "left to others: 2 runs pending by another driver" in "".join(seen), "".join(seen)
    other.stdin.close()  # the other driver ends without running them
    other.wait()
    rest, _ = waiting.communicate(timeout=600)
    assert waiting.returncode == 0, "".join(seen) + rest
    assert "to run 2;" in rest and "summary: 2 done, 0 failed;" in rest, rest
    assert all(rundir.read_status(d)["state"] == "done" for d in run_dirs)
