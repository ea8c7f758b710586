"""A sweep's tree of shared prefixes (ablate.plan.branching) as jobs.

Before submission every run folder says where it starts (branch.json: parent and step) and, for a parent,
which steps it keeps a checkpoint at for its children (branch_points.json). Locally (and in debug) a child is
submitted once its parent has published the checkpoint of its branch step (checkpoints/branch/step-N) or is
done; on Slurm at once, with `--dependency=afterok:<parent's job>` (and killed by Slurm if the parent fails),
a dependency the parent's own job lifts (`scontrol update ... Dependency=`) once it has written its checkpoint
at the branch step (release_children, at its next log step): a child waits for its parent's pretraining up to
there, not for the rest of it nor for its fine-tunings, and no driver needs to be running. The sweep lifts it
too when the parent is already there by the time the child's job id is written (a parent that looked before
could not see the job).
A parent that failed or was pruned before its branch step fails its children, saying so; --retry-failed
re-runs the parent and then its children. A child whose parent is done starts at once (from step 0 if the
parent's checkpoint there is gone: the same bits).

May import: store, plan, train.checkpoint, launch.drivers.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ablate.launch.drivers import me
from ablate.plan.branching import BranchTree
from ablate.store import rundir
from ablate.store.sweep import SweepFolder
from ablate.train.checkpoint import kept_checkpoint

NOT_STARTING = ("failed", "pruned")  # a parent in one of these states gives no start to its children


def write_tree(paths: SweepFolder, tree: BranchTree | None, run_ids: list[str]) -> None:
    """Each run folder's branch.json and branch_points.json, as the tree says (None: no branching; stale
    files of an earlier tree go)."""
    for rid in run_ids:
        folder = paths.run(rid)
        branch = tree.branches.get(rid) if tree else None
        if rundir.branched(folder) is None:  # a child that started keeps the record of where it did
            rundir.write_branch(folder, branch.parent if branch else None, branch.step if branch else 0)
        rundir.write_branch_points(folder, tree.keep_steps(rid) if tree else {})


def parent_ready(paths: SweepFolder, child: str) -> bool:
    """The child can start now: its parent's checkpoint at the branch step is there, or the parent is done."""
    branch = rundir.read_branch(paths.run(child))
    if branch is None:
        return True
    parent = paths.run(branch["parent"])
    return (
        kept_checkpoint(parent / "checkpoints", branch["step"], check=False) is not None  # checked at adoption
        or rundir.state_or_corrupt(parent) == "done"
    )


def parent_lost(paths: SweepFolder, child: str) -> str | None:
    """Why the child cannot start (its parent failed or was pruned without reaching the branch step), or None."""
    branch = rundir.read_branch(paths.run(child))
    if branch is None or parent_ready(paths, child):
        return None
    state = rundir.state_or_corrupt(paths.run(branch["parent"]))
    if state in NOT_STARTING:
        return (
            f"not run: its parent run {branch['parent']} is {state} before step {branch['step']}, where this "
            f"run starts from its checkpoint (--retry-failed re-runs the parent, then this run)"
        )
    return None


class Children:
    """The children a sweep holds back until their parents can start them (local and debug executors)."""

    def __init__(self, paths: SweepFolder, to_run: list[str]):
        self.paths = paths
        self.left = [rid for rid in to_run if not parent_ready(paths, rid)]
        for rid in self.left:
            rundir.write_status(paths.run(rid), "pending", driver=me())  # held by this driver

    def first(self, to_run: list[str]) -> list[str]:
        return [rid for rid in to_run if rid not in self.left]

    def ready(self) -> list[Path]:
        """The held children whose parents can start them now; those whose parents failed are marked failed,
        naming the parent. Both leave the list."""
        out = []
        for rid in list(self.left):
            lost = parent_lost(self.paths, rid)
            if lost:
                rundir.write_status(self.paths.run(rid), "failed", error=lost)
            elif not parent_ready(self.paths, rid):
                continue
            else:
                out.append(self.paths.run(rid))
            self.left.remove(rid)
        return out

    def describe_left(self) -> list[str]:
        lines = []
        for rid in self.left:
            branch = rundir.read_branch(self.paths.run(rid)) or {}
            lines.append(
                f"run {rid} waits for its parent run {branch.get('parent')} to reach step "
                f"{branch.get('step')} (queued or running elsewhere, or interrupted): run the sweep again"
            )
        return lines


def slurm_children(scheduler, paths: SweepFolder, tree: BranchTree, to_run: list[str], out) -> None:
    """Submit the held children to Slurm parents first, each group with afterok on its parent's job (a parent
    submitted now or queued/running from before); children of a ready parent go without a dependency."""
    base = dict(scheduler.launcher.slurm.additional_parameters)
    wanted = set(to_run)
    for rid in tree.depth_order():
        if rid not in wanted or parent_ready(paths, rid):
            continue
        lost = parent_lost(paths, rid)
        if lost:
            rundir.write_status(paths.run(rid), "failed", error=lost)
            out(f"{rid}: {lost}")
            continue
        parent = tree.branches[rid].parent
        job = rundir.read_status(paths.run(parent)).get("job_id")
        if not job:
            out(f"run {rid} waits for its parent run {parent}, which has no Slurm job: run the sweep again")
            continue
        scheduler.executor.update_parameters(
            slurm_additional_parameters={**base, "dependency": f"afterok:{job}", "kill_on_invalid_dep": "yes"}
        )
        scheduler.submit([paths.run(rid)])
        if parent_ready(paths, rid):  # the parent got there meanwhile, maybe before this job id was written
            out(f"{rid}: {release_job(rundir.read_status(paths.run(rid))['job_id'])}")
    scheduler.executor.update_parameters(slurm_additional_parameters=base)


def release_children(run_dir: Path, points: dict[int, list[str]], released: set[int]) -> list[str]:
    """A parent run's job: the Slurm jobs of its children at each branch step in `points` whose checkpoint it
    has written lose their dependency on it (each step once: `released`). Lines saying what was done."""
    lines = []
    for step, children in points.items():
        if step in released or kept_checkpoint(Path(run_dir) / "checkpoints", step, check=False) is None:
            continue
        released.add(step)
        for child in children:
            try:
                status = rundir.read_status(Path(run_dir).parent / child)
            except rundir.CorruptStatus:
                continue
            if status.get("executor") == "slurm" and status.get("job_id") and status.get("state") == "submitted":
                lines.append(f"child {child} at step {step}: {release_job(status['job_id'])}")
    return lines


def release_job(job_id: str) -> str:
    """Lift a pending Slurm job's dependency (its parent's job); one that already started or ended is as it
    should be."""
    try:
        out = subprocess.run(
            ["scontrol", "update", f"JobId={job_id}", "Dependency="], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"job {job_id} still waits for this run's whole job (scontrol: {exc})"
    if out.returncode:
        return f"job {job_id} left as it is ({(out.stderr or out.stdout).strip()[:200]})"
    return f"job {job_id} released: it no longer waits for this run's job"


def branch_cell(run_dir: Path) -> str:
    """`ablate status`'s column: 'branch of <run> @ step N' (and how it started), '' for a run from step 0."""
    branch = rundir.read_branch(run_dir)
    if branch is None:
        return ""
    started = rundir.branched(run_dir)
    how = (
        "" if started is None else " (started)" if started["from"] == "parent" else " (from step 0: no checkpoint)"
    )
    return f"branch of {branch['parent']} @ step {branch['step']}{how}"
