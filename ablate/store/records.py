"""Run folders and the tidy tables collected from them.

    results/<sweep>/runs/<run_id>/
        spec.json        the RunSpec (with its labels: sweep name, axis values)
        status.json      state (pending|running|done|failed), times, attempts, error tail
        records/run.json       token hash, tokens seen, wall time, versions, frozen layers
        records/curves.json    per step: phase, step, tokens, loss, lr
        records/grads.json     per logged step: phase, step, layer, grad_norm
        records/layers.json    end of each phase: phase, layer, measure, value
        scores/<task>/seed-<n>.json   downstream scores
        checkpoints/, model/, log.txt

Every file is written atomically, and status.json says "done" only after every record is in place, so a
folder is complete exactly when its status says so: collect() reads records/ of done runs only. It reads
every folder, reports (in `problems`) and leaves out whole those it cannot read, and writes runs / scores /
layers / curves / grads as parquet and csv, each built in one go from column lists (10,000 runs: ~5 s).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ablate.store import atomic

STATES = ("pending", "submitted", "running", "interrupted", "done", "failed")
TABLES = ("runs", "scores", "layers", "curves", "grads")


def runs_dir(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / "runs"


def read_json(path: Path) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())


def read_status(run_dir: Path) -> dict:
    """The run's status.json ({"state": "pending"} when there is none); ValueError when it is not a record."""
    path = os.path.join(run_dir, "status.json")
    try:
        status = read_json(path)
    except FileNotFoundError:
        return {"state": "pending"}
    if not isinstance(status, dict) or status.get("state", "pending") not in STATES:
        raise ValueError(f"{path}: not a status record (a mapping with state in {', '.join(STATES)})")
    return status


def write_status(run_dir: Path, state: str, **fields) -> dict:
    """Set the state (and fields), keeping the other fields; an unreadable status.json is replaced."""
    assert state in STATES, state
    try:
        previous = read_status(run_dir)
    except ValueError:
        previous = {}
    status = {k: v for k, v in previous.items() if k not in ("state", "error")}
    status.update(fields, state=state, updated=time.time())
    atomic.write_json(Path(run_dir) / "status.json", status)
    return status


class RunLock:
    """An exclusive lock on a run folder, held while a worker runs it: the same run never runs twice at
    once, even when two sweeps submit it. The OS drops the lock when the process dies (kill -9 included).

    Looking (held_elsewhere, as `status`, `collect` and the launcher do) takes a shared lock for an
    instant and writes nothing; a worker that meets such a look retries for up to `wait_s` seconds rather
    than give up on its run."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".lock"
        self.fd: int | None = None

    def acquire(self, wait_s: float = 1.0) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def held_elsewhere(self) -> bool:
        """Is another process (or another RunLock in this one) holding the lock? Never blocks, never writes."""
        if self.fd is not None:
            return False
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the shared lock, if taken
        return False


def effective_state(run_dir: Path, status: dict | None = None) -> str:
    """The state a user should see: 'running' on disk but with nobody holding the lock is 'interrupted'."""
    status = status if status is not None else read_status(run_dir)
    state = status.get("state", "pending")
    if state == "running" and not RunLock(run_dir).held_elsewhere():
        return "interrupted"
    return state


def write_records(run_dir: Path, run: dict, curves: list[dict], grads: list[dict], layers: list[dict]) -> None:
    """The run's records, each atomically; the caller writes status "done" only after this returns."""
    rec = Path(run_dir) / "records"
    for name, rows in (("curves", curves), ("grads", grads), ("layers", layers)):
        columns = _columns(rows, TABLE_COLUMNS[name][1:])
        atomic.write_text(rec / f"{name}.json", json.dumps(columns, separators=(",", ":"), default=_plain) + "\n")
    atomic.write_json(rec / "run.json", run)


