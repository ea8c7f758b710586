"""Shared prefixes trained once (ablate.plan.branching): the prefix finder, a branched child ending bitwise as
the same run from scratch (weights, curves, token hashes, layer rows, representations, scores), kill -9 of a
parent mid-run and of a child right after it branched, a sweep of the tree end to end, the dry run's tree and
savings, and a Slurm child's dependency on its parent's job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ablate.config.spec import RunSpec, parse_run_spec
from ablate.launch import worker
from ablate.plan.branching import RunPlan, branch_step, plan_tree
from ablate.plan.phases import plan_phases
from ablate.store import rundir
from ablate.train.schedule import lr_at
from builders import tiny_base, write_yaml
from held import start_held
from in_process import ablate

DECAY = {"decay": "1-sqrt", "final_fraction": 0.1}
FINETUNE = {"epochs": 1, "max_train_examples": 16, "max_eval_examples": 16, "max_length": 32, "batch_size": 8}


def spec_of(main: int = 6, decay: int = 2, decay_freeze="none", main_lr=None, tasks=(), **over) -> RunSpec:
    spec = tiny_base(
        checkpoint_every=3,
        device="cpu",
        probe={"n_texts": 4, "max_length": 32},
        eval={"tasks": list(tasks), "seeds": [0], "finetune": FINETUNE},
        phases=[
            {
                "name": "main",
                "objective": "mlm",
                "mask_rate": 0.3,
                "steps": main,
                "lr": main_lr or {"warmup_steps": 1},
            },
            {"name": "mlm_decay", "objective": "mlm", "steps": decay, "lr": DECAY, "freeze": decay_freeze},
        ],
    )
    return parse_run_spec({**spec, **over})


def plan_of(spec: RunSpec) -> RunPlan:
    return RunPlan(spec.run_id, spec, tuple(plan_phases(spec, 4)))


def step(child: RunSpec, parent: RunSpec) -> int:
    return branch_step(plan_of(child), plan_of(parent), lr_at)


# ---------------------------------------------------------------- the prefix finder (pure)


def test_a_constant_main_phase_shares_its_prefix_with_a_longer_one_and_a_decay_does_not():
    long, short = spec_of(main=8, decay=3), spec_of(main=5, decay=2)
    assert step(short, long) == 5  # the end of the child's main phase, inside the parent's
    # decays of different lengths: a 1-sqrt decay's first step is at peak whatever its length, then they part
    assert step(spec_of(main=6, decay=2), spec_of(main=6, decay=4)) == 7
    assert step(spec_of(main=6, decay=1), spec_of(main=6, decay=4)) == 6  # one step: at its floor at once
    assert step(spec_of(main=6, decay=3, decay_freeze="low"), spec_of(main=6, decay=3)) == 6
    # the parent's phase ends inside the child's: its checkpoint there holds the phase-end work, one step back
    assert step(spec_of(main=8, decay=2), spec_of(main=5, decay=6)) == 4


@pytest.mark.parametrize(
    "child, why",
    [
        (spec_of(main=6, decay=2, main_lr={"warmup_fraction": 0.5}), "a warmup fraction of a shorter phase"),
        (spec_of(main=6, decay=2, seed=18), "another seed"),
        (spec_of(main=6, decay=2, optim={"lr": 1e-4}), "another LR"),
        (
            spec_of(
                main=6,
                decay=2,
                data={
                    "corpus": "corpus_en_e3c/train.txt",
                    "valid_corpus": "corpus_en_e3c/valid.txt",
                    "max_documents": 120,
                    "seq_len": 32,
                    "data_seed": 7,
                },
            ),
            "another data seed",
        ),
        (spec_of(main=6, decay=2, batch_size=8), "another batch"),
        (spec_of(main=6, decay=2, micro_batch_size=2), "gradient accumulation"),
        (spec_of(main=6, decay=2, vocab_loss="dense"), "another vocabulary loss (rounding)"),
        (spec_of(main=6, decay=2, probe={"n_texts": 2, "max_length": 32}), "another probe (other layer rows)"),
    ],
)
def test_a_spec_that_differs_in_what_is_computed_never_branches(child, why):
    parent = spec_of(main=8, decay=2, main_lr={"warmup_fraction": 0.5})
    if "warmup" not in why:
        parent = spec_of(main=8, decay=2)
    assert step(child, parent) == 0, why


def test_mask_rate_freeze_and_phase_names_are_compared_phase_by_phase():
    parent = spec_of(main=6, decay=2)
    other_rate = parent.model_copy(
        update={"phases": (parent.phases[0].model_copy(update={"mask_rate": 0.15}), parent.phases[1])}
    )
    renamed = parent.model_copy(
        update={"phases": (parent.phases[0].model_copy(update={"name": "mlm"}), parent.phases[1])}
    )
    frozen = parent.model_copy(
        update={"phases": (parent.phases[0].model_copy(update={"freeze": ("low",)}), parent.phases[1])}
    )
    for child in (other_rate, renamed, frozen):
        assert step(child, parent) == 0
    labels_only = parent.model_copy(
        update={"labels": {"x": 1}, "log_every": 1, "checkpoint_every": 1, "eval": {"tasks": ["ncbi_disease"]}}
    )
    assert step(labels_only, spec_of(main=6, decay=4)) == 7


def test_the_tree_trains_each_shared_prefix_once_and_respects_opt_outs():
    runs = [spec_of(main=6, decay=d) for d in (1, 2, 4)]
    tree = plan_tree([plan_of(s) for s in runs], lr_at)
    root = runs[2].run_id  # the longest trains the main phase
    assert {c: (b.parent, b.step) for c, b in tree.branches.items()} == {
        runs[0].run_id: (root, 6),
        runs[1].run_id: (root, 7),
    }
    assert tree.keep_steps(root) == {6: [runs[0].run_id], 7: [runs[1].run_id]}
    assert tree.trained_tokens() == (10 + 1 + 1) * 128 and tree.planned_tokens() == (7 + 8 + 10) * 128
    assert tree.depth_order()[0] == root
    out = plan_tree([plan_of(s.model_copy(update={"branching": False})) for s in runs], lr_at)
    assert not out.branches


# ---------------------------------------------------------------- bitwise: a branched child = the run from scratch


def _execute(spec: RunSpec, run_dir: Path) -> Path:
    worker.prepare_run_dir(spec, run_dir)
    assert worker.execute(run_dir) == "done"
    return run_dir


def _tree_folders(root: Path, specs: list[RunSpec]) -> dict[str, Path]:
    """What the sweep writes before submitting: spec, branch.json, branch_points.json per run."""
    tree = plan_tree([plan_of(s) for s in specs], lr_at)
    folders = {}
    for s in specs:
        folder = root / "runs" / s.run_id
        worker.prepare_run_dir(s, folder)
        b = tree.branches.get(s.run_id)
        rundir.write_branch(folder, b.parent if b else None, b.step if b else 0)
        rundir.write_branch_points(folder, tree.keep_steps(s.run_id))
        folders[s.run_id] = folder
    return folders


def assert_same_run(a: Path, b: Path, scores: bool = True) -> None:
    wa, wb = load_file(str(a / "model" / "model.safetensors")), load_file(str(b / "model" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)
    for name in ("curves", "grads", "layers", "frozen"):
        assert rundir.read_json(a / "records" / f"{name}.json") == rundir.read_json(
            b / "records" / f"{name}.json"
        ), name
    ra, rb = rundir.read_json(a / "records" / "run.json"), rundir.read_json(b / "records" / "run.json")
    for key in ("token_hash", "phase_token_hashes", "phase_tokens", "tokens_seen", "steps"):
        assert ra[key] == rb[key], key
    reps_a = sorted(p.name for p in (a / "records" / "reps").iterdir())
    assert reps_a == sorted(p.name for p in (b / "records" / "reps").iterdir())
    for name in reps_a:
        assert (a / "records" / "reps" / name).read_bytes() == (b / "records" / "reps" / name).read_bytes(), name
    if not scores:
        return
    sa, sb = rundir.read_scores(a, "x"), rundir.read_scores(b, "x")
    key = lambda r: (r["task"], r["finetune_seed"], r["split"], r["metric"])  # noqa: E731
    assert {key(r): r["value"] for r in sa} == {key(r): r["value"] for r in sb}


PARENT = spec_of(main=4, decay=3)  # the kill test's parent, and the decay-length child
CASES = {
    "decay-length": (spec_of(main=6, decay=3), spec_of(main=4, decay=3, tasks=("ncbi_disease",)), 4),
    "decay-freeze": (PARENT, spec_of(main=4, decay=3, decay_freeze="low"), 4),
}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory, data_root):
    """Each case's child trained alone, from step 0 (run once, compared often)."""
    root = tmp_path_factory.mktemp("scratch")
    return {name: _execute(child, root / name) for name, (_, child, _) in CASES.items()}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_branched_child_ends_bitwise_as_the_same_run_from_scratch(case, scratch, tmp_path):
    parent, child, at = CASES[case]  # decay-length: the child's main phase ends inside the parent's
    folders = _tree_folders(tmp_path / "tree", [parent, child])
    assert rundir.read_branch(folders[child.run_id]) == {"parent": parent.run_id, "step": at}
    _execute(parent, folders[parent.run_id])
    assert (folders[parent.run_id] / "checkpoints" / "branch" / f"step-{at:09d}" / "state.json").is_file()
    _execute(child, folders[child.run_id])
    assert rundir.branched(folders[child.run_id])["from"] == "parent"
    assert "started from its checkpoint" in (folders[child.run_id] / "log.txt").read_text()
    assert not (folders[parent.run_id] / "checkpoints" / "branch" / f"step-{at:09d}").exists()  # all started
    assert_same_run(folders[child.run_id], scratch[case])
    if case == "decay-length":
        assert rundir.read_scores(scratch[case], "x")  # scores compared, not absent on both sides


