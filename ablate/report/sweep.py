"""A collected sweep's tidy tables as one `Sweep`, the input of every figure.

Which folder a sweep name means is ablate.store.sweep's answer (resolve_sweep with collected=True); this
module only reads the tables the figures draw from.

May import: config, store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ablate.config.errors import SpecError
from ablate.config.grid import DEFAULT_BASELINE, declared_baseline
from ablate.report.arms import with_data_arms
from ablate.store import sweep as store_sweep
from ablate.store.sweep import SweepFolder

# the tables the figures read (not grads); score_groups: the per-group scores of tasks with group_by
TABLES = ("runs", "scores", "layers", "curves", "frozen", "pairs", "score_groups")


@dataclass(frozen=True)
class Sweep:
    """The tidy tables of one collected sweep; a table the sweep lacks is None."""

    path: Path
    runs: pd.DataFrame
    scores: pd.DataFrame | None = None
    layers: pd.DataFrame | None = None
    curves: pd.DataFrame | None = None
    frozen: pd.DataFrame | None = None
    pairs: pd.DataFrame | None = None  # `ablate collect --pairs`
    score_groups: pd.DataFrame | None = None  # metrics per group (a task's group_by: the needle's lengths)
    baseline: str = DEFAULT_BASELINE  # the baseline arm's schedule, as the sweep's grid declares it

    @property
    def name(self) -> str:
        return self.path.name

    def require(self, table: str, figure: str) -> pd.DataFrame:
        df = getattr(self, table)
        if df is None or df.empty:
            raise SpecError(
                f"figure {figure!r} needs the {table} table, which is missing or empty in this sweep",
                file=str(self.path),
                key=table,
            )
        return df


def list_sweeps(results: str | Path | None = None) -> list[Path]:
    """Folders of the collected sweeps under the results root, least recently touched first."""
    return [folder.root for folder in store_sweep.list_sweeps(results, collected=True)]


def resolve_sweep(sweep: str | Path | None = None, results: str | Path | None = None) -> Path:
    """The folder of a collected sweep: a path, a name under the results root, or (None) the most recent."""
    return store_sweep.resolve_sweep(sweep, results, collected=True).root


def read_table(folder: SweepFolder, name: str) -> pd.DataFrame | None:
    path = folder.table(name)
    if path is None:
        return None
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        # only empty cells and "nan" are missing: pandas' default list would turn a freeze mask or phase named
        # "None" or "NA" into NaN
        return pd.read_csv(path, keep_default_na=False, na_values=["", "nan", "NaN"])
    except Exception as exc:  # pyarrow's and pandas' errors for a file cut short or overwritten: no table
        raise SpecError(
            f"not a readable table ({type(exc).__name__}: {str(exc)[:200]}); `ablate collect "
            f"{folder.name}` writes the tables again from the run folders",
            file=str(path),
        ) from None


def load_sweep(sweep: str | Path | None = None, results: str | Path | None = None) -> Sweep:
    """The tables of a collected sweep (a folder, a name under the results root, or None: the most recent)."""
    folder = store_sweep.resolve_sweep(sweep, results, collected=True)
    tables = {name: read_table(folder, name) for name in TABLES}
    runs = tables.pop("runs")
    if "model_dir" in runs.columns:
        runs["model_dir"] = runs["model_dir"].astype(object).fillna("").astype(str)
    for col in ("schedule", "freeze"):
        if col not in runs.columns:
            raise SpecError(f"runs table has no {col!r} column", file=str(folder.root), key="runs")
        runs[col] = runs[col].astype(str)
    baseline = declared_baseline(folder.root)
    return Sweep(path=folder.root, runs=with_data_arms(runs, baseline), baseline=baseline, **tables)
