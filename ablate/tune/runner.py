"""Running a study: ask trials, run each trial's run on the launcher's Scheduler (the same one a sweep
uses), tell each trial how its run ended, until the study holds n_trials finished trials; then the trials
table and the tidy tables, as for a sweep.

A trial's run reports to the trial and is pruned in its own process (ablate.tune.pruning); here a run that
ended `pruned` makes its trial PRUNED, `done` COMPLETE (with the objective value from its records),
`failed` FAIL. A study's folder is a sweep folder: results/<study>/runs/<run_id>/, jobs/, sweep.json.

May import: config, store, plan, launch, tune.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ablate.config.errors import SpecError
from ablate.launch import worker
from ablate.launch.executors import RunJob
from ablate.launch.scheduler import Scheduler, classify
from ablate.plan.grid import PlannedRun
from ablate.store import atomic, collect, rundir
from ablate.store.sweep import SweepFolder
from ablate.tune.pruning import trial_hook
from ablate.tune.rdb import in_file, is_rdb_url, shown_url
from ablate.tune.schema import Tune
from ablate.tune.storage import StudyLock, open_storage, open_study, storage_url, study_dir, trial_id
from ablate.tune.trials import logged_losses, objective_value, read_curves, trial_run, write_trial_record

Print = Callable[[str], None]


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def dry_run_line(tune: Tune, executor: str, results_root: Path) -> str:
    """What `ablate tune --dry-run` prints for a checked tune file."""
    url = storage_url(tune.spec.storage, study_dir(results_root, tune.study))
    return (
        f"study {tune.study}: {len(tune.params)} parameters ({', '.join(tune.params)}); "
        f"{tune.spec.n_trials} trials, {tune.spec.parallel} in flight; executor {executor}; "
        f"storage {shown_url(url)}; dry run: nothing submitted"
    )


def in_flight_warnings(tune: Tune, kind: str) -> list[str]:
    """`parallel` where fewer trials can be in flight than it says; enqueued trials this call will not run, or
    that repeat one another (the run is reused, and its value counts twice in the study)."""
    cap, parallel, n_trials = tune.spec.launcher.local.parallel, tune.spec.parallel, tune.spec.n_trials
    enqueue = tune.spec.enqueue
    out = [
        f"enqueue[{i}] is the same trial as enqueue[{enqueue.index(fixed)}]: it reuses that run, and the "
        "study counts its value twice"
        for i, fixed in enumerate(enqueue)
        if fixed in enqueue[:i]
    ]
    if len(enqueue) > n_trials:
        out.append(
            f"{len(enqueue)} trials are enqueued but n_trials is {n_trials}: the last {len(enqueue) - n_trials} "
            "wait in the study for a later tune with a larger n_trials"
        )
    if kind == "local" and cap < parallel:
        out.append(
            f"parallel: {parallel} trials in flight, but launcher.local.parallel is {cap}: at most {cap} run "
            "at once on this machine"
        )
    if parallel > n_trials:
        out.append(
            f"parallel: {parallel} trials in flight, but n_trials is {n_trials}: at most {n_trials} run at once"
        )
    return out


def run_study(
    tune: Tune,
    results_root: Path,
    executor: str | None = None,
    poll_s: float = 2.0,
    out: Print = print,
    warn: Print = _warn,
) -> dict[str, int]:
    """Ask, run, tell until the study holds n_trials finished trials (resuming trials an earlier process
    left running), then write the trials table and collect the tidy tables; prints a summary line.
    Returns this call's counts of trials by how they ended: complete, pruned, fail."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kind = executor or tune.spec.launcher.executor
    for line in in_flight_warnings(tune, kind):
        warn(line)
    _reach_server(tune)
    folder = SweepFolder(study_dir(results_root, tune.study))
    folder.root.mkdir(parents=True, exist_ok=True)
    with StudyLock(folder.root):
        study, storage, url = open_study(tune, folder.root)
        trials = study.get_trials(deepcopy=False)
        finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
        stale = [t for t in trials if t.state == TrialState.RUNNING]
        to_ask = max(0, tune.spec.n_trials - len(finished) - len(stale))
        out(
            f"study {tune.study}: {len(finished)} finished trials, {len(stale)} left running by an earlier "
            f"process (resumed), {to_ask} to ask; storage {shown_url(url)}; executor {kind}"
        )
        loop = TrialLoop(
            tune,
            study,
            storage,
            url,
            folder,
            Scheduler(kind, tune.spec.launcher, folder.jobs, tune.study, out),
            out,
            warn,
        )
        try:
            resumed = [optuna.trial.Trial(study, trial_id(storage, tune.study, t.number)) for t in stale]
            loop.run(resumed, to_ask, poll_s)
        finally:
            write_trials_table(study, folder.root)
    collected = collect.collect(folder.root)
    for problem in collected.problems:
        warn(problem)
    counts = loop.counts
    out(
        f"summary: {counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed this time; "
        f"tables in {folder.root} (runs, scores, curves, ..., trials)"
    )
    return counts


