"""One run's folder: its layout, status, lock and records, every file written atomically.

    results/<sweep>/runs/<run_id>/
        spec.json        the RunSpec (with its labels: sweep name, axis values)
        status.json      state (pending|submitted|running|interrupted|done|failed|pruned), times, attempts,
                         error tail (failed), step and reason (pruned: a tune's pruner ended it early)
        tune.json        (runs of a tune) the study, storage and trial the run reports to
        status.json.corrupt-<n>   a status.json that could not be read, set aside when the run was recovered
        progress.json    the running run's phase, step, loss (what `status` and the sweep's progress line show)
        records/run.json       token hashes (whole stream, per phase; token_hash_format), tokens seen, wall
                               time, family, layers, versions
        records/curves.json    per step: phase, step, tokens, loss, lr
        records/grads.json     per logged step: phase, step, layer, grad_norm
        records/layers.json    end of each phase: phase, layer, measure, value
        records/frozen.json    what each phase froze: phase, layer (the resolved plan)
        scores/<task>/seed-<n>.json   downstream scores, with what they were computed from (identity) and,
                                      when kept out of date on purpose, why they are `stale`
        scores/<task>/superseded/     score files replaced by a recomputation
        branch.json      (a child of the sweep's tree) the parent run and the step it starts from
        branch_points.json  (a parent) the steps whose checkpoints it keeps (checkpoints/branch/) for children
        branched.json    (a child that started) from the parent's checkpoint or, without one, from step 0
        checkpoints/, model/, log.txt

status.json says "done" only after every record is in place, so a folder is complete exactly when its
status says so.

May import: config, store.atomic.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, zip_longest
from pathlib import Path
from typing import Any

from ablate.config.errors import SpecError
from ablate.config.grid import DEFAULT_BASELINE, is_baseline_arm
from ablate.config.spec import RunSpec
from ablate.store import atomic
from ablate.store.lock import FileLock

STATES = ("pending", "submitted", "running", "interrupted", "done", "failed", "pruned")
FINAL_STATES = ("done", "failed", "pruned")  # a run in one of these has ended: its job has nothing left to do
TABLES = ("runs", "scores", "layers", "curves", "grads", "frozen")

TABLE_COLUMNS = {
    "runs": (
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
    ),
    "scores": (
        "run_id",
        "task",
        "language",
        "finetune_seed",
        "split",
        "metric",
        "value",
        "epoch",
        "wall_time_s",
        "n_examples",
        "stale",
    ),  # n_examples: of the split, as fine-tuned on (older score files: none)
    "layers": ("run_id", "phase", "layer", "measure", "value"),
    "curves": ("run_id", "phase", "step", "tokens", "loss", "lr"),
    "grads": ("run_id", "phase", "step", "layer", "grad_norm"),
    "frozen": ("run_id", "phase", "layer"),  # the resolved phase plan: what each phase froze (-1: embeddings)
}
RECORD_TABLES = ("curves", "grads", "layers", "frozen")  # records/<table>.json, column-oriented
# records/run.json's `token_hash_format` from which on the per-phase token hashes start from one constant
# (ablate.train.checkpoint), so that phase k of two runs can be compared; earlier records seed them by name
TOKEN_HASH_FORMAT = 2


def runs_dir(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / "runs"


def read_json(path: Path) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())


class DamagedRecord(SpecError):
    """A record another command relies on that is there but is not what its writer writes: exit 2 naming the
    file, what is wrong and what to do."""


def read_record(path: Path, problem_of, fix: str) -> Any:
    """The JSON at `path` (None when absent) once `problem_of(value)` says nothing is wrong with it; else
    DamagedRecord naming the file, the problem and `fix`."""
    try:
        value = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # a folder in its place, not JSON, not UTF-8
        raise DamagedRecord(f"cannot be read as JSON ({exc}); {fix}", file=str(path)) from None
    problem = problem_of(value)
    if problem:
        raise DamagedRecord(f"{problem}; {fix}", file=str(path))
    return value


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def spec_problem(value: Any) -> str | None:
    """Why spec.json's content is not a RunSpec of this version, or None."""
    try:
        RunSpec.model_validate(value)
    except ValueError as exc:  # pydantic's ValidationError: its first lines say which field
        return "not a run spec: " + " ".join(str(exc).split("\n")[:3])[:300]
    return None


RESPEC = "move the run folder aside and run the sweep again (it starts the run anew)"


