"""The one scheduler of sweeps and tunes (Scheduler: run folders -> submitit jobs, which have ended), and a
sweep's submission: what to run, waiting with a progress line, per-run status rows.

Each run is one job whose only argument is its run folder. On Slurm the jobs go as arrays (split at the
cluster's MaxArraySize, with a parallelism cap); a timeout or preemption requeues the job (submitit's
Checkpointable), and the requeued job resumes from the run's last checkpoint. A run that is done is never
submitted again; one that failed only with --retry-failed; one that is queued or running (its job alive or
its folder locked) is left alone, so the same run never runs twice at once; so is one another live driver of
the sweep has queued, and each run's state is checked again right before its job is submitted
(launch.drivers).

Corpora are prepared before the first run is submitted (launch.preparation): here, or on Slurm as one job the
arms depend on; a missing corpus, or one a run would read more than data.max_epochs times, is refused before
anything is submitted. Layer transplants are derived runs submitted once their two runs are done
(launch.transplants). A run that shares its first steps with another starts from that run's checkpoint
(plan.branching), submitted once its parent can start it (launch.branches).

May import: config, store, plan, train.checkpoint, evaluate.transplant, launch.worker, launch.executors, launch.preparation,
launch.transplants, launch.branches, launch.gpus, launch.drivers, launch.data_needs.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Callable

from ablate.config.grid import GridSpec
from ablate.config.launcher import Launcher
from ablate.launch import branches, data_needs, drivers, gpus, preparation, worker
from ablate.launch.executors import RunJob, have_slurm, make_executor
from ablate.evaluate.transplant import prepare_derived
from ablate.launch.transplants import Waiting
from ablate.plan.branching import BranchTree
from ablate.plan.grid import PlannedRun
from ablate.plan.transplants import PlannedTransplant
from ablate.store import atomic, rundir
from ablate.train.checkpoint import latest_checkpoint
from ablate.store.sweep import SweepFolder, describe_progress, format_duration, read_progress

__all__ = [
    "Scheduler",
    "RunJob",
    "classify",
    "have_slurm",
    "record_job_failure",
    "run_sweep",
    "status_rows",
    "write_sweep_manifest",
]

Print = Callable[[str], None]


def write_sweep_manifest(
    paths: SweepFolder,
    grid: GridSpec,
    grid_file: Path,
    runs: list[PlannedRun],
    transplants: list[PlannedTransplant] = (),
) -> None:
    """grid.yaml, sweep.json (run ids in grid order, and the derived runs' ids) and each run folder's spec;
    the spec.json of every run folder it reuses read and checked first (DamagedRecord: nothing written)."""
    for run in runs:
        rundir.read_record(paths.run(run.run_id) / "spec.json", rundir.spec_problem, rundir.RESPEC)
    paths.root.mkdir(parents=True, exist_ok=True)
    atomic.write_text(paths.root / "grid.yaml", Path(grid_file).read_text())
    atomic.write_json(
        paths.root / "sweep.json",
        {
            "sweep": grid.sweep,
            "grid_file": str(Path(grid_file).resolve()),
            "run_ids": [r.run_id for r in runs],
            "transplant_ids": [t.run_id for t in transplants],
            "updated": time.time(),
        },
    )
    for run in runs:
        worker.prepare_run_dir(run.spec, paths.run(run.run_id))
    for planned in transplants:
        prepare_derived(paths.root, planned)


def classify(run_dir: Path, retry_failed: bool, out: Print = print) -> str:
    """'skip-done', 'skip-failed', 'skip-active' or 'submit'. A run a tune's pruner ended (`pruned`) is
    unfinished to a sweep: it is submitted, and resumes from its last checkpoint. A corrupt status.json is
    reported on `out`, set aside and the run submitted again (recover_corrupt_status)."""
    try:
        status = rundir.read_status(run_dir)
    except rundir.CorruptStatus as exc:
        return recover_corrupt_status(run_dir, exc, out)
    state = rundir.effective_state(run_dir, status)
    if state == "done":
        return "skip-done"
    if state == "running" or rundir.RunLock(run_dir).held_elsewhere() or drivers.owned_elsewhere(status):
        return "skip-active"
    if state == "submitted" and drivers.job_alive(status):
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
        out(
            f"warning: run {run_dir.name}: {corrupt}; left as it is while a worker holds the run ({lock.holder()})"
        )
        return "skip-active"
    try:
        aside = rundir.set_aside_corrupt_status(run_dir)
        rundir.write_status(
            run_dir,
            "pending",
            recovered={"corrupt_file": aside.name, "problem": corrupt.problem, "at": time.time()},
        )
    finally:
        lock.release()
    out(
        f"warning: run {run_dir.name}: {corrupt}; moved to {aside} (kept) and the run submitted again: "
        f"{resume_point(run_dir)}"
    )
    return "submit"


def resume_point(run_dir: Path) -> str:
    """Where a worker started on this run begins: its last checkpoint (pretrain resumes from LATEST)."""
    found = latest_checkpoint(Path(run_dir) / "checkpoints", check=False)  # a message: the worker checks it
    if found is None:
        return "it has no checkpoint, so the worker starts it from step 0"
    try:
        state = rundir.read_json(found / "state.json")
        step, done = state["global_step"], state.get("done")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"the worker resumes from checkpoints/{found.name} (whose state.json is unreadable: {exc})"
    return f"the worker resumes from checkpoints/{found.name} (step {step}" + (
        "; training had finished: records and evaluation are redone)" if done else ")"
    )


def _time_taken(status: dict):
    """A done run's seconds, pretraining and fine-tuning (total_time_s; runs finished by older versions
    recorded pretraining alone, wall_time_s)."""
    return status.get("total_time_s", status.get("wall_time_s"))


def _progress_line(paths: SweepFolder, run_ids: list[str]) -> tuple[str, dict[str, int]]:
    """'pending 1 | running 1 | done 2 | failed 0 | 2/4 runs done, ETA 3m10s  [<run> <its progress>]': the ETA
    is the mean time of the runs done so far (pretraining and fine-tuning) times the runs left, over the runs
    running at once."""
    counts = {s: 0 for s in ("pending", "running", "done", "failed")}
    running, wall_times = [], []
    for rid in run_ids:
        run_dir = paths.run(rid)
        status = rundir.read_status(run_dir)
        state = rundir.effective_state(run_dir, status)
        bucket = {"submitted": "pending", "interrupted": "pending"}.get(state, state)
        counts[bucket] = counts.get(bucket, 0) + 1
        if state == "running":
            running.append(f"{rid} {describe_progress(read_progress(run_dir))}")
        took = _time_taken(status)
        if state == "done" and isinstance(took, (int, float)):
            wall_times.append(took)
    line = " | ".join(f"{k} {v}" for k, v in counts.items())
    left = len(run_ids) - counts["done"] - counts["failed"]
    line += f" | {counts['done']}/{len(run_ids)} runs done"
    if wall_times and left:
        line += f", ETA {format_duration(sum(wall_times) / len(wall_times) * left / max(1, counts['running']))}"
    if running:
        line += "  [" + "; ".join(running) + "]"
    return line, counts


def _says_ended(run_dir: Path) -> bool:
    """The run's own status is final (its job is ending, or has ended)."""
    try:
        return rundir.read_status(run_dir).get("state") in rundir.FINAL_STATES
    except (OSError, ValueError):  # a corrupt status (CorruptStatus is a ValueError): submitit's pace
        return False