def _reach_server(tune: Tune) -> None:
    """A storage on a database server, connected to before the study's folder is made: one that does not
    answer (or that Optuna cannot use) is exit 2 with nothing written. sqlite and journal storages are files,
    opened with the folder."""
    from ablate.tune.secrets import resolve

    if is_rdb_url(resolve(tune.spec.storage)) and not resolve(tune.spec.storage).startswith("sqlite"):
        try:
            open_storage(tune.spec.storage).engine.dispose()
        except SpecError as exc:
            raise in_file(exc, tune.file) from None


@dataclass
class Active:
    trial: Any  # optuna.trial.Trial
    run: PlannedRun
    run_dir: Path


class TrialLoop:
    """One pass over a study: at most `parallel` trials in flight, each waiting on its run."""

    def __init__(
        self,
        tune: Tune,
        study,
        storage,
        url: str,
        folder: SweepFolder,
        scheduler: Scheduler,
        out: Print,
        warn: Print,
    ):
        self.tune, self.study, self.storage, self.url = tune, study, storage, url
        self.folder, self.scheduler, self.out, self.warn = folder, scheduler, out, warn
        self.job = RunJob(progress_hook=trial_hook)
        self.distributions = {k: p.distribution() for k, p in tune.params.items()}
        self.active: dict[str, Active] = {}  # run id -> the trial whose job runs it
        self.waiting: list[Active] = []  # trials whose run is in flight for another trial or sweep
        self.counts = {"complete": 0, "pruned": 0, "fail": 0}
        manifest = folder.manifest
        self.run_ids: list[str] = folder.run_ids() if manifest.is_file() else []  # checked: DamagedRecord

    def run(self, queue: list, to_ask: int, poll_s: float) -> None:
        while queue or to_ask or self.active or self.waiting:
            while len(self.active) + len(self.waiting) < self.tune.spec.parallel and (queue or to_ask):
                if queue:
                    self.start(queue.pop(0))
                else:
                    to_ask -= 1
                    self.start(self.study.ask(self.distributions))
            for run_dir in self.scheduler.poll():
                a = self.active.pop(run_dir.name)
                if not self.settle(a):  # its job found the run running elsewhere: wait for that
                    self.waiting.append(a)
            for a in list(self.waiting):
                if a.run.run_id not in self.active and classify(a.run_dir, retry_failed=True) != "skip-active":
                    self.waiting.remove(a)
                    if not self.settle(a):
                        self.submit(a)
            if (self.active and self.scheduler.kind != "debug") or (self.waiting and not self.active):
                time.sleep(poll_s)

    def start(self, trial) -> None:
        run = trial_run(self.tune, trial.params, trial.number)
        run_dir = self.folder.run(run.run_id)
        worker.prepare_run_dir(run.spec, run_dir)
        if run.run_id not in self.run_ids:
            self.run_ids.append(run.run_id)
            atomic.write_json(
                self.folder.manifest,
                {
                    "sweep": self.tune.study,
                    "grid_file": self.tune.file,
                    "run_ids": self.run_ids,
                    "updated": time.time(),
                    "tune": True,
                },
            )
        trial.set_user_attr("run_id", run.run_id)
        a = Active(trial, run, run_dir)
        if run.run_id in self.active:  # the same run is in flight for another trial: wait for it
            self.waiting.append(a)
            return
        if self.settle(a):  # its run ended before: nothing to run
            return
        if classify(run_dir, retry_failed=True) == "skip-active":
            self.waiting.append(a)  # running under another sweep or study: wait for its folder
            return
        self.out(
            f"trial {trial.number}: run {run.run_id} " + ", ".join(f"{k}={v}" for k, v in trial.params.items())
        )
        self.submit(a)

    def submit(self, a: Active) -> None:
        self.record(a, "running")  # what the run's job reads: which trial to report to
        self.scheduler.submit([a.run_dir], self.job)
        self.active[a.run.run_id] = a

    def settle(self, a: Active) -> bool:
        """Tell the trial how its run ended; False when the run has not ended (it needs a job, or is
        running elsewhere)."""
        from optuna.trial import TrialState

        status = rundir.read_status(a.run_dir)
        state = rundir.effective_state(a.run_dir, status)
        if state == "done":
            try:
                curves = read_curves(a.run_dir)
                self.report_missing(a, logged_losses(curves, a.run.spec.log_every))
                value = objective_value(self.tune, a.run.spec, a.run_dir, curves)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.tell(a, TrialState.FAIL, note=f"no objective value: {exc}")
            else:
                self.tell(a, TrialState.COMPLETE, value)
        elif state == "pruned":
            self.tell(a, TrialState.PRUNED, note=f"run pruned at step {status.get('pruned_at_step')}")
        elif state == "failed":
            error = (status.get("error") or "").strip()
            self.tell(a, TrialState.FAIL, note="run failed: " + (error.splitlines() or [""])[-1])
        else:
            return False
        return True

    def report_missing(self, a: Active, losses: dict[int, float]) -> None:
        """A finished run's logged losses as the trial's intermediate values, where the run did not report
        them itself (a run done before, for a sweep or another trial)."""
        tid = trial_id(self.storage, self.tune.study, a.trial.number)
        have = self.storage.get_trial(tid).intermediate_values
        for step in sorted(set(losses) - set(have)):
            self.storage.set_trial_intermediate_value(tid, step, losses[step])

    def tell(self, a: Active, state, value: float | None = None, note: str = "") -> None:
        name = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "fail"}[state.name]
        if value is not None:
            self.study.tell(a.trial, value)
        else:
            self.study.tell(a.trial, state=state)
        self.record(a, name, value=value, note=note)
        self.counts[name] += 1
        self.out(
            f"trial {a.trial.number} ({a.run.run_id}): {name}"
            + (f" value {value:.6g}" if value is not None else "")
            + (f" - {note}" if note else "")
        )

    def record(self, a: Active, state: str, **fields) -> None:
        problem = write_trial_record(
            a.run_dir,
            a.trial.number,
            state,
            study=self.tune.study,
            storage=self.url,
            pruner=self.tune.spec.pruner,
            params=a.trial.params,
            **fields,
        )
        if problem:
            self.warn(problem)


def write_trials_table(study, sdir: Path) -> None:
    """results/<study>/trials.csv (+ .parquet): one row per trial, its run, state, value and params."""
    frame = study.trials_dataframe()
    if frame.empty:
        return
    run_ids = frame.pop("user_attrs_run_id") if "user_attrs_run_id" in frame else None
    frame.insert(0, "study", study.study_name)
    frame.insert(1, "run_id", run_ids)
    collect.write_tables(sdir, {"trials": frame})