def read_spec(run_dir: str | os.PathLike) -> RunSpec:
    """The run's spec.json as a RunSpec (FileNotFoundError when absent, DamagedRecord naming it otherwise)."""
    path = Path(run_dir) / "spec.json"
    value = read_record(path, spec_problem, RESPEC)
    if value is None:
        raise FileNotFoundError(2, "no spec.json", str(path))
    return RunSpec.model_validate(value)


class CorruptStatus(ValueError):
    """status.json is there but is no status record: never read as a state, never overwritten; it is moved
    aside (set_aside_corrupt_status) by whoever recovers the run, explicitly."""

    def __init__(self, path: Path, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{path} is corrupt: {problem}")


def read_status(run_dir: Path) -> dict:
    """The run's status.json ({"state": "pending"} when there is none); CorruptStatus when it is not a record."""
    path = os.path.join(run_dir, "status.json")
    try:
        status = read_json(path)
    except FileNotFoundError:
        return {"state": "pending"}
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are
        raise CorruptStatus(path, f"not JSON ({exc})") from None
    if not isinstance(status, dict):
        raise CorruptStatus(path, f"a JSON {type(status).__name__}, not a mapping")
    if status.get("state") not in STATES:  # a status record always says its state
        raise CorruptStatus(path, f"state {status.get('state')!r} is none of {', '.join(STATES)}")
    for key, kind in STATUS_TYPES.items():  # the fields its readers compute with
        value = status.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise CorruptStatus(path, f"{key} is {value!r}, not of its type")
    return status


STATUS_TYPES = {
    "attempts": int,
    "started": (int, float),
    "updated": (int, float),
    "wall_time_s": (int, float),
    "total_time_s": (int, float),
    "error": str,
}


def write_status(run_dir: Path, state: str, **fields) -> dict:
    """Set the state (and fields), keeping the other fields. A corrupt status.json is not replaced:
    CorruptStatus (set_aside_corrupt_status first)."""
    assert state in STATES, state
    previous = read_status(run_dir)
    status = {k: v for k, v in previous.items() if k not in ("state", "error")}
    status.update(fields, state=state, updated=time.time())
    atomic.write_json(Path(run_dir) / "status.json", status)
    return status


class AlreadyRunning(RuntimeError):
    """The run folder is locked by a worker elsewhere: the same run never runs twice at once."""


def set_aside_corrupt_status(run_dir: Path) -> Path:
    """Move status.json to status.json.corrupt-<n> (the first n not taken; nothing is ever deleted) and
    return where it went. The caller holds the run's lock."""
    source = Path(run_dir) / "status.json"
    n = 1
    while True:
        target = source.with_name(f"status.json.corrupt-{n}")
        try:
            os.link(source, target)  # unlike rename, never replaces an earlier corrupt-<n>
        except FileExistsError:
            n += 1
            continue
        source.unlink()
        return target


class RunLock(FileLock):
    """The lock on a run folder, held while a worker runs it: the same run never runs twice at once, even
    when two sweeps submit it."""

    def __init__(self, run_dir: Path):
        super().__init__(Path(run_dir) / ".lock")


def effective_state(run_dir: Path, status: dict | None = None) -> str:
    """The state a user should see: 'running' on disk but with nobody holding the lock is 'interrupted'."""
    status = status if status is not None else read_status(run_dir)
    state = status.get("state", "pending")
    if state == "running" and not RunLock(run_dir).held_elsewhere():
        return "interrupted"
    return state


def state_or_corrupt(run_dir: Path) -> str:
    """effective_state, or 'corrupt' for an unreadable status (the sweep reports it and submits the run again)."""
    try:
        return effective_state(run_dir)
    except CorruptStatus:
        return "corrupt"


# ---------------------------------------------------------------- shared prefixes (ablate.plan.branching)
# branch.json (a child): {"parent": run id, "step": N}; branch_points.json (a parent): {"steps": {N: [children]}};
# branched.json (a child that started): {"from": "parent" | "scratch", "step": N, "at": time}


def write_branch(run_dir: Path, parent: str | None, step: int = 0) -> None:
    """Where the run starts (the sweep writes it before submitting); parent None: from step 0."""
    path = Path(run_dir) / "branch.json"
    if parent is None:
        path.unlink(missing_ok=True)
    else:
        atomic.write_json(path, {"parent": parent, "step": int(step)})


RESUBMIT = "submit the grid again (`ablate sweep GRID`): the sweep writes the branch records before it submits"


def read_branch(run_dir: Path) -> dict | None:
    """branch.json: {"parent": run id, "step": N}, or None (the run starts from step 0); DamagedRecord."""

    def problem(v):
        if not isinstance(v, dict) or v.keys() != {"parent", "step"} or not isinstance(v["parent"], str):
            return f'not a branch record ({{"parent": run id, "step": N}}): {str(v)[:80]}'
        if not _count(v["step"]):
            return f'not a branch record ({{"parent": run id, "step": N}}): {str(v)[:80]}'
        return None

    return read_record(Path(run_dir) / "branch.json", problem, RESUBMIT)


def write_branch_points(run_dir: Path, steps: dict[int, list[str]]) -> None:
    """The steps whose checkpoints the run keeps for its children (none: the file goes)."""
    path = Path(run_dir) / "branch_points.json"
    if not steps:
        path.unlink(missing_ok=True)
    else:
        atomic.write_json(path, {"steps": {str(k): sorted(v) for k, v in steps.items()}})


def branch_points(run_dir: Path) -> dict[int, list[str]]:
    """branch_points.json's steps and the children at each ({} without one); DamagedRecord."""

    def problem(v):
        steps = v.get("steps") if isinstance(v, dict) and v.keys() == {"steps"} else None
        if not isinstance(steps, dict) or not all(
            k.isascii() and k.isdigit() and isinstance(c, list) and all(isinstance(x, str) for x in c)
            for k, c in steps.items()
        ):
            return f'not a branch points record ({{"steps": {{N: [run ids]}}}}): {str(v)[:80]}'
        return None

    record = read_record(Path(run_dir) / "branch_points.json", problem, RESUBMIT)
    return {} if record is None else {int(k): v for k, v in record["steps"].items()}


def mark_branched(run_dir: Path, source: str, step: int) -> None:
    atomic.write_json(Path(run_dir) / "branched.json", {"from": source, "step": int(step), "at": time.time()})


def branched(run_dir: Path) -> dict | None:
    """branched.json: how a child started ({"from": "parent" | "scratch", "step": N}), None before; DamagedRecord
    (the worker writes it as the child starts: delete it and run the sweep again)."""

    def problem(v):
        if (
            not isinstance(v, dict)
            or v.keys() != {"from", "step", "at"}
            or v["from"] not in ("parent", "scratch")
            or not _count(v["step"])
            or not isinstance(v["at"], (int, float))
        ):
            return f"not a record of how the run started ({{from, step, at}}): {str(v)[:80]}"
        return None

    fix = "delete it and run the sweep again: the run starts over from its checkpoint or its branch point"
    return read_record(Path(run_dir) / "branched.json", problem, fix)


def write_records(
    run_dir: Path, run: dict, curves: list[dict], grads: list[dict], layers: list[dict], frozen: list[dict]
) -> None:
    """The run's records, each atomically; the caller writes status "done" only after this returns.
    `frozen` is the phase plan's rows (ablate.plan.phases.frozen_rows): phase, layer."""
    rec = Path(run_dir) / "records"
    for name, rows in (("curves", curves), ("grads", grads), ("layers", layers), ("frozen", frozen)):
        columns = _columns(rows, TABLE_COLUMNS[name][1:])
        atomic.write_text(rec / f"{name}.json", json.dumps(columns, separators=(",", ":"), default=_plain) + "\n")
    atomic.write_json(rec / "run.json", run)


def _plain(value: Any) -> Any:
    """numpy / torch scalars as Python numbers (anything else as text, as atomic.write_json does)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


def _columns(rows: list[dict], names: tuple[str, ...]) -> dict[str, list]:
    """Column-oriented JSON: compact, and fast to turn into a DataFrame. Columns some rows carry beyond
    `names` (the curves' mask_rate, a mixture's loss/<member>) follow, None where a row lacks them."""
    extra = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in names]
    return {**{n: [r[n] for r in rows] for n in names}, **{k: [r.get(k) for r in rows] for k in extra}}


def read_scores(folder: Path, run_id: str) -> list[dict]:
    """Rows of scores/<task>/seed-<n>.json, in path order (os-level calls: collect does this per run), each
    with `stale`: whether its file is marked out of date (kept by `ablate evaluate --keep-stale`)."""
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
                for row in record["rows"]:
                    if problem := score_row_problem(row):
                        raise ValueError(f"{task_dir}/{name}: {problem}")
                stale = bool(record.get("stale"))
                rows += [{"run_id": run_id, **row, "stale": stale} for row in record["rows"]]
    return rows


def score_row_problem(row: Any) -> str | None:
    """Why a score file's row is not a score (task, split and metric as text, its value a number), or None."""
    if not isinstance(row, dict):
        return f"a row is a JSON {type(row).__name__}, not a mapping"
    for key in ("task", "split", "metric"):
        if not isinstance(row.get(key), str):
            return f"a row's {key} is {row.get(key)!r}, not text"
    value = row.get("value")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"a row's value is {value!r}, not a number"
    return None


def stale_scores(folder: Path) -> list[str]:
    """`<task>/seed-<n>` of each score file in folder/scores marked stale; unreadable files are left to
    read_scores to report."""
    out = []
    for path in sorted(Path(folder).glob("scores/*/seed-*.json")):
        try:
            record = read_json(path)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("stale"):
            out.append(f"{path.parent.name}/{path.stem}")
    return out


# --- what the pairing rule reads of a run (the rule: ablate.analysis.pairs; here so that collect can use it)


@dataclass(frozen=True)
class RunInfo:
    """What the pairing rule reads of one finished run."""

    run_id: str
    identity: str  # digest of the spec without phases, seed and non-training fields
    seed: int
    phases: tuple[str, ...]
    ends: tuple[int, ...]  # global step at the end of each phase
    schedule: str  # digest of the phases themselves (seed-noise pairs share it)
    baseline: bool
    data: str | None = None  # the grid's data choice (its `data` axis), if any

    @property
    def group(self) -> tuple:
        return self.identity, self.seed, self.ends


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def run_info(run_id: str, spec: RunSpec) -> RunInfo:
    phases = spec.model_dump(mode="json")["phases"]
    axes = spec.labels.get("axes") or {}
    baseline = is_baseline_arm(axes.get("schedule", DEFAULT_BASELINE), axes.get("freeze", "none"), spec.labels)
    ends = tuple(accumulate(spec.phase_steps()))
    return RunInfo(
        run_id,
        spec.training_identity,
        spec.seed,
        tuple(p.name for p in spec.phases),
        ends,
        _digest(phases),
        baseline,
        axes.get("data"),
    )


def baselines_by_group(infos: Sequence[RunInfo]) -> dict[tuple, list[RunInfo]]:
    """The MLM baselines of `infos` by their group (identity, seed, phase ends), for twins_of."""
    out: dict[tuple, list[RunInfo]] = {}
    for info in infos:
        if info.baseline:
            out.setdefault(info.group, []).append(info)
    return out


def twins_of(arm: RunInfo, baselines: dict[tuple, list[RunInfo]]) -> list[RunInfo]:
    """The arm's twins: the MLM baselines (baselines_by_group) with its identity, seed and phase ends, and of
    those the ones with its data choice (a grid's `data` axis) when any has it: a choice the baseline does not
    run (it names only phases the baseline lacks) pairs with the baselines of the group."""
    group = baselines.get(arm.group, [])
    return [b for b in group if b.data == arm.data] or list(group)


# --- the token stream a run consumed, as records/run.json says


@dataclass(frozen=True)
class TokenStream:
    whole: str | None  # token_hash: the whole stream
    phases: tuple[str | None, ...] | None  # per phase by position; None: older records (seeded by phase name)


def token_stream(run_record: dict, phases: Sequence[str]) -> TokenStream:
    """The run's token hashes; its per-phase hashes only when its record's token_hash_format makes them
    comparable with another run's."""
    by_name = run_record.get("phase_token_hashes")
    comparable = run_record.get("token_hash_format") == TOKEN_HASH_FORMAT and isinstance(by_name, dict)
    return TokenStream(run_record.get("token_hash"), tuple(by_name.get(p) for p in phases) if comparable else None)


def differing_phases(a: TokenStream, b: TokenStream) -> list[int]:
    """The 1-based phase positions whose hashes differ; none when either record cannot compare phases."""
    if a.phases is None or b.phases is None:
        return []
    return [k + 1 for k, (x, y) in enumerate(zip_longest(a.phases, b.phases)) if x != y]


SAME_TOKENS = "same"


def compare_streams(a: TokenStream, b: TokenStream) -> str:
    """ "same", "differ at phase 2, 3" (positions, where both records compare phases), "differ (whole
    stream)" (older records: whole streams only), or "unrecorded" (a record without a token hash)."""
    if a.whole is None or b.whole is None:
        return "unrecorded"
    positions = differing_phases(a, b)
    if positions:
        return "differ at phase " + ", ".join(map(str, positions))
    return SAME_TOKENS if a.whole == b.whole else "differ (whole stream)"
