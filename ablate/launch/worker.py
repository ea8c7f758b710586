"""Execute one run folder: lock it, pretrain (resuming if a checkpoint exists; a child of the sweep's tree of
shared prefixes first adopts its parent's checkpoint at its branch step), measure, evaluate, record; or, for a
derived run (a layer transplant), build it from its source runs and evaluate it.

This is what `ablate run` calls in-process and what every submitit job calls on a cluster node. Its only
input is the run folder, whose spec.json the sweep wrote before submitting; a job may add a hook called at
each log step, which ends the run as `pruned` by raising Pruned (how a tune's trial prunes itself).

May import: config, store, data, models, plan, analysis, train, evaluate, launch.shares, launch.branches.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import transformers

from ablate import __version__

from ablate.store import rundir
from ablate.store.rundir import AlreadyRunning  # noqa: F401  (raised here; tune and the CLI catch it)
from ablate.store.sweep import write_progress
from ablate.launch import branches, shares
from ablate.launch.console import Console
from ablate.launch.trackers import RunTrackers
from ablate.analysis.probe import REPS_DIR
from ablate.train.checkpoint import (
    TOKEN_HASH_FORMAT,
    adopt_checkpoint,
    kept_checkpoint,
    kept_path,
    latest_checkpoint,
)
from ablate.data.mixture import uses_own_data
from ablate.launch.pause import hold_if_asked
from ablate.train.loop import TrainState, pretrain
from ablate.config.spec import RunSpec, dump_run_spec


class Pruned(Exception):
    """Raised by a run's progress hook to end the run early on purpose: its status becomes `pruned`,
    with the step and the reason."""

    def __init__(self, step: int, reason: str):
        super().__init__(reason)
        self.step, self.reason = step, reason


def prepare_run_dir(spec: RunSpec, run_dir: Path) -> Path:
    """Write spec.json (and a pending status) unless the folder already holds this very run."""
    run_dir = Path(run_dir)
    spec_file = run_dir / "spec.json"
    if spec_file.is_file():
        existing = rundir.read_record(spec_file, rundir.spec_problem, rundir.RESPEC)  # DamagedRecord: exit 2
        if RunSpec.model_validate(existing).run_id != spec.run_id:
            raise RuntimeError(f"{run_dir} holds another run ({existing.get('labels')}); refusing to mix results")
        if existing != dump_run_spec(spec):
            rundir.atomic.write_json(spec_file, dump_run_spec(spec))  # labels or evaluation settings changed
    else:
        rundir.atomic.write_json(spec_file, dump_run_spec(spec))
    return run_dir


def load_spec(run_dir: Path) -> RunSpec:
    return rundir.read_spec(run_dir)


def _logger(run_dir: Path, console: Console):
    """log(message): a plain line in log.txt, and on stdout through the console (above its progress bar)."""
    log_file = open(Path(run_dir) / "log.txt", "a", buffering=1)
    run_id = Path(run_dir).name

    def log(message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} {run_id}] {message}"
        console.line(line)
        log_file.write(line + "\n")

    return log, log_file


def _probe_hooks(spec: RunSpec, run_dir: Path):
    """The phase-end probe, built before pretrain forms the process group: it reads the held-out texts and
    the tokenizer here, and loads and probes the base model at the first phase end, on the run's device."""
    if spec.probe.n_texts <= 0:
        return ()
    from ablate.analysis.probe import cka_vs_base_hook
    from ablate.evaluate.tasks import task_texts

    return (cka_vs_base_hook(spec, run_dir, read_task=task_texts),)