def record_job_failure(run_dir: Path, job) -> None:
    """A job that ended without its run saying done, failed or pruned (killed, out of memory, node lost):
    the run is failed, with the job's exception and the tail of its stderr. A run whose folder another
    process holds (this job found it running elsewhere) is left alone."""
    status = rundir.read_status(run_dir)
    if rundir.effective_state(run_dir, status) in (*rundir.FINAL_STATES, "running"):
        return
    lost = branches.parent_lost(SweepFolder(Path(run_dir).parent.parent), Path(run_dir).name)
    if lost:  # Slurm cancelled it: afterok on a parent that failed
        rundir.write_status(run_dir, "failed", error=f"job {job.job_id}: {lost}")
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
    rundir.write_status(
        run_dir, "failed", error=f"job {job.job_id} ended without finishing the run. {detail}\n{tail}"
    )


class Scheduler:
    """Runs run folders as jobs of one executor kind and says which have ended; a sweep and a tune both
    drive one. `submit` queues run folders (status pending) and hands them to the executor as the kind
    allows: local runs at most `launcher.local.parallel` at once, debug one at a time in this process (at
    `poll`), Slurm all at once as job arrays split at `max_array_size`. A submitted run's status says
    `submitted` with its job id and log files. `poll` returns the run folders whose jobs ended since the
    last poll (and those another driver or job took meanwhile), after recording a job that died without
    finishing its run as a failure of the run. Each local job sees GPUs of its own (launch.gpus)."""

    def __init__(self, kind: str, launcher: Launcher, folder: Path, name: str, out: Print = print):
        self.kind, self.launcher, self.out = kind, launcher, out
        self.executor = make_executor(kind, launcher, Path(folder), f"ablate-{name}")
        self.queued: list[tuple[Path, RunJob]] = []
        self.active: dict[Path, object] = {}  # run folder -> its submitit job
        self.gpus = gpus.local_pool(launcher.local.parallel) if kind == "local" else gpus.GpuPool([])
        self.dropped: list[Path] = []  # taken elsewhere meanwhile: `poll` returns them as ended here

    @property
    def busy(self) -> bool:
        return bool(self.queued or self.active)

    def submit(self, run_dirs: list[Path], job: RunJob | None = None) -> None:
        job = job or RunJob()
        with drivers.claimed(run_dirs):
            for run_dir in self._still_free(run_dirs):
                rundir.write_status(run_dir, "pending", driver=drivers.me())
                self.queued.append((Path(run_dir), job))
        self._fill()

    def _still_free(self, run_dirs: list[Path]) -> list[Path]:
        free, gone = drivers.still_free(run_dirs)  # the claims held
        for run_dir, why in gone:
            self.out(f"not submitted {run_dir.name}: {why}")
        self.dropped += [run_dir for run_dir, _ in gone]
        return free

    def poll(self) -> list[Path]:
        ended, self.dropped = self.dropped, []
        for run_dir, job in list(self.active.items()):
            if self.kind == "debug":
                try:
                    job.result()  # runs the job here, now, to its end
                except Exception:  # recorded in the run's status by the worker
                    pass
                # a failed debug job is never done() to submitit: asking would run it again, and raise
                ended_now = True
            else:
                # submitit asks Slurm at most every max(2 s, half the job's age), up to 10 minutes apart; a run
                # whose folder says it ended is asked about now, so what waits on it follows within a poll
                ended_now = job.done(force_check=self.kind == "slurm" and _says_ended(run_dir))
            if ended_now:
                record_job_failure(run_dir, job)
                del self.active[run_dir]
                self.gpus.give_back(run_dir)
                ended.append(run_dir)
        self._fill()
        return ended

    def _fill(self) -> None:
        cap = {"local": self.launcher.local.parallel, "debug": 1}.get(self.kind)  # Slurm: no cap here
        n = len(self.queued) if cap is None else max(0, cap - len(self.active))
        batch, self.queued = self.queued[:n], self.queued[n:]
        for fn, group in itertools.groupby(batch, key=lambda queued: queued[1]):  # one array per callable
            self._start([run_dir for run_dir, _ in group], fn)

    def _start(self, run_dirs: list[Path], fn: RunJob) -> None:
        with drivers.claimed(run_dirs):  # checked again right before the job goes
            self._submit_jobs(self._still_free(run_dirs), fn)

    def _submit_jobs(self, run_dirs: list[Path], fn: RunJob) -> None:
        if self.kind == "slurm":
            jobs = []
            size = self.launcher.slurm.max_array_size
            for first in range(0, len(run_dirs), size):
                jobs += self.executor.map_array(fn, [str(d) for d in run_dirs[first : first + size]])
        else:
            jobs = []
            for run_dir in run_dirs:  # each local job with GPUs of its own
                self.executor.update_parameters(**gpus.job_parameters(self.gpus.take(run_dir)))
                jobs.append(self.executor.submit(fn, str(run_dir)))
        for run_dir, job in zip(run_dirs, jobs):
            self.active[run_dir] = job
            rundir.write_status(
                run_dir,
                "submitted",
                job_id=str(job.job_id),
                executor=self.kind,
                driver=drivers.me(),
                job_stdout=str(job.paths.stdout),
                job_stderr=str(job.paths.stderr),
            )
            self.out(f"submitted {run_dir.name} as job {job.job_id}")