def _execute_killed(run_dir: Path, pause_at: int, tmp_path: Path) -> None:
    """Run the folder in a subprocess held at `pause_at` (ABLATE_PAUSE_AT), kill -9 it there, then run it again."""
    threads = str(torch.get_num_threads())  # what the in-process runs compared with used: the same sums
    env = {**os.environ, "OMP_NUM_THREADS": threads, "ABLATE_PAUSE_AT": f"{pause_at}:{tmp_path / 'never'}"}
    code = f"from ablate.launch import worker; worker.execute({str(run_dir)!r})"
    proc, _ = start_held([sys.executable, "-c", code], env)  # the worker holds there for minutes
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert rundir.read_status(run_dir)["state"] == "running" and not (run_dir / "model").exists()
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "OMP_NUM_THREADS": threads},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_kill_9_of_a_parent_mid_run_and_of_a_child_right_after_branching_resume_to_the_same_bits(
    scratch, tmp_path
):
    parent, child, at = CASES["decay-freeze"]
    folders = _tree_folders(tmp_path / "tree", [parent, child])
    _execute_killed(folders[parent.run_id], 3, tmp_path)  # its checkpoint at step 3, before the branch
    assert "resumed from step-000000003" in (folders[parent.run_id] / "log.txt").read_text()
    _execute_killed(folders[child.run_id], at, tmp_path)  # held right after it adopted step 4
    text = (folders[child.run_id] / "log.txt").read_text()
    assert text.count("started from its checkpoint") == 1 and f"resumed from step-{at:09d}" in text
    assert_same_run(folders[parent.run_id], scratch["decay-length"], scores=False)  # PARENT, alone
    assert_same_run(folders[child.run_id], scratch["decay-freeze"])


