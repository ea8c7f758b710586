"""How the figures group runs: done runs only, arms (schedule, freeze mask) in grid order with the MLM
baseline first, and panels (facets by a runs column).

May import: config, store.rundir.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ablate.config.errors import SpecError
from ablate.store.rundir import TABLE_COLUMNS

# Columns of the tables other than runs, as the run folder's schema names them: a runs column of the same name
# (e.g. an "lr" grid axis) cannot be a panel, since the join would clash with them.
MEASURE_COLUMNS = frozenset(
    column for table, columns in TABLE_COLUMNS.items() if table != "runs" for column in columns
)


def done_runs(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "done"] if "status" in runs.columns else runs


def arm_label(schedule: str, freeze: str) -> str:
    return schedule if freeze == "none" else f"{schedule}, freeze {freeze}"


def with_data_arms(runs: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """The runs with a grid's data choice (its `data` axis, the runs column `data`) in the schedule of each
    schedule that ran under several choices (`clm_detour, data medquad`), so that the figures and tables keep
    them apart as arms. The baseline schedule keeps its name: where it ran under several choices, facet by the
    choice (`--panel data`)."""
    if "data" not in runs.columns:
        return runs
    choice = runs["data"].astype(object).where(runs["data"].notna(), None)
    several = {s for s, g in choice.groupby(runs["schedule"]) if g.dropna().nunique() > 1} - {baseline}
    folded = [f"{s}, data {c}" if s in several and c is not None else s for s, c in zip(runs["schedule"], choice)]
    return runs.assign(schedule=folded)


def ordered(values: Sequence, first=None) -> list:
    """Distinct values in order of appearance, `first` moved to the front when present."""
    seen = list(dict.fromkeys(values))
    if first is not None and first in seen:
        seen.remove(first)
        seen.insert(0, first)
    return seen


def arm_sorted(
    df: pd.DataFrame, runs: pd.DataFrame, baseline: str, pcol: str | None, then: Sequence[str] = ()
) -> pd.DataFrame:
    """Rows ordered by panel, then arms as the grid lists them (baseline schedule and freeze "none" first)."""
    schedules = ordered([*runs["schedule"], *df["schedule"]], first=baseline)
    freezes = ordered([*runs["freeze"], *df["freeze"]], first="none")
    keyed = df.assign(_s=df["schedule"].map(schedules.index), _f=df["freeze"].map(freezes.index))
    by = [*([pcol] if pcol else []), "_s", "_f", *then]
    return keyed.sort_values(by, kind="stable").drop(columns=["_s", "_f"]).reset_index(drop=True)


def panel_column(runs: pd.DataFrame, panel: str | None) -> str | None:
    """The runs column to facet by: None for one panel; "auto": "model" when the sweep has several."""
    if panel in (None, "", "none"):
        return None
    if panel == "auto":
        return "model" if "model" in runs.columns and runs["model"].nunique() > 1 else None
    allowed = [c for c in runs.columns if c not in MEASURE_COLUMNS]
    if panel not in allowed:
        raise SpecError(
            "panel must be a column of the runs table that the other tables do not have",
            key="panel",
            value=panel,
            allowed="auto, none, " + ", ".join(map(str, allowed)),
        )
    return panel


def arm_keys(pcol: str | None) -> list[str]:
    """The columns that name an arm within a panel: [panel column,] schedule, freeze."""
    return ([pcol] if pcol else []) + ["schedule", "freeze"]


def panels(data: pd.DataFrame, pcol: str | None) -> list:
    return ordered(data[pcol]) if pcol else [None]


def in_panel(data: pd.DataFrame, pcol: str | None, value) -> pd.DataFrame:
    return data[data[pcol] == value] if pcol else data


def panel_title(pcol, value) -> str:
    return f"{pcol} = {value}" if pcol else ""


def arm_tokens_match(runs: pd.DataFrame) -> dict[tuple[str, str], bool | None]:
    """Per arm (schedule, freeze) of the done runs, whether they read the same tokens as their MLM twins (the
    runs table's twin_tokens, from `ablate collect`): False when any run's differ, True when every run's are
    the same, None when unchecked (an MLM baseline, no twin, or tables collected before the check)."""
    done = done_runs(runs)
    if "twin_tokens" not in done.columns:
        return {}
    out: dict[tuple[str, str], bool | None] = {}
    for arm, group in done.groupby(["schedule", "freeze"], sort=False):
        verdicts = group["twin_tokens"].fillna("").astype(str)
        out[arm] = (
            False if verdicts.str.startswith("differ").any() else True if (verdicts == "same").all() else None
        )
    return out
