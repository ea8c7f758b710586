"""The `needle` figure: accuracy on the needle in a haystack by context length (a line per arm) and by the
needle's position in the document (bars per arm), from the score_groups table (a task's `group_by: [length,
position]`, ablate.evaluate.groups). Means over runs and fine-tuning seeds with 95% t-intervals; a dashed
line at chance (50%: the pairs are balanced).

May import: config, report.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ablate.config.errors import SpecError
from ablate.report.arms import arm_label, done_runs, ordered
from ablate.report.stats import mean_ci
from ablate.report.style import arm_styles, figure_legend, new_figure, styled
from ablate.report.sweep import Sweep

POSITIONS = ("start", "middle", "end")
COLUMNS = [
    "arm",
    "schedule",
    "freeze",
    "task",
    "split",
    "metric",
    "group_by",
    "group",
    "mean",
    "ci_low",
    "ci_high",
    "n",
]


def _task(groups: pd.DataFrame, task: str | None, path) -> str:
    """The needle task drawn: the one named, or the only task with both a length and a position grouping."""
    both = [t for t, g in groups.groupby("task", sort=False) if {"length", "position"} <= set(g["group_by"])]
    if task is None:
        if len(both) != 1:
            raise SpecError(
                "name the needle task to draw"
                if both
                else "no task of this sweep has scores by "
                "length and by position (a task file's group_by: [length, position])",
                file=str(path),
                key="--set task",
                allowed=", ".join(both) or None,
            )
        return both[0]
    if task not in both:
        raise SpecError(
            "this task has no scores by length and by position in this sweep",
            file=str(path),
            key="--set task",
            value=task,
            allowed=", ".join(both) or "(none)",
        )
    return task


def _group_order(group_by: str, values) -> list:
    if group_by == "length":
        return sorted(set(values), key=lambda v: float(v))
    return sorted(set(values), key=lambda v: (POSITIONS.index(v) if v in POSITIONS else len(POSITIONS), v))


def needle_data(
    sweep: Sweep, *, task: str | None = None, split: str = "test", metric: str = "accuracy"
) -> pd.DataFrame:
    """Per arm, grouping (length, position) and group: the mean of `metric` (in %) over runs and seeds, with a
    95% CI and the number of scores behind it."""
    groups = sweep.require("score_groups", "needle")
    groups = groups[
        (groups["split"] == split) & (groups["metric"] == metric) & groups["group_by"].isin(["length", "position"])
    ]
    task = _task(groups, task, sweep.path)
    runs = done_runs(sweep.runs)[["run_id", "schedule", "freeze"]]
    d = groups[groups["task"] == task].merge(runs, on="run_id")
    d = d.assign(group=d["group"].astype(str))
    rows = []
    for (s, f), arm in d.groupby(["schedule", "freeze"], sort=False):
        for group_by in ("length", "position"):
            part = arm[arm["group_by"] == group_by]
            for value in _group_order(group_by, part["group"]):
                m, lo, hi, n = mean_ci(100.0 * part.loc[part["group"] == value, "value"].astype(float))
                rows.append((arm_label(s, f), s, f, task, split, metric, group_by, value, m, lo, hi, n))
    out = pd.DataFrame(rows, columns=COLUMNS)
    order = ordered([sweep.baseline, *out["schedule"]])
    return (
        out.assign(_o=out["schedule"].map(order.index))
        .sort_values(["_o", "freeze", "group_by"], kind="stable")
        .drop(columns="_o")
        .reset_index(drop=True)
    )


def _half_widths(part: pd.DataFrame) -> np.ndarray:
    lo, hi, m = (part[c].to_numpy(dtype=float) for c in ("ci_low", "ci_high", "mean"))
    return np.nan_to_num(np.vstack([m - lo, hi - m]))


def plot_needle(data: pd.DataFrame, baseline: str):
    colors, styles = arm_styles(data, baseline)
    arms = ordered(data["arm"])
    fig = new_figure(8.5, 3.2)
    by_length, by_position = fig.subplots(1, 2)
    lengths = _group_order("length", data.loc[data["group_by"] == "length", "group"])
    positions = _group_order("position", data.loc[data["group_by"] == "position", "group"])
    width = 0.8 / max(len(arms), 1)
    for k, arm in enumerate(arms):
        d = data[data["arm"] == arm]
        color, (line, marker) = colors[d["schedule"].iloc[0]], styles[d["freeze"].iloc[0]]
        lg = d[d["group_by"] == "length"].set_index("group").reindex(lengths).reset_index()
        by_length.errorbar(
            range(len(lengths)),
            lg["mean"],
            yerr=_half_widths(lg),
            color=color,
            linestyle=line,
            marker=marker,
            capsize=3,
            label=arm,
        )
        pg = d[d["group_by"] == "position"].set_index("group").reindex(positions).reset_index()
        by_position.bar(
            np.arange(len(positions)) - 0.4 + width * (k + 0.5),
            pg["mean"],
            width,
            yerr=_half_widths(pg),
            color=color,
            capsize=3,
            label=arm,
        )
    for ax, ticks, xlabel in (
        (by_length, lengths, "context length (tokens)"),
        (by_position, positions, "needle position"),
    ):
        ax.axhline(50.0, color="0.5", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(ticks)), ticks)
        ax.set_xlabel(xlabel)
        ax.set_ylim(0, 100)
    metric, split = data["metric"].iloc[0], data["split"].iloc[0]
    by_length.set_ylabel(f"{metric} (%, {split})")
    fig.suptitle(f"{data['task'].iloc[0]}: by length and by position (dashed: chance)")
    figure_legend(fig, [by_length])
    return fig


@styled
def needle_figure(sweep: Sweep, *, task: str | None = None, split: str = "test", metric: str = "accuracy"):
    """Needle-in-a-haystack accuracy by length (lines per arm) and by position (bars per arm)."""
    data = needle_data(sweep, task=task, split=split, metric=metric)
    if data.empty:
        raise SpecError("no done run has needle scores", file=str(sweep.path), key="score_groups")
    return plot_needle(data, sweep.baseline), data