@pytest.mark.slow
def test_a_child_whose_parent_has_no_checkpoint_there_trains_from_step_0(tmp_path, data_root):
    parent, child = spec_of(main=4, decay=3), spec_of(main=4, decay=1)
    folders = _tree_folders(tmp_path, [parent, child])
    rundir.write_branch_points(folders[parent.run_id], {})  # trained before the tree named the step
    _execute(parent, folders[parent.run_id])
    _execute(child, folders[child.run_id])
    assert rundir.branched(folders[child.run_id])["from"] == "scratch"
    assert "training from step 0" in (folders[child.run_id] / "log.txt").read_text()


# ---------------------------------------------------------------- the tree as a sweep


def _grid(tmp_path: Path, executor: str = "local", **top) -> Path:
    main = {"name": "main", "objective": "mlm", "mask_rate": 0.3, "steps": 4, "lr": {"warmup_steps": 1}}
    grid = {
        "sweep": "branch",
        "base": tiny_base(checkpoint_every=3, probe={"n_texts": 4, "max_length": 32}),
        "schedules": {
            f"d{n}": [main, {"name": "mlm_decay", "objective": "mlm", "steps": n, "lr": DECAY}] for n in (1, 3)
        },
        "axes": {"schedule": ["d1", "d3"]},
        "allow_unequal_compute": True,
        "launcher": {
            "executor": executor,
            "local": {"parallel": 2},
            "slurm": {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 3, "timeout_min": 30},
        },
        **top,
    }
    return write_yaml(tmp_path / "branch.yaml", grid, sort_keys=False)


