"""A sweep's folder: where everything of one sweep (or tune study) lives, which sweep a command means, and
what its running runs report.

    results/<sweep>/
        sweep.json  grid.yaml        the manifest (run ids in grid order) and the grid as submitted
        calibration.json             measured throughput of the grid's steps (`ablate calibrate`; the cost plan)
        runs/<run_id>/               one folder per run (ablate.store.rundir)
        jobs/                        submitit's job files and logs
        <table>.parquet / .csv       the tidy tables (ablate.store.collect)

May import: config, store.rundir.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ablate.config.errors import SpecError
from ablate.config.paths import results_root
from ablate.store import atomic
from ablate.store.rundir import read_json, read_record


@dataclass(frozen=True)
class SweepFolder:
    root: Path

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def manifest(self) -> Path:
        return self.root / "sweep.json"

    @property
    def calibration(self) -> Path:
        return self.root / "calibration.json"

    def run(self, run_id: str) -> Path:
        return self.runs / run_id

    def run_ids(self) -> list[str]:
        """The manifest's run ids (grid order) when there is one; else every run folder, sorted."""
        if self.manifest.is_file():
            record = read_record(
                self.manifest,
                lambda v: (
                    None
                    if isinstance(v, dict)
                    and isinstance(v.get("run_ids"), list)
                    and all(isinstance(r, str) and r and "/" not in r for r in v["run_ids"])
                    else "not a sweep manifest (run_ids: a list of run ids)"
                ),
                "submit the grid again (`ablate sweep GRID`): it rewrites the manifest and keeps the run folders",
            )
            return list(record["run_ids"])
        return sorted(p.name for p in self.runs.iterdir() if p.is_dir()) if self.runs.is_dir() else []

    def table(self, name: str) -> Path | None:
        """The table's parquet file, else its csv, else None."""
        return next((p for p in (self.root / f"{name}.parquet", self.root / f"{name}.csv") if p.is_file()), None)

    @property
    def collected(self) -> bool:
        return self.table("runs") is not None

    def _recency(self) -> float:
        marks = [p for p in (self.manifest, self.table("runs"), self.runs) if p is not None and p.exists()]
        return max(p.stat().st_mtime for p in marks) if marks else 0.0


def list_sweeps(results: str | Path | None = None, collected: bool = False) -> list[SweepFolder]:
    """Sweeps under the results root (folders with run folders, or with tidy tables when `collected`),
    least recently touched first."""
    root = results_root(results)
    if not root.is_dir():
        return []
    found = [SweepFolder(d) for d in root.iterdir() if d.is_dir()]
    found = [s for s in found if (s.collected if collected else (s.runs.is_dir() or s.collected))]
    return sorted(found, key=SweepFolder._recency)


def resolve_sweep(
    sweep: str | Path | None = None, results: str | Path | None = None, collected: bool = False
) -> SweepFolder:
    """The sweep a command means: a folder path, a name under the results root, or (None) the most recent
    one. `collected` asks for a sweep with tidy tables (what the report reads)."""
    what = (
        "collected sweep (a folder with runs.parquet or runs.csv; run `ablate collect` first)"
        if collected
        else "sweep"
    )
    if sweep is None or str(sweep) == "":
        sweeps = list_sweeps(results, collected)
        if not sweeps:
            raise SpecError(f"no {what} under the results root", key="SWEEP", value=str(results_root(results)))
        return sweeps[-1]
    path = Path(sweep).expanduser()
    for candidate in (path, results_root(results) / path):
        if candidate.is_dir() and (candidate / "runs").is_dir() or SweepFolder(candidate).collected:
            folder = SweepFolder(candidate)
            if collected and not folder.collected:
                raise SpecError(
                    "the sweep has no tidy tables (runs.parquet / runs.csv); run `ablate collect`",
                    key="SWEEP",
                    value=str(candidate),
                )
            return folder
    raise SpecError(
        f"no such {what.split(' (')[0]}",
        key="SWEEP",
        value=str(sweep),
        allowed=", ".join(s.name for s in list_sweeps(results, collected)) or "(none yet)",
    )


def read_progress(run_dir: Path) -> dict | None:
    """What a running run last reported (phase, step, total_steps, loss, ...); None when it has reported
    nothing readable yet."""
    try:
        progress = read_json(Path(run_dir) / "progress.json")
    except (OSError, ValueError):
        return None
    if not isinstance(progress, dict) or not {"phase", "step", "total_steps"} <= progress.keys():
        return None
    typed = (
        isinstance(progress["phase"], str)
        and all(type(progress[k]) is int for k in ("step", "total_steps"))
        and all(isinstance(progress.get(k, 0.0), (int, float)) for k in ("loss", "tokens_per_s"))
    )
    return progress if typed else None  # rewritten at the next log step: nothing to show meanwhile


def write_progress(run_dir: Path, progress: dict) -> None:
    atomic.write_json(Path(run_dir) / "progress.json", progress)


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def describe_progress(progress: dict | None) -> str:
    """'clm 12/40 loss 3.214' (or 'starting' before the first report); the fine-tuning stage:
    'fine-tuning ncbi_disease seed 0 epoch 1/2 step 40/126 loss 0.412 dev f1 0.512 ETA 1m20s'."""
    if progress is None:
        return "starting"
    if progress.get("stage") == "finetune" and "task" in progress:
        dev = progress.get("dev")
        return (
            f"fine-tuning {progress['task']} seed {progress['seed']} epoch {progress['epoch']}/"
            f"{progress['epochs']} step {progress['step']}/{progress['total_steps']}"
            + (f" loss {progress['loss']:.3f}" if isinstance(progress.get("loss"), (int, float)) else "")
            + (f" dev {progress['dev_metric']} {dev:.3f}" if isinstance(dev, (int, float)) else "")
            + f" ETA {format_duration(progress.get('eta_s', 0))}"
        )
    if progress.get("stage") == "finetune":
        return progress["phase"]
    loss = progress.get("loss")
    return f"{progress['phase']} {progress['step']}/{progress['total_steps']}" + (
        f" loss {loss:.3f}" if isinstance(loss, (int, float)) else ""
    )