def _run_record(spec: RunSpec, state: TrainState, run_dir: Path, wall_time: float) -> dict:
    """records/run.json: the run's row of the runs table (what each phase froze is records/frozen.json).
    seed_independent / seed_changes: whether its pretraining seed is an independent replicate, and what the
    seed changes per phase (ablate.plan.replicates), for the statistics' pairing units."""
    from ablate.models.families import family_of, n_layers
    from ablate.models.loading import load_config
    from ablate.plan.replicates import seed_record
    from ablate.config.sources import phase_rope_thetas

    config = load_config(spec.model)
    return {
        "token_hash": state.token_hash,
        "tokens_seen": state.tokens_seen,
        "phase_token_hashes": state.phase_token_hashes,
        "token_hash_format": TOKEN_HASH_FORMAT,  # phase hashes comparable across objectives
        "phase_tokens": state.phase_tokens,
        # runs that read by members (data.mixture, a phase's own data): each source's realised tokens and hash
        **(
            {"source_tokens": state.source_tokens, "source_token_hashes": state.source_token_hashes}
            if uses_own_data(spec)
            else {}
        ),
        # phases that set a RoPE theta: the thetas in effect in each phase (the final model's config has the last)
        **({"rope_thetas": json.dumps(thetas)} if (thetas := phase_rope_thetas(spec.phases)) else {}),
        "steps": state.global_step,
        "train_time_s": round(state.elapsed_s, 3),
        "wall_time_s": round(wall_time, 3),
        "family": family_of(config).name,
        "n_layers": n_layers(config),
        "model_dir": str((Path(run_dir) / "model").resolve()),
        "versions": json.dumps(
            {
                "ablate": __version__,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "python": platform.python_version(),
            }
        ),
        **seed_record(spec),
    }


def _execute_follower(run_dir: Path, stop_after_steps: int | None) -> str:
    """A rank other than 0: trains alongside rank 0, then fine-tunes its share of the run's (task, seed)
    units (launch.shares); no lock, status, records or progress: rank 0 keeps those (and a derived run's
    whole job: nothing trains)."""
    spec = load_spec(run_dir)
    if rundir.read_status(run_dir).get("state") == "done" or spec.labels.get("derived"):
        return "done"
    with shares.team_for(spec) as team:
        state = pretrain(
            spec,
            run_dir,
            log=lambda _m: None,
            stop_after_steps=stop_after_steps,
            after_checkpoint=lambda step: hold_if_asked(step, lambda _m: None),
        )
        if not state.done:
            return "interrupted"
        if spec.eval.tasks:
            shares.fine_tune_share(run_dir, spec, team, log=lambda m: print(f"[rank {team.rank}] {m}", flush=True))
    return "done"


def _fine_tune(run_dir: Path, spec: RunSpec, log, report, team: shares.Team = shares.Team()) -> list[dict]:
    """Fine-tune the run's model on its eval tasks (none: nothing), shared with the run's other ranks; the
    score rows of every unit."""
    if not spec.eval.tasks:
        return []
    write_progress(
        run_dir,
        {"stage": "finetune", "phase": "fine-tuning " + ",".join(spec.eval.tasks), "step": 0, "total_steps": 0},
    )  # until the first task reports
    return shares.fine_tune_share(run_dir, spec, team, log=log, progress=report)