def _cli(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ablate.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or {**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _ids(results: Path) -> dict[str, str]:
    return {
        rundir.read_json(p)["labels"]["axes"]["schedule"]: p.parent.name
        for p in (results / "branch" / "runs").glob("*/spec.json")
    }


@pytest.mark.slow
def test_the_dry_run_prints_the_tree_and_counts_what_is_trained(tmp_path, data_root):
    done = ablate(["sweep", _grid(tmp_path), "--dry-run", "--tokens-per-s", "1000"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert ": branch of " in done.stdout and "@ step 4 (trains 1 of 5 steps)" in done.stdout
    assert "trained 1,024 of 1,536 tokens (0.67x), 512 saved" in done.stdout and "GPU-hours saved" in done.stdout
    total = [line for line in done.stdout.splitlines() if line.startswith("       total")]
    assert total and "1,024" in total[-1]
    from ablate.config.grid import load_grid
    from ablate.launch.checks import sweep_tree
    from ablate.plan.grid import expand

    off = load_grid(_grid(tmp_path, branching=False))
    assert sweep_tree(off, expand(off), {}) is None  # `branching: false`: no tree, every run from 0


@pytest.mark.slow
def test_a_local_sweep_runs_the_tree_end_to_end_and_status_shows_it(tmp_path, data_root):
    grid, results = _grid(tmp_path), tmp_path / "results"
    done = ablate(["sweep", grid, "--results", results, "--poll", "0.2"], tmp_path, {"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "branching: 1 runs start from another run's checkpoint (1 of those to run wait" in done.stdout
    ids = _ids(results)
    child = results / "branch" / "runs" / ids["d1"]
    assert rundir.read_branch(child) == {"parent": ids["d3"], "step": 4}
    assert rundir.branched(child)["from"] == "parent"
    status = ablate(["status", "branch", "--results", results], tmp_path)
    assert f"branch of {ids['d3']} @ step 4 (started)" in status.stdout, status.stdout
    again = ablate(["sweep", grid, "--results", results, "--poll", "0.2"], tmp_path)
    assert again.returncode == 0 and "nothing to submit" in again.stdout


def test_a_failed_parent_fails_its_waiting_children_naming_it(tmp_path):
    from ablate.launch.branches import Children
    from ablate.store.sweep import SweepFolder

    paths = SweepFolder(tmp_path / "s")
    parent, child = spec_of(main=4, decay=3), spec_of(main=4, decay=1)
    for s in (parent, child):
        worker.prepare_run_dir(s, paths.run(s.run_id))
    rundir.write_branch(paths.run(child.run_id), parent.run_id, 4)
    rundir.write_status(paths.run(parent.run_id), "running")
    children = Children(paths, [child.run_id])
    assert children.left == [child.run_id] and children.ready() == []  # its parent has not reached step 4
    rundir.write_status(paths.run(parent.run_id), "failed", error="boom")
    assert children.ready() == [] and not children.left
    error = rundir.read_status(paths.run(child.run_id))["error"]
    assert f"its parent run {parent.run_id} is failed before step 4" in error and "--retry-failed" in error


@pytest.mark.slow
@pytest.mark.slurm
def test_a_slurm_child_job_waits_for_its_parents_pretraining_to_its_branch_step_only(
    tmp_path, slurm_env, data_root
):
    from ablate.config.grid import load_grid
    from ablate.plan.grid import expand

    grid, results = _grid(tmp_path, executor="slurm"), tmp_path / "results"
    runs = results / "branch" / "runs"
    ids = {r.spec.labels["axes"]["schedule"]: r.run_id for r in expand(load_grid(grid))}
    # the parent (d3: 7 steps) holds after its last checkpoint, its pretraining unfinished, until the child
    # (d1: from the parent's step 4) has finished its own pretraining: only a child released at step 4 can
    child_records = runs / ids["d1"] / "records" / "run.json"
    done = _cli(
        ["sweep", str(grid), "--results", str(results), "--poll", "1"],
        tmp_path,
        env={**slurm_env, "OMP_NUM_THREADS": "1", "ABLATE_PAUSE_AT": f"7:{child_records}"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert _ids(results) == ids
    parent_log = (runs / ids["d3"] / "log.txt").read_text()
    assert f"child {ids['d1']} at step 4: job" in parent_log and "released" in parent_log, parent_log
    assert child_records.stat().st_mtime < (runs / ids["d3"] / "model" / "config.json").stat().st_mtime
    parent_job = rundir.read_status(runs / ids["d3"])["job_id"]
    child_status = rundir.read_status(runs / ids["d1"])
    script = Path(child_status["job_stdout"]).parent.glob(f"{child_status['job_id'].split('_')[0]}*submission*")
    text = "".join(p.read_text() for p in script) or "".join(
        p.read_text() for p in (results / "branch").rglob("*submission*.sh")
    )
    assert f"--dependency=afterok:{parent_job}" in text
    assert rundir.branched(runs / ids["d1"])["from"] == "parent"


def test_a_parent_releases_its_slurm_children_once_at_their_branch_step_and_leaves_others(tmp_path, monkeypatch):
    from ablate.launch import branches
    from ablate.train.checkpoint import kept_path

    runs = tmp_path / "runs"
    parent, on_slurm, local = runs / "p", runs / "c1", runs / "c2"
    for d in (parent, on_slurm, local):
        d.mkdir(parents=True)
    rundir.write_status(on_slurm, "submitted", executor="slurm", job_id="41_0")
    rundir.write_status(local, "pending")
    lifted = []
    monkeypatch.setattr(branches, "release_job", lambda job: lifted.append(job) or f"job {job} released")
    points, released = {4: ["c1", "c2"]}, set()
    assert branches.release_children(parent, points, released) == [] and not released  # no checkpoint yet
    (kept_path(parent / "checkpoints", 4)).mkdir(parents=True)
    (kept_path(parent / "checkpoints", 4) / "state.json").write_text("{}")
    assert branches.release_children(parent, points, released) == ["child c1 at step 4: job 41_0 released"]
    assert branches.release_children(parent, points, released) == [] and lifted == ["41_0"]  # once