def run_sweep(
    grid: GridSpec,
    grid_file: Path,
    runs: list[PlannedRun],
    results_root: Path,
    executor: str | None,
    retry_failed: bool,
    out: Print = print,
    poll_s: float = 5.0,
    transplants: list[PlannedTransplant] = (),
    tree: BranchTree | None = None,
    wait: bool = False,
) -> dict[str, list[str]]:
    """Submit what needs running, wait for it, and return the run ids by final state (drivers.HELD: runs another
    driver, worker or job holds; with `wait`, this driver waits until they end and looks again). The grid's
    `transplants` (derived runs) go to the same scheduler once the runs each needs are done; the children of
    `tree` (shared prefixes, ablate.plan.branching) once their parents can start them (launch.branches)."""
    kind = executor or grid.launcher.executor
    paths = SweepFolder(Path(results_root) / grid.sweep)
    preparation.require_corpora(_unfinished(paths, runs), file=str(grid_file))  # before anything is written
    data_needs.require_probe_data(_unfinished(paths, runs), file=str(grid_file))
    write_sweep_manifest(paths, grid, grid_file, runs, transplants)
    branches.write_tree(paths, tree, [r.run_id for r in runs])
    watch = drivers.Watch(paths.root, out)
    try:
        while True:
            by_state = _drive(
                grid, grid_file, runs, paths, kind, retry_failed, out, poll_s, transplants, tree, watch
            )
            if not (wait and by_state.get(drivers.HELD)):
                return by_state
            drivers.wait_released([paths.run(rid) for rid in by_state[drivers.HELD]], poll_s, out)
    finally:
        watch.close()