def start_from_parent(run_dir: Path, log) -> None:
    """A child of the sweep's tree (branch.json) that has not started: adopt its parent's checkpoint at the
    branch step, with the phase-end representations the parent's probe saved up to there; or, when the
    parent has no checkpoint there (trained before the tree named that step), start from step 0: the same
    bits either way. Once every child of that step has started, the parent's checkpoint there goes."""
    branch = rundir.read_branch(run_dir)
    if branch is None or rundir.branched(run_dir) is not None:
        return
    parent_dir, step = run_dir.parent / branch["parent"], int(branch["step"])
    source = "parent"
    if latest_checkpoint(run_dir / "checkpoints") is None:  # else: adopted, killed before the mark
        found = kept_checkpoint(parent_dir / "checkpoints", step)
        if found is None:
            source = "scratch"
            log(
                f"branch of {branch['parent']} @ step {step}: the parent has no checkpoint there (trained before "
                "the tree named this step, or gone); training from step 0 (the same result)"
            )
        else:
            state = rundir.read_json(found / "state.json")
            for phase in dict.fromkeys(row["phase"] for row in state["layer_rows"]):
                reps = parent_dir.joinpath(*REPS_DIR, f"{phase}.npz")
                if reps.is_file():
                    rundir.atomic.link_or_copy(reps, run_dir.joinpath(*REPS_DIR, f"{phase}.npz"))
            adopt_checkpoint(found, run_dir / "checkpoints")
            log(
                f"branch of {branch['parent']} @ step {step}: started from its checkpoint "
                f"(phase {state['phase_index']}, {state['tokens_seen']} tokens seen)"
            )
    rundir.mark_branched(run_dir, source, step)
    siblings = rundir.branch_points(parent_dir).get(step, [])
    if all(rundir.branched(run_dir.parent / c) is not None for c in siblings):
        shutil.rmtree(kept_path(parent_dir / "checkpoints", step), ignore_errors=True)
    if source == "parent":
        hold_if_asked(step, log)  # ABLATE_PAUSE_AT: how the tests kill a child right after it branched


def _child_release(run_dir: Path, log) -> Callable[[], None]:
    """What a parent of the sweep's tree calls at each log step and after pretraining: its children's Slurm
    jobs stop waiting for this job once their branch checkpoint is written (launch.branches)."""
    points, released = rundir.branch_points(run_dir), set()

    def release() -> None:
        for line in branches.release_children(run_dir, points, released) if points else ():
            log(line)

    return release


def _pretrain_then_evaluate(
    spec: RunSpec,
    run_dir: Path,
    log,
    report,
    pretraining_report,
    trackers: RunTrackers | None,
    stop_after_steps: int | None,
) -> str:
    """The body of one attempt: continue pretraining, write the records, fine-tune, mark done."""
    started = time.perf_counter()
    start_from_parent(run_dir, log)
    hooks = _probe_hooks(spec, run_dir)
    release = _child_release(run_dir, log)

    def report_and_release(progress: dict) -> None:
        pretraining_report(progress)
        release()

    with shares.team_for(spec) as team:  # several ranks: held over pretraining and fine-tuning
        state = pretrain(
            spec,
            run_dir,
            log=log,
            phase_end_hooks=hooks,
            progress=report_and_release,
            stop_after_steps=stop_after_steps,
            on_log=trackers.feed if trackers else None,
            after_checkpoint=lambda step: hold_if_asked(step, log),
        )
        release()
        if trackers:
            trackers.feed(state)  # the steps after the last log step
        if not state.done:
            rundir.write_status(run_dir, "interrupted")
            return "interrupted"
        wall = time.perf_counter() - started
        rundir.write_records(
            run_dir,
            _run_record(spec, state, run_dir, wall),
            state.curves,
            state.grad_norms,
            state.layer_rows,
            state.frozen,
        )
        rows = _fine_tune(run_dir, spec, log, report, team)
    if trackers and spec.eval.tasks:
        trackers.scores(rows, state.global_step)
    if trackers:
        trackers.finish(run_dir / "model")
    rundir.write_status(
        run_dir,
        "done",
        finished=time.time(),
        wall_time_s=round(wall, 3),
        total_time_s=round(time.perf_counter() - started, 3),
    )  # with fine-tuning: for ETAs
    log(f"done: {state.tokens_seen} tokens, token hash {state.token_hash[:16]}")
    return "done"


