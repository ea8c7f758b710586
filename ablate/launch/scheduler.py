"""Submit a sweep's runs through submitit (local processes, Slurm, or in-process debug), watch them, collect.

Each run is one job whose only argument is its run folder. On Slurm the jobs go as arrays (split at the
cluster's MaxArraySize, with a parallelism cap); a timeout or preemption requeues the job (submitit's
Checkpointable), and the requeued job resumes from the run's last checkpoint. A run that is done is never
submitted again; one that failed only with --retry-failed; one that is queued or running (its job alive or
its folder locked) is left alone, so the same run never runs twice at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import submitit

from ablate.store import atomic

from ablate.store import rundir
from ablate.store.sweep import SweepFolder, describe_progress, read_progress

from ablate.launch import worker
from ablate.train.checkpoint import latest_checkpoint
from ablate.config.grid import GridSpec
from ablate.plan.grid import PlannedRun

Print = Callable[[str], None]


class RunJob(submitit.helpers.Checkpointable):
    """The callable every job runs. Checkpointable: on timeout/preemption submitit requeues the same call,
    and execute() resumes from the run's checkpoint."""

    def __call__(self, run_dir: str) -> str:
        try:
            return worker.execute(Path(run_dir))
        except worker.AlreadyRunning as exc:
            print(exc, file=sys.stderr)
            return "already-running"


def write_sweep_manifest(paths: SweepFolder, grid: GridSpec, grid_file: Path, runs: list[PlannedRun]) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    atomic.write_text(paths.root / "grid.yaml", Path(grid_file).read_text())
    atomic.write_json(paths.root / "sweep.json", {"sweep": grid.sweep, "grid_file": str(Path(grid_file).resolve()),
                                                   "run_ids": [r.run_id for r in runs], "updated": time.time()})
    for run in runs:
        worker.prepare_run_dir(run.spec, paths.run(run.run_id))


def job_alive(status: dict) -> bool:
    """Is the job that a 'submitted' status names still queued or running?"""
    job_id, executor = status.get("job_id"), status.get("executor")
    if not job_id:
        return False
    if executor == "slurm":
        try:
            out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True,
                                 timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return True  # cannot tell: do not risk a second copy
        return bool(out.stdout.strip())
    if executor == "local":
        try:
            os.kill(int(job_id), 0)
            return True
        except (OSError, ValueError):
            return False
    return False


def classify(run_dir: Path, retry_failed: bool, out: Print = print) -> str:
    """'skip-done', 'skip-failed', 'skip-active' or 'submit'. A corrupt status.json is reported on `out`, set
    aside and the run submitted again (recover_corrupt_status)."""
    try:
        status = rundir.read_status(run_dir)
    except rundir.CorruptStatus as exc:
        return recover_corrupt_status(run_dir, exc, out)
    state = rundir.effective_state(run_dir, status)
    if state == "done":
        return "skip-done"
    if state == "running" or rundir.RunLock(run_dir).held_elsewhere():
        return "skip-active"
    if state == "submitted" and job_alive(status):
        return "skip-active"
    if state == "failed" and not retry_failed:
        return "skip-failed"
    return "submit"


def recover_corrupt_status(run_dir: Path, corrupt: rundir.CorruptStatus, out: Print) -> str:
    """Say which run's status is corrupt and how, move the file aside (status.json.corrupt-<n>), and mark the
    run pending with a note of it: the run's own checkpoint is what it resumes from. 'submit', or
    'skip-active' (nothing moved) while a worker holds the run."""
    run_dir = Path(run_dir)
    lock = rundir.RunLock(run_dir)
    if not lock.acquire():
        out(f"warning: run {run_dir.name}: {corrupt}; left as it is while a worker holds the run ({lock.holder()})")
        return "skip-active"
    try:
        aside = rundir.set_aside_corrupt_status(run_dir)
        rundir.write_status(run_dir, "pending", recovered={"corrupt_file": aside.name, "problem": corrupt.problem,
                                                            "at": time.time()})
    finally:
        lock.release()
    out(f"warning: run {run_dir.name}: {corrupt}; moved to {aside} (kept) and the run submitted again: "
        f"{resume_point(run_dir)}")
    return "submit"