def _drive(grid, grid_file, runs, paths, kind, retry_failed, out, poll_s, transplants, tree, watch):
    """run_sweep once the sweep folder is written and this driver is in its drivers.json."""
    decisions = {r.run_id: classify(paths.run(r.run_id), retry_failed, out) for r in runs}
    to_run = [rid for rid, d in decisions.items() if d == "submit"]
    children = branches.Children(paths, to_run)  # held until their parents can start them
    if tree is not None and tree.branches:
        out(
            f"branching: {len(tree.branches)} runs start from another run's checkpoint "
            f"({len(children.left)} of those to run wait for their parents)"
        )
    watch.did = drivers.decided(decisions)
    out(f"sweep {grid.sweep}: {len(runs)} runs; " + watch.did)
    derived = {t.run_id: classify(paths.run(t.run_id), retry_failed, out) for t in transplants}
    waiting = Waiting(paths, [t for t in transplants if derived[t.run_id] == "submit"])
    if transplants:
        out(
            f"transplants: {len(transplants)} derived runs, built once the runs each needs are done; "
            + drivers.decided(derived)
        )
    if not to_run and not waiting.left:
        out("nothing to submit")
    else:
        scheduler = Scheduler(kind, grid.launcher, paths.jobs, grid.sweep, out)
        if to_run:
            prep_job = preparation.prepare_for_sweep(
                kind,
                grid.launcher,
                [r.spec for r in runs if r.run_id in to_run],
                paths.jobs,
                grid.sweep,
                out,
                file=str(grid_file),
            )
            if prep_job is not None:
                scheduler.executor.update_parameters(**preparation.after(prep_job, grid.launcher))
            scheduler.submit([paths.run(rid) for rid in children.first(to_run)])
            if prep_job is not None:  # every run went to Slurm just now; transplants come hours later, when
                # Slurm may have forgotten the preparation job: a dependency on it would be refused
                scheduler.executor.update_parameters(
                    slurm_additional_parameters=dict(grid.launcher.slurm.additional_parameters)
                )
            if kind == "slurm" and tree is not None:  # children after their parents' jobs
                branches.slurm_children(scheduler, paths, tree, children.left, out)
                children.left = []
        scheduler.submit(children.ready() + waiting.ready())
        _wait(scheduler, paths, [r.run_id for r in runs] + list(derived), out, poll_s, waiting, children, watch)
        for line in waiting.describe_left() + children.describe_left():
            out(line)
    return drivers.final_states({rid: paths.run(rid) for rid in [r.run_id for r in runs] + list(derived)}, out)