def _execute_derived(
    run_dir: Path, spec: RunSpec, log: Callable[[str], None], report: Callable[[dict], None]
) -> str:
    """A derived run (a layer transplant, ablate.evaluate.transplant): build it from its two finished
    source runs, fine-tune it on its tasks, mark it done."""
    from ablate.evaluate.transplant import build_hybrid

    started = time.perf_counter()
    build_hybrid(run_dir, spec, log)
    _fine_tune(run_dir, spec, log, report)
    wall = time.perf_counter() - started
    rundir.write_status(
        run_dir, "done", finished=time.time(), wall_time_s=round(wall, 3), total_time_s=round(wall, 3)
    )
    log(
        f"done: transplant {spec.labels['derived']['layers']} of {spec.labels['derived']['from']} "
        f"into {spec.labels['derived']['into']}"
    )
    return "done"


def _oom_reason(exc: BaseException, spec: RunSpec, run_dir: Path) -> str | None:
    """A CUDA out-of-memory said with phase, step, micro-batch, predicted peak and device memory (gpu_memory)."""
    from ablate.launch.oom import oom_reason
    from ablate.store.sweep import read_progress

    return oom_reason(exc, spec, read_progress(run_dir), int(os.environ.get("WORLD_SIZE", "1")))


def execute(
    run_dir: Path, stop_after_steps: int | None = None, on_progress: Callable[[dict], None] | None = None
) -> str:
    """Run (or resume, or finish) the run in `run_dir`; returns its final state.

    `on_progress` is called with what each log step reports (phase, step, total_steps, loss, ...) after
    progress.json is written; if it raises Pruned, the run ends with state `pruned`.

    In a data-parallel job (several ranks: torchrun or several submitit tasks) rank 0 does all of this;
    the other ranks train alongside it and fine-tune their share of the run's units (launch.shares), and
    write nothing else."""
    from ablate.train.distributed import world_from_env

    run_dir = Path(run_dir)
    rank, world, _ = world_from_env()
    if world > 1 and rank != 0:
        return _execute_follower(run_dir, stop_after_steps)
    lock = rundir.RunLock(run_dir)
    if not lock.acquire():
        raise AlreadyRunning(f"{run_dir.name} is already running elsewhere ({lock.holder()})")
    console = Console()
    log, log_file = _logger(run_dir, console)
    trackers = None

    def report(progress: dict) -> None:
        write_progress(run_dir, progress)
        console.progress(progress)

    def pretraining_report(progress: dict) -> None:
        report(progress)
        if on_progress is not None:  # e.g. a tune's pruning check: may raise Pruned
            on_progress(progress)

    try:
        if rundir.read_status(run_dir).get("state") == "done":
            log("already done")
            return "done"
        spec = load_spec(run_dir)
        attempt = int(rundir.read_status(run_dir).get("attempts", 0)) + 1
        rundir.write_status(
            run_dir,
            "running",
            attempts=attempt,
            started=time.time(),
            host=platform.node(),
            pid=os.getpid(),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )  # launch.gpus
        trackers = None if spec.labels.get("derived") else RunTrackers.for_spec(spec, run_dir, log)
        try:
            if spec.labels.get("derived"):
                return _execute_derived(run_dir, spec, log, report)
            return _pretrain_then_evaluate(
                spec, run_dir, log, report, pretraining_report, trackers, stop_after_steps
            )
        except Pruned as exc:
            rundir.write_status(run_dir, "pruned", pruned_at_step=exc.step, reason=exc.reason)
            log(f"pruned at step {exc.step}: {exc.reason}")
            return "pruned"
        except (KeyboardInterrupt, SystemExit):
            rundir.write_status(run_dir, "interrupted")
            raise
        except BaseException as exc:
            oom = _oom_reason(exc, spec, run_dir)
            error = traceback.format_exc()[-4000:] + (f"\n{oom}" if oom else "")
            rundir.write_status(run_dir, "failed", error=error, **({"out_of_gpu_memory": oom} if oom else {}))
            log(f"failed: {oom or f'{type(exc).__name__}: {exc}'}")
            raise
    finally:
        if trackers:
            trackers.close()  # after finish() this is a no-op; otherwise the next attempt resumes
        console.close()
        log_file.close()
        lock.release()
