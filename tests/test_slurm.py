"""Integration with a real Slurm cluster (scripts/slurm-local.sh start): a small sweep through submitit's
Slurm executor, and a job requeued mid-run that resumes from its checkpoint.

Skipped when no cluster answers, except in CI (ABLATE_REQUIRE_SLURM=1), where that is a failure."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from builders import tiny_grid, write_yaml


def _grid(tmp_path: Path, steps: int = 3, sweep: str = "tiny-slurm") -> Path:
    slurm = {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 3, "timeout_min": 60, "array_parallelism": 2}
    grid = tiny_grid(sweep=sweep, launcher={"executor": "slurm", "slurm": slurm})
    for phases in grid["schedules"].values():
        phases[0]["steps"] = steps
    return write_yaml(tmp_path / f"{sweep}.yaml", grid)


def _sweep(args: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ablate.cli", "sweep", *args, "--poll", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


@pytest.mark.slow
@pytest.mark.slurm
def test_a_sweep_runs_on_slurm_and_collects_tidy_tables(tmp_path, slurm_env, data_root):
    """The runs, and the grid's layer transplant after them, as Slurm jobs."""
    grid = _grid(tmp_path)
    text = grid.read_text() + "transplants:\n- {from: clm_detour, into: mlm, layers: low, tasks: []}\n"
    grid.write_text(text)
    proc = _sweep([str(grid), "--results", str(tmp_path / "results")], slurm_env)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "4 done, 0 failed" in out
    sweep = tmp_path / "results" / "tiny-slurm"
    every = pd.read_parquet(sweep / "runs.parquet")
    runs, derived = every[~every["run_id"].str.startswith("tx-")], every[every["run_id"].str.startswith("tx-")]
    assert set(every["status"]) == {"done"} and len(runs) == 3
    assert list(derived["schedule"]) == ["mlm_clm_detour[0-1]"]  # the blocks alone: the paper's transplant
    assert runs["token_hash"].nunique() == 1  # the arms saw the same tokens
    for table in ("layers", "curves", "grads"):
        assert set(pd.read_parquet(sweep / f"{table}.parquet")["run_id"]) == set(runs["run_id"])
    statuses = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("runs/*/status.json")}
    assert len(statuses) == 4 and all(s["executor"] == "slurm" and s["job_id"] for s in statuses.values())
    built = statuses[derived["run_id"].item()]
    assert built["job_id"] not in {statuses[r]["job_id"] for r in runs["run_id"]}  # a job of its own, after them
    assert Path(built["job_stdout"]).is_file()
    # submitted once its runs were done, so not tied to the corpus-preparation job (Slurm forgets old jobs)
    assert "dependency" not in (sweep / "jobs" / f"{built['job_id'].split('_')[0]}_submission.sh").read_text()

    again = _sweep([str(grid), "--results", str(tmp_path / "results")], slurm_env)
    out2, _ = again.communicate(timeout=120)
    assert again.returncode == 0 and "nothing to submit" in out2


@pytest.mark.slow
@pytest.mark.slurm
def test_a_requeued_job_resumes_from_its_checkpoint_and_matches_an_uninterrupted_run(
    tmp_path, slurm_env, data_root
):
    grid = _grid(tmp_path, steps=20, sweep="requeue")  # held at step 10 (below): caught mid-run
    g = yaml.safe_load(grid.read_text())
    g["base"]["checkpoint_every"] = 5
    g["axes"] = {"schedule": ["clm_detour"], "freeze": ["low_clm"]}
    g["exclude"] = []
    grid.write_text(yaml.safe_dump(g))

    reference = subprocess.run(
        [
            sys.executable,
            "-m",
            "ablate.cli",
            "sweep",
            str(grid),
            "--executor",
            "debug",
            "--results",
            str(tmp_path / "reference"),
            "--poll",
            "0.2",
        ],
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert reference.returncode == 0, reference.stdout + reference.stderr

    # the job holds after its checkpoint at step 10 (ablate.launch.pause) until it is requeued: the
    # requeue lands mid-run however fast this machine trains
    held = {**slurm_env, "ABLATE_PAUSE_AT": f"10:{tmp_path / 'never'}"}
    proc = _sweep([str(grid), "--results", str(tmp_path / "results")], held)
    run_dir = next(iter((tmp_path / "reference" / "requeue" / "runs").iterdir()))
    run_dir = tmp_path / "results" / "requeue" / "runs" / run_dir.name
    deadline = time.time() + 300
    job_id = None
    while time.time() < deadline:
        log_file = run_dir / "log.txt"
        if log_file.is_file() and "holding after the checkpoint at step 10" in log_file.read_text():
            job_id = json.loads((run_dir / "status.json").read_text()).get("job_id")
            break
        time.sleep(0.1)
    assert job_id, "the run never reached its checkpoint at step 10"
    assert not (run_dir / "model").exists(), "the run finished before the requeue"
    subprocess.run(["scontrol", "requeue", job_id], env=slurm_env, check=True, timeout=30)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out

    log = (run_dir / "log.txt").read_text()
    assert "resumed from step-" in log, log
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "done" and status["attempts"] == 2
    ref_dir = tmp_path / "reference" / "requeue" / "runs" / run_dir.name
    for name in ("curves.json", "layers.json"):
        assert json.loads((run_dir / "records" / name).read_text()) == json.loads(
            (ref_dir / "records" / name).read_text()
        ), name
    ref_run = json.loads((ref_dir / "records" / "run.json").read_text())
    got_run = json.loads((run_dir / "records" / "run.json").read_text())
    assert got_run["token_hash"] == ref_run["token_hash"]


@pytest.mark.slow
@pytest.mark.slurm
def test_a_sweep_run_with_two_slurm_tasks_trains_data_parallel_and_matches_one_process(
    tmp_path, slurm_env, data_root
):
    grid = tiny_grid(sweep="ddp", axes={"schedule": ["clm_detour"]}, exclude=[])
    grid["base"]["model"] = "config:tiny-modernbert"  # no dropout: ranks add up to exactly one process
    grid["launcher"] = {
        "executor": "slurm",
        "slurm": {
            "partition": "cpu",
            "tasks_per_node": 2,
            "cpus_per_task": 1,
            "mem_gb": 3,
            "timeout_min": 30,
            "setup": ["export OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo"],
        },
    }
    path = write_yaml(tmp_path / "ddp.yaml", grid)
    single = subprocess.run(
        [
            sys.executable,
            "-m",
            "ablate.cli",
            "sweep",
            str(path),
            "--executor",
            "debug",
            "--results",
            str(tmp_path / "single"),
            "--poll",
            "0.2",
        ],
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert single.returncode == 0, single.stdout + single.stderr
    proc = _sweep([str(path), "--results", str(tmp_path / "ddp")], slurm_env)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    (run_dir,) = (tmp_path / "ddp" / "ddp" / "runs").iterdir()
    ref_dir = tmp_path / "single" / "ddp" / "runs" / run_dir.name
    got = json.loads((run_dir / "records" / "curves.json").read_text())
    ref = json.loads((ref_dir / "records" / "curves.json").read_text())
    assert got["tokens"] == ref["tokens"] and got["step"] == ref["step"]
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5)
    assert "data parallel: 2 ranks" in (run_dir / "log.txt").read_text()
    import torch
    from safetensors.torch import load_file

    got_weights, ref_weights = (load_file(d / "model" / "model.safetensors") for d in (run_dir, ref_dir))
    assert got_weights.keys() == ref_weights.keys()
    for name in got_weights:
        torch.testing.assert_close(got_weights[name], ref_weights[name], rtol=1e-4, atol=1e-5)