def _unfinished(paths: SweepFolder, runs: list[PlannedRun]) -> list:
    """The specs of runs not done yet: only those need their corpus (a corrupt status counts as not done)."""

    def done(run_id: str) -> bool:
        try:
            return rundir.read_status(paths.run(run_id)).get("state") == "done"
        except rundir.CorruptStatus:
            return False

    return [r.spec for r in runs if not done(r.run_id)]


def _wait(
    scheduler: Scheduler,
    paths: SweepFolder,
    all_ids: list[str],
    out: Print,
    poll_s: float,
    waiting: Waiting,
    children: branches.Children,
    watch: drivers.Watch,
) -> None:
    """Poll until every job has ended, submitting each transplant once its runs are done and each child once
    its parent can start it, and printing the sweep's progress line when it changes (or each minute). The checks
    are half a second apart after a run starts or ends, then twice as far apart each time up to poll_s."""
    last_line, last_print, last_counts, pause = "", 0.0, {}, min(poll_s, 0.5)
    while scheduler.busy:
        scheduler.poll()
        watch.poll()
        scheduler.submit(children.ready())
        scheduler.submit(waiting.ready())
        line, counts = _progress_line(paths, all_ids)
        if counts != last_counts:  # a run started or ended: the next may be close (short runs), so look sooner
            last_counts, pause = counts, min(poll_s, 0.5)
        if line != last_line or time.time() - last_print > 60:
            out(f"[{time.strftime('%H:%M:%S')}] {line}")
            last_line, last_print = line, time.time()
        if scheduler.busy and scheduler.kind != "debug":
            time.sleep(pause)
            pause = min(poll_s, 2 * pause)


def status_rows(paths: SweepFolder, run_ids: list[str] | None = None) -> list[dict]:
    """Per-run state, progress, elapsed time, the last error line and, for runs with scores kept out of date
    (`ablate evaluate --keep-stale`), which those are (column stale_scores), from the run folders alone."""
    ids = run_ids if run_ids is not None else sorted(p.name for p in paths.runs.iterdir() if p.is_dir())
    rows = []
    now = time.time()
    for rid in ids:
        run_dir = paths.run(rid)
        try:
            status = rundir.read_status(run_dir)
            spec = rundir.read_json(run_dir / "spec.json")
        except rundir.CorruptStatus as exc:
            rows.append(
                {
                    "run_id": rid,
                    "state": "corrupt",
                    "detail": f"{exc}; `ablate sweep` sets it aside and "
                    f"submits the run again: {resume_point(run_dir)}",
                }
            )
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
            row["elapsed"] = _fmt_s(_time_taken(status) or 0)
        detail = ""
        if state in ("running", "interrupted"):
            detail = describe_progress(read_progress(run_dir))
        if state == "failed":
            err = [line for line in (status.get("error") or "").strip().splitlines() if line.strip()]
            detail = " / ".join(err[-3:])
            detail += (
                f"  (log: {run_dir / 'log.txt'}"
                + (f", {status['job_stderr']}" if status.get("job_stderr") else "")
                + ")"
            )
        if state == "pruned":
            detail = f"at step {status.get('pruned_at_step')}: {status.get('reason', '')}"
        row["detail"] = detail
        branch = branches.branch_cell(run_dir)
        if branch:
            row["branch"] = branch
        stale: dict[str, list[str]] = {}
        for name in rundir.stale_scores(run_dir):
            task, seed = name.split("/seed-")
            stale.setdefault(task, []).append(seed)
        if stale:
            row["stale_scores"] = "; ".join(f"{t}: seeds {','.join(sorted(s, key=int))}" for t, s in stale.items())
        rows.append(row)
    return rows


def _fmt_s(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
