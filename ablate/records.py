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
folder is complete exactly when its status says so. collect() reads whatever is there, reports folders it
cannot read, and writes runs / scores / layers / curves / grads as parquet and csv.
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

from ablate import atomic

STATES = ("pending", "submitted", "running", "interrupted", "done", "failed")
TABLES = ("runs", "scores", "layers", "curves", "grads")


def runs_dir(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / "runs"


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def read_status(run_dir: Path) -> dict:
    path = Path(run_dir) / "status.json"
    if not path.is_file():
        return {"state": "pending"}
    return read_json(path)


def write_status(run_dir: Path, state: str, **fields) -> dict:
    assert state in STATES, state
    status = {k: v for k, v in read_status(run_dir).items() if k not in ("state", "error")}
    status.update(fields, state=state, updated=time.time())
    atomic.write_json(Path(run_dir) / "status.json", status)
    return status


class RunLock:
    """An exclusive lock on a run folder, held while a worker runs it: the same run never runs twice at
    once, even when two sweeps submit it. The OS drops the lock when the process dies (kill -9 included)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".lock"
        self.fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
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
        if not self.path.is_file():
            return False
        if self.acquire():
            self.release()
            return False
        return True


def effective_state(run_dir: Path, status: dict | None = None) -> str:
    """The state a user should see: 'running' on disk but with nobody holding the lock is 'interrupted'."""
    status = status if status is not None else read_status(run_dir)
    state = status.get("state", "pending")
    if state == "running" and not RunLock(run_dir).held_elsewhere():
        return "interrupted"
    return state


def write_records(run_dir: Path, run: dict, curves: list[dict], grads: list[dict], layers: list[dict]) -> None:
    rec = Path(run_dir) / "records"
    atomic.write_json(rec / "curves.json", _columns(curves, ("phase", "step", "tokens", "loss", "lr")))
    atomic.write_json(rec / "grads.json", _columns(grads, ("phase", "step", "layer", "grad_norm")))
    atomic.write_json(rec / "layers.json", _columns(layers, ("phase", "layer", "measure", "value")))
    atomic.write_json(rec / "run.json", run)


def _columns(rows: list[dict], names: tuple[str, ...]) -> dict[str, list]:
    """Column-oriented JSON: compact, and fast to turn into a DataFrame."""
    return {n: [r[n] for r in rows] for n in names}


# ------------------------------------------------------------------ collect

@dataclass
class Collected:
    tables: dict[str, pd.DataFrame]
    problems: list[str] = field(default_factory=list)


def _run_row(run_dir: Path, spec: dict, status: dict, run_rec: dict) -> dict:
    labels = spec.get("labels", {})
    row = {"run_id": run_dir.name, "sweep": labels.get("sweep", run_dir.parent.parent.name)}
    row.update({k: v for k, v in labels.get("axes", {}).items()})
    row.update(status=effective_state(run_dir, status), model_source=spec.get("model"),
               seed=spec.get("seed"), data_seed=spec.get("data", {}).get("data_seed"))
    row.update({k: v for k, v in run_rec.items() if not isinstance(v, (dict, list))})
    row.setdefault("wall_time_s", status.get("wall_time_s"))
    error = (status.get("error") or "").strip()
    row["error"] = error.splitlines()[-1] if error else ""
    return row


def _score_rows(folder: Path, run_id: str) -> list[dict]:
    rows = []
    for score_file in sorted(folder.glob("scores/*/seed-*.json")):
        rows += [{"run_id": run_id, **row} for row in read_json(score_file)["rows"]]
    return rows


def collect(sweep_dir: Path, write: bool = True) -> Collected:
    sweep_dir = Path(sweep_dir)
    runs, problems = [], []
    frames: dict[str, list[pd.DataFrame]] = {t: [] for t in TABLES if t != "runs"}
    chunks: dict[str, list[dict]] = {t: [] for t in frames}
    folders = sorted(p for p in runs_dir(sweep_dir).iterdir() if p.is_dir()) if runs_dir(sweep_dir).is_dir() else []
    for run_dir in folders:
        try:
            spec = read_json(run_dir / "spec.json")
            status = read_status(run_dir)
            rec = run_dir / "records"
            run_rec = read_json(rec / "run.json") if status.get("state") == "done" else {}
            for table in ("curves", "grads", "layers"):
                if status.get("state") == "done":
                    cols = read_json(rec / f"{table}.json")
                    if cols and next(iter(cols.values())):
                        chunks[table].append({"run_id": run_dir.name, **cols})
            chunks["scores"] += _score_rows(run_dir, run_dir.name)
            runs.append(_run_row(run_dir, spec, status, run_rec))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{run_dir}: skipped, unreadable record ({type(exc).__name__}: {exc})")
    for base_dir in sorted((sweep_dir / "base").glob("*/source.json")):
        try:
            source = read_json(base_dir)
            chunks["scores"] += _score_rows(base_dir.parent, base_dir.parent.name)
            runs.append({"run_id": base_dir.parent.name, "sweep": sweep_dir.name, "schedule": "base",
                         "freeze": "none", "status": "done", "model_source": source.get("model")})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"{base_dir.parent}: skipped, unreadable record ({type(exc).__name__}: {exc})")
    tables = {"runs": pd.DataFrame(runs)}
    for table, items in chunks.items():
        if table == "scores":
            tables[table] = pd.DataFrame(items)
        else:
            parts = [pd.DataFrame(c) for c in items]
            tables[table] = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    for name, columns in TABLE_COLUMNS.items():
        frame = tables[name]
        if frame.empty:
            tables[name] = pd.DataFrame(columns=list(columns))
        else:  # the contract's columns first, in its order; any extra ones after
            lead = [c for c in columns if c in frame.columns]
            tables[name] = frame[lead + [c for c in frame.columns if c not in lead]]
    if write:
        write_tables(sweep_dir, tables)
    return Collected(tables, problems)


TABLE_COLUMNS = {
    "runs": ("run_id", "sweep", "status"),
    "scores": ("run_id", "task", "language", "finetune_seed", "split", "metric", "value", "epoch", "wall_time_s"),
    "layers": ("run_id", "phase", "layer", "measure", "value"),
    "curves": ("run_id", "phase", "step", "tokens", "loss", "lr"),
    "grads": ("run_id", "phase", "step", "layer", "grad_norm"),
}


def write_tables(sweep_dir: Path, tables: dict[str, pd.DataFrame]) -> None:
    for name, frame in tables.items():
        for suffix, writer in ((".parquet", lambda f, p: f.to_parquet(p, index=False)),
                               (".csv", lambda f, p: f.to_csv(p, index=False))):
            target = Path(sweep_dir) / f"{name}{suffix}"
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            writer(frame, tmp)
            os.replace(tmp, target)