def resume_point(run_dir: Path) -> str:
    """Where a worker started on this run begins: its last checkpoint (pretrain resumes from LATEST)."""
    found = latest_checkpoint(Path(run_dir) / "checkpoints")
    if found is None:
        return "it has no checkpoint, so the worker starts it from step 0"
    try:
        state = rundir.read_json(found / "state.json")
        step, done = state["global_step"], state.get("done")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"the worker resumes from checkpoints/{found.name} (whose state.json is unreadable: {exc})"
    return (f"the worker resumes from checkpoints/{found.name} (step {step}"
            + ("; training had finished: records and evaluation are redone)" if done else ")"))


def make_executor(kind: str, grid: GridSpec, folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    name = f"ablate-{grid.sweep}"
    if kind == "debug":
        return submitit.DebugExecutor(folder)
    if kind == "local":
        ex = submitit.LocalExecutor(folder)
        ex.update_parameters(timeout_min=grid.launcher.local.timeout_min)
        return ex
    s = grid.launcher.slurm
    ex = submitit.AutoExecutor(folder, cluster="slurm", slurm_max_num_timeout=s.max_requeues)
    params = dict(name=name, timeout_min=s.timeout_min, cpus_per_task=s.cpus_per_task, mem_gb=s.mem_gb,
                  slurm_array_parallelism=s.array_parallelism, slurm_additional_parameters=dict(s.additional_parameters))
    if s.gpus_per_node:
        params["gpus_per_node"] = s.gpus_per_node
    if s.nodes > 1 or s.tasks_per_node > 1:      # one run = nodes x tasks_per_node data-parallel ranks
        params["nodes"] = s.nodes
        params["tasks_per_node"] = s.tasks_per_node
    for key, value in (("slurm_partition", s.partition), ("slurm_account", s.account), ("slurm_qos", s.qos),
                       ("slurm_constraint", s.constraint)):
        if value:
            params[key] = value
    if s.setup:
        params["slurm_setup"] = list(s.setup)
    ex.update_parameters(**params)
    return ex


def _progress_line(paths: SweepFolder, run_ids: list[str]) -> tuple[str, dict[str, int]]:
    counts = {s: 0 for s in ("pending", "running", "done", "failed")}
    running = []
    for rid in run_ids:
        run_dir = paths.run(rid)
        state = rundir.effective_state(run_dir)
        bucket = {"submitted": "pending", "interrupted": "pending"}.get(state, state)
        counts[bucket] = counts.get(bucket, 0) + 1
        if state == "running":
            running.append(f"{rid} {describe_progress(read_progress(run_dir))}")
    line = " | ".join(f"{k} {v}" for k, v in counts.items())
    if running:
        line += "  [" + "; ".join(running) + "]"
    return line, counts


def _record_job_failure(run_dir: Path, job) -> None:
    """A job that ended without its run saying done or failed (killed, out of memory, node lost)."""
    status = rundir.read_status(run_dir)
    if rundir.effective_state(run_dir, status) in ("done", "failed"):
        return
    detail = ""
    try:
        exc = job.exception()
        detail = f"{type(exc).__name__}: {exc}" if exc else ""
    except Exception as exc:  # submitit raises when the job left no result at all
        detail = f"{type(exc).__name__}: {exc}"
    try:
        tail = Path(job.paths.stderr).read_text()[-2000:]
    except OSError:
        tail = ""
    rundir.write_status(run_dir, "failed", error=f"job {job.job_id} ended without finishing the run. "
                                                  f"{detail}\n{tail}")


def run_sweep(grid: GridSpec, grid_file: Path, runs: list[PlannedRun], results_root: Path, executor: str | None,
              retry_failed: bool, out: Print = print, poll_s: float = 5.0) -> dict[str, list[str]]:
    """Submit what needs running, wait for it, and return the run ids by final state."""
    kind = executor or grid.launcher.executor
    paths = SweepFolder(Path(results_root) / grid.sweep)
    write_sweep_manifest(paths, grid, grid_file, runs)
    decisions = {r.run_id: classify(paths.run(r.run_id), retry_failed, out) for r in runs}
    to_run = [rid for rid, d in decisions.items() if d == "submit"]
    skipped = {d: sum(1 for x in decisions.values() if x == d) for d in ("skip-done", "skip-failed", "skip-active")}
    out(f"sweep {grid.sweep}: {len(runs)} runs; to run {len(to_run)}; already done {skipped['skip-done']}; "
        f"failed (not retried; --retry-failed) {skipped['skip-failed']}; queued or running elsewhere "
        f"{skipped['skip-active']}")
    if not to_run:
        out("nothing to submit")
    else:
        _submit_and_wait(kind, grid, paths, to_run, [r.run_id for r in runs], out, poll_s)
    by_state: dict[str, list[str]] = {}
    for r in runs:
        by_state.setdefault(rundir.effective_state(paths.run(r.run_id)), []).append(r.run_id)
    return by_state


def _submit_and_wait(kind: str, grid: GridSpec, paths: SweepFolder, to_run: list[str], all_ids: list[str],
                     out: Print, poll_s: float) -> None:
    ex = make_executor(kind, grid, paths.jobs)
    run_dirs = {rid: str(paths.run(rid)) for rid in to_run}
    for rid in to_run:
        rundir.write_status(paths.run(rid), "pending")
    queue = list(to_run)
    active: dict[str, object] = {}

    def submit(batch: list[str]) -> None:
        if kind == "slurm":
            jobs = []
            size = grid.launcher.slurm.max_array_size
            for start in range(0, len(batch), size):
                chunk = batch[start:start + size]
                jobs += ex.map_array(RunJob(), [run_dirs[r] for r in chunk])
        else:
            jobs = [ex.submit(RunJob(), run_dirs[r]) for r in batch]
        for rid, job in zip(batch, jobs):
            active[rid] = job
            rundir.write_status(paths.run(rid), "submitted", job_id=str(job.job_id), executor=kind,
                                 job_stdout=str(job.paths.stdout), job_stderr=str(job.paths.stderr))
            out(f"submitted {rid} as job {job.job_id}")

    if kind == "slurm":
        submit(queue)
        queue = []
    last_line, last_print = "", 0.0
    while queue or active:
        cap = grid.launcher.local.parallel if kind == "local" else 1
        if queue and len(active) < cap:
            n = cap - len(active)
            submit(queue[:n])
            queue = queue[n:]
        for rid, job in list(active.items()):
            if kind == "debug":
                try:
                    job.result()
                except Exception:  # recorded in the run's status by the worker
                    pass
            if job.done():
                _record_job_failure(paths.run(rid), job)
                del active[rid]
        line, _ = _progress_line(paths, all_ids)
        if line != last_line or time.time() - last_print > 60:
            out(f"[{time.strftime('%H:%M:%S')}] {line}")
            last_line, last_print = line, time.time()
        if queue or active:
            time.sleep(poll_s)


def status_rows(paths: SweepFolder, run_ids: list[str] | None = None) -> list[dict]:
    """Per-run state, progress, elapsed time and the last error line, from the run folders alone."""
    ids = run_ids if run_ids is not None else sorted(p.name for p in paths.runs.iterdir() if p.is_dir())
    rows = []
    now = time.time()
    for rid in ids:
        run_dir = paths.run(rid)
        try:
            status = rundir.read_status(run_dir)
            spec = rundir.read_json(run_dir / "spec.json")
        except rundir.CorruptStatus as exc:
            rows.append({"run_id": rid, "state": "corrupt", "detail": f"{exc}; `ablate sweep` sets it aside and "
                         f"submits the run again: {resume_point(run_dir)}"})
            continue
        except (OSError, ValueError) as exc:
            rows.append({"run_id": rid, "state": "unreadable", "detail": str(exc)})
            continue
        state = rundir.effective_state(run_dir, status)
        row = {"run_id": rid, **spec.get("labels", {}).get("axes", {}), "state": state}
        started = status.get("started")
        if state == "running" and started:
            row["elapsed"] = _fmt_s(now - started)
        elif state == "done":
            row["elapsed"] = _fmt_s(status.get("wall_time_s") or 0)
        detail = ""
        if state in ("running", "interrupted"):
            detail = describe_progress(read_progress(run_dir))
        if state == "failed":
            err = [line for line in (status.get("error") or "").strip().splitlines() if line.strip()]
            detail = " / ".join(err[-3:])
            detail += f"  (log: {run_dir / 'log.txt'}" + (f", {status['job_stderr']}" if status.get("job_stderr") else "") + ")"
        row["detail"] = detail
        rows.append(row)
    return rows


def _fmt_s(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def have_slurm() -> bool:
    return shutil.which("sbatch") is not None
