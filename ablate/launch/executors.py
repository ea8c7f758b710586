"""How a run becomes a submitit job: the job callable (RunJob) and the executors, one Executor entry each in
EXECUTORS (local processes with a parallel cap, Slurm, in-process debug): how it builds its submitit executor
and whether it can run here. A new executor: docs/extending.md, "An executor".

May import: config, launch.worker.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import submitit

from ablate.config.errors import SpecError
from ablate.config.launcher import Launcher
from ablate.config.registry import Registry
from ablate.launch import worker

# Given the run folder, the hook a run calls at each log step (or None); see worker.execute.
ProgressHookFactory = Callable[[Path], Callable[[dict], None] | None]


class RunJob(submitit.helpers.Checkpointable):
    """The callable every job runs. Checkpointable: on timeout/preemption submitit requeues the same call,
    and execute() resumes from the run's checkpoint. `progress_hook` (a module-level function, so the job
    pickles) gives the run its per-log-step hook in the job's own process: how a tune's run reports to its
    trial and ends itself when the pruner says so."""

    def __init__(self, progress_hook: ProgressHookFactory | None = None):
        self.progress_hook = progress_hook

    def __call__(self, run_dir: str) -> str:
        run_dir = Path(run_dir)
        try:
            hook = self.progress_hook(run_dir) if self.progress_hook else None
            return worker.execute(run_dir, on_progress=hook)
        except worker.AlreadyRunning as exc:
            print(exc, file=sys.stderr)
            return "already-running"


def have_slurm() -> bool:
    return shutil.which("sbatch") is not None


def _debug(launcher: Launcher, folder: Path, name: str):
    return submitit.DebugExecutor(folder)


def _local(launcher: Launcher, folder: Path, name: str):
    ex = submitit.LocalExecutor(folder)
    ex.update_parameters(timeout_min=launcher.local.timeout_min)
    return ex


def _slurm(launcher: Launcher, folder: Path, name: str):
    s = launcher.slurm
    ex = submitit.AutoExecutor(folder, cluster="slurm", slurm_max_num_timeout=s.max_requeues)
    params = dict(
        name=name,
        timeout_min=s.timeout_min,
        cpus_per_task=s.cpus_per_task,
        mem_gb=s.mem_gb,
        slurm_array_parallelism=s.array_parallelism,
        slurm_additional_parameters=dict(s.additional_parameters),
    )
    if s.gpus_per_node:
        params["gpus_per_node"] = s.gpus_per_node
    if s.nodes > 1 or s.tasks_per_node > 1:  # one run = nodes x tasks_per_node data-parallel ranks
        params["nodes"] = s.nodes
        params["tasks_per_node"] = s.tasks_per_node
    for key, value in (
        ("slurm_partition", s.partition),
        ("slurm_account", s.account),
        ("slurm_qos", s.qos),
        ("slurm_constraint", s.constraint),
    ):
        if value:
            params[key] = value
    if s.setup:
        params["slurm_setup"] = list(s.setup)
    ex.update_parameters(**params)
    return ex


@dataclass(frozen=True)
class Executor:
    """One way to run jobs: `make(launcher, folder, name)` builds the submitit executor (its job files and logs
    under `folder`; `name` names cluster jobs); `missing()` says why it cannot run on this machine (None: it
    can)."""

    name: str
    description: str
    make: Callable
    missing: Callable[[], str | None] = lambda: None


def _check_executor(entry: Executor, _registry) -> None:
    if not (callable(entry.make) and callable(entry.missing)):
        raise TypeError(f"executor {entry.name!r}: make and missing are functions")


EXECUTORS: Registry[Executor] = Registry("executor", Executor, _check_executor)
for _executor in (
    Executor("local", "processes on this machine, a GPU each, launcher.local.parallel at once", _local),
    Executor(
        "slurm",
        "Slurm jobs (arrays, requeue)",
        _slurm,
        lambda: None if have_slurm() else "Slurm is not available here (no sbatch on PATH)",
    ),
    Executor("debug", "in this process, one run after another", _debug),
):
    EXECUTORS.register(_executor)


def require_executor(kind: str, key: str = "launcher.executor") -> str:
    """The executor kind, checked before anything is submitted (SpecError under `key`: the CLI exits 2)."""
    missing = EXECUTORS.lookup(kind, key=key).missing()
    if missing:
        usable = ", ".join(n for n, e in EXECUTORS.items() if e.missing() is None)
        raise SpecError(missing, key=key, value=kind, allowed=usable)
    return kind


def make_executor(kind: str, launcher: Launcher, folder: Path, name: str):
    """The submitit executor for `kind`, its job files and logs under `folder`; `name` names Slurm jobs."""
    folder.mkdir(parents=True, exist_ok=True)
    return EXECUTORS[kind].make(launcher, folder, name)