def _plain(value: Any) -> Any:
    """numpy / torch scalars as Python numbers (anything else as text, as atomic.write_json does)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


def _columns(rows: list[dict], names: tuple[str, ...]) -> dict[str, list]:
    """Column-oriented JSON: compact, and fast to turn into a DataFrame."""
    return {n: [r[n] for r in rows] for n in names}


# ------------------------------------------------------------------ collect

TABLE_COLUMNS = {
    "runs": ("run_id", "sweep", "model", "schedule", "freeze", "seed", "status", "token_hash", "tokens_seen",
             "wall_time_s", "versions"),
    "scores": ("run_id", "task", "language", "finetune_seed", "split", "metric", "value", "epoch", "wall_time_s"),
    "layers": ("run_id", "phase", "layer", "measure", "value"),
    "curves": ("run_id", "phase", "step", "tokens", "loss", "lr"),
    "grads": ("run_id", "phase", "step", "layer", "grad_norm"),
}
RECORD_TABLES = ("curves", "grads", "layers")   # records/<table>.json, column-oriented


@dataclass
class Collected:
    tables: dict[str, pd.DataFrame]
    problems: list[str] = field(default_factory=list)


class _ColumnTable:
    """Rows gathered as one list per column, turned into a DataFrame once (not one frame per run)."""

    def __init__(self, names: tuple[str, ...]):
        self.columns: dict[str, list] = {n: [] for n in names}
        self.n = 0

    def add_columns(self, run_id: str, cols: dict[str, list], n: int) -> None:
        for name, values in cols.items():
            if name not in self.columns:
                self.columns[name] = [None] * self.n
            self.columns[name].extend(values)
        for name, column in self.columns.items():
            if name == "run_id":
                column.extend([run_id] * n)
            elif name not in cols:
                column.extend([None] * n)
        self.n += n

    def add_rows(self, rows: list[dict]) -> None:
        for row in rows:
            for name in row:
                if name not in self.columns:
                    self.columns[name] = [None] * self.n
            for name, column in self.columns.items():
                column.append(row.get(name))
            self.n += 1

    def frame(self) -> pd.DataFrame:
        return _frame(self.columns)


def _frame(columns: dict[str, list]) -> pd.DataFrame:
    """pd.DataFrame(columns), through Arrow where it can (2-3x faster for long columns; same dtypes)."""
    import pyarrow as pa

    try:
        return pa.Table.from_pydict(columns).to_pandas()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return pd.DataFrame(columns)  # columns that mix kinds of values


def _record_columns(cols: Any, path: Path) -> tuple[dict[str, list], int]:
    """A column-oriented record, checked: a mapping of equally long lists."""
    if not isinstance(cols, dict) or not all(isinstance(v, list) for v in cols.values()):
        raise ValueError(f"{path.name}: not a mapping of columns")
    lengths = {len(v) for v in cols.values()}
    if len(lengths) > 1:
        raise ValueError(f"{path.name}: columns of different lengths {sorted(lengths)}")
    if "run_id" in cols:
        raise ValueError(f"{path.name}: has a run_id column")
    return cols, (lengths.pop() if lengths else 0)


def _score_rows(folder: Path, run_id: str) -> list[dict]:
    """Rows of scores/<task>/seed-<n>.json, in path order (os-level calls: collect does this per run)."""
    rows: list[dict] = []
    scores = os.path.join(folder, "scores")
    try:
        tasks = sorted(os.listdir(scores))
    except (FileNotFoundError, NotADirectoryError):
        return rows
    for task in tasks:
        task_dir = os.path.join(scores, task)
        try:
            names = sorted(os.listdir(task_dir))
        except NotADirectoryError:
            continue
        for name in names:
            if name.startswith("seed-") and name.endswith(".json"):
                record = read_json(os.path.join(task_dir, name))
                if not isinstance(record, dict) or not isinstance(record.get("rows"), list):
                    raise ValueError(f"{task_dir}/{name}: not a scores record (a mapping with a list of rows)")
                rows += [{"run_id": run_id, **row} for row in record["rows"]]
    return rows


def _run_row(run_dir: Path, spec: dict, status: dict, run_rec: dict) -> dict:
    labels = spec.get("labels") or {}
    axes = labels.get("axes") or {}
    row = {"run_id": run_dir.name, "sweep": labels.get("sweep", run_dir.parent.parent.name),
           "model": spec.get("model")}
    row.update(axes)  # every grid axis is a column; a `model` axis names the model as the grid does
    row.update(status=effective_state(run_dir, status), model_source=spec.get("model"),
               seed=spec.get("seed"), data_seed=(spec.get("data") or {}).get("data_seed"))
    row.update({k: v for k, v in run_rec.items() if not isinstance(v, (dict, list))})
    row.setdefault("wall_time_s", status.get("wall_time_s"))
    error = (status.get("error") or "").strip()
    row["error"] = error.splitlines()[-1] if error else ""
    return row


def _read_run(run_dir: Path) -> tuple[dict, dict[str, tuple[dict, int]], list[dict]]:
    """Everything collect takes from one run folder, read completely before any of it is used; records
    only from a run whose status says done (a folder is complete exactly when it does)."""
    folder = str(run_dir)
    spec = read_json(os.path.join(folder, "spec.json"))
    if not isinstance(spec, dict):
        raise ValueError("spec.json: not a mapping")
    status = read_status(run_dir)
    run_rec, parts = {}, {}
    if status.get("state") == "done":
        run_rec = read_json(os.path.join(folder, "records", "run.json"))
        if not isinstance(run_rec, dict):
            raise ValueError("run.json: not a mapping")
        for table in RECORD_TABLES:
            path = os.path.join(folder, "records", f"{table}.json")
            parts[table] = _record_columns(read_json(path), Path(path))
    scores = _score_rows(run_dir, run_dir.name)
    return _run_row(run_dir, spec, status, run_rec), parts, scores


def collect(sweep_dir: Path, write: bool = True) -> Collected:
    """Merge a sweep's run folders into the tidy tables; a folder that cannot be read is reported in
    `problems` and left out whole (none of its rows in any table)."""
    sweep_dir = Path(sweep_dir)
    runs, problems = [], []
    tables = {t: _ColumnTable(TABLE_COLUMNS[t]) for t in TABLES if t != "runs"}
    root = runs_dir(sweep_dir)
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    for run_dir in folders:
        try:
            row, parts, scores = _read_run(run_dir)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{run_dir}: skipped, unreadable record ({type(exc).__name__}: {exc})")
            continue
        runs.append(row)
        for table, (cols, n) in parts.items():
            if n:
                tables[table].add_columns(run_dir.name, cols, n)
        tables["scores"].add_rows(scores)
    for source_file in sorted((sweep_dir / "base").glob("*/source.json")):
        try:
            source = read_json(source_file)
            scores = _score_rows(source_file.parent, source_file.parent.name)
            runs.append({"run_id": source_file.parent.name, "sweep": sweep_dir.name, "schedule": "base",
                         "freeze": "none", "status": "done", "model_source": source.get("model")})
            tables["scores"].add_rows(scores)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{source_file.parent}: skipped, unreadable record ({type(exc).__name__}: {exc})")
    frames = {"runs": pd.DataFrame(runs), **{t: c.frame() for t, c in tables.items()}}
    for name, columns in TABLE_COLUMNS.items():
        frame = frames[name]
        for c in columns:  # the contract's columns are always there (empty where no run has them yet)
            if c not in frame.columns:
                frame[c] = pd.Series([None] * len(frame), dtype=object)
        # the contract's columns first, in its order; grid axes and any extra ones after
        frames[name] = frame[list(columns) + [c for c in frame.columns if c not in columns]]
    if write:
        write_tables(sweep_dir, frames)
    return Collected(frames, problems)


def _arrow_table(frame: pd.DataFrame):
    """The frame as an Arrow table for parquet and csv. A column that mixes kinds of values (an axis given as
    1e-4 and 2.0e-4 in YAML reads as a string and a float; a key that is a number in some runs and text in
    others) cannot be one Arrow column: such columns go as text, the rest as they are."""
    import pyarrow as pa

    try:
        return pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    fixed = {}
    for name in frame.columns[frame.dtypes == object]:
        if pd.api.types.infer_dtype(frame[name], skipna=True) not in ("string", "empty", "boolean", "integer",
                                                                      "floating", "mixed-integer-float"):
            fixed[name] = frame[name].map(lambda v: v if v is None or v is pd.NA or (isinstance(v, float) and v != v)
                                          else str(v))
    return pa.Table.from_pandas(frame.assign(**fixed), preserve_index=False)


def _write_csv(table, frame: pd.DataFrame, path: Path) -> None:
    """Arrow's CSV writer (about 10x faster than pandas'); pandas' where Arrow cannot write a column type."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    try:
        pa_csv.write_csv(table, path, write_options=pa_csv.WriteOptions(quoting_style="needed"))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        frame.to_csv(path, index=False)


def write_tables(sweep_dir: Path, tables: dict[str, pd.DataFrame]) -> None:
    """Each table as <name>.parquet and <name>.csv, each written under a temporary name and renamed."""
    import pyarrow.parquet as pq

    for name, frame in tables.items():
        table = _arrow_table(frame)
        for suffix, writer in ((".parquet", lambda p: pq.write_table(table, p)),
                               (".csv", lambda p: _write_csv(table, frame, p))):
            target = Path(sweep_dir) / f"{name}{suffix}"
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            try:
                writer(tmp)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            os.replace(tmp, target)
