"""The paper's numbers beside ours (`ablate report --table scores|freeze --reference paper`): which row of a
reference file (ablate.report.references) each arm of a sweep is, and the columns that set the paper's number
beside the measured one: paper_row, paper, measured, paper_delta (measured - paper), paper_tasks, paper_note,
paper_source; plus the compact blocks the Markdown / LaTeX / HTML outputs print (cells "paper / measured /
delta").

Units: the paper prints percentages; a score file holds fractions in [0, 1] and the score table's `mean` is
100 x the fraction (ablate.report.scores.primary_scores). `check_fractions` refuses scores that are not
fractions, which would compare a hundred times off.

Matching: a sweep arm by its schedule and its model's language (the model's name) and size (its depth), the
nearest token budget among rows that differ only in it (English Base: 10B and 50B); a base model evaluated
alone by its hub id; a freezing arm by schedule + freeze mask name, and by the layers each phase froze where
the sweep's frozen table has them. An arm no row fits is shown measured only, the paper blank.

Averages: the paper's is over its 8 (French) / 11 (English) tasks. Where the sweep has k < N of them, the
measured average is over those k, labelled "partial (k of N tasks)", and its delta is against the paper's
average over the same k tasks, computed from its per-task numbers. The freezing rows have no per-task numbers:
a partial freeze average is shown without a delta.

May import: config, report.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ablate.config.errors import SpecError
from ablate.report.arms import done_runs
from ablate.report.references import MainRow, MainTable, Reference
from ablate.report.scores import AVERAGE, is_average, language_average

BASE_MODEL = "base"  # the schedule of `ablate evaluate --base` rows (ablate.store.collect)
HUB_PREFIX = "hub:"
FAR_BUDGET = 2.0  # an arm whose tokens differ from its row's by more than this factor gets a note
COLUMNS = ("paper_row", "paper", "measured", "paper_delta", "paper_tasks", "paper_note", "paper_source")
FREEZE_COLUMNS = (
    "paper_row",
    "paper",
    "measured",
    "paper_delta",
    "paper_delta_vs_mlm",
    "paper_p_vs_mlm",
    "paper_tasks",
    "paper_note",
    "paper_source",
)
UNITS_NOTE = (
    "Cells: paper / measured / measured - paper, in percent (the paper's F1; ablate's scores are "
    "fractions, x 100); measured: each task's primary metric, the mean over seeds."
)
PARTIAL_NOTE = (
    "partial (k of N tasks): the measured average is over the k paper tasks the sweep has; its delta "
    "is against the paper's average over the same k tasks, computed from the paper's per-task numbers "
    "(printed to 0.1), not against its published average."
)
FREEZE_PARTIAL = "no delta: the paper has no per-task numbers for this arm, so no average over the same {k} tasks"


def is_base_model(schedule: str) -> bool:
    """Whether a table's schedule is a base model's (`base`, or `base (SOURCE)` with several base models)."""
    return schedule == BASE_MODEL or schedule.startswith(BASE_MODEL + " (")


def check_fractions(scores: pd.DataFrame, tasks) -> None:
    """The score files' values of `tasks` are fractions in [0, 1] (else percentages would be compared with the
    paper's as if they were fractions: a SpecError naming the task)."""
    values = scores[scores["task"].isin(list(tasks))]
    bad = values[
        (pd.to_numeric(values["value"], errors="coerce") > 1.0)
        | (pd.to_numeric(values["value"], errors="coerce") < 0.0)
    ]
    if not bad.empty:
        r = bad.iloc[0]
        raise SpecError(
            "a score set beside the paper's is no fraction in [0, 1] (the paper's percentages are "
            "compared with 100 x the score files' fractions)",
            key=f"scores: {r['task']}",
            value=f"{r['metric']} = {r['value']}",
            allowed="values in [0, 1]",
        )


def arm_models(runs: pd.DataFrame) -> dict[tuple[str, str], dict]:
    """(schedule, freeze) -> the model of its done runs: name (the spec's source), layers, tokens trained."""
    out = {}
    for arm, g in done_runs(runs).groupby(["schedule", "freeze"], sort=False):
        first = g.iloc[0]
        source = next(
            (first[c] for c in ("model_source", "model") if c in g and pd.notna(first[c]) and str(first[c])), ""
        )
        layers = pd.to_numeric(g.get("n_layers", pd.Series(dtype=float)), errors="coerce").dropna()
        tokens = pd.to_numeric(g.get("tokens_seen", pd.Series(dtype=float)), errors="coerce").dropna()
        out[arm] = {
            "model": str(source),
            "n_layers": int(layers.iloc[0]) if len(layers) else None,
            "tokens": float(tokens.median()) if len(tokens) else None,
        }
    return out


def model_language(ref: Reference, model: str) -> str | None:
    lowered = model.lower()
    return next((lang for key, lang in ref.model_languages.items() if key in lowered), None)


def model_size(ref: Reference, n_layers: int | None) -> str | None:
    return next((size for size, n in ref.sizes.items() if n == n_layers), None)


def _hub_id(model: str) -> str:
    return (model[len(HUB_PREFIX) :] if model.startswith(HUB_PREFIX) else model).lower()


def _tokens(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e8 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:.0f}"


def main_row_for(ref: Reference, schedule: str, model: dict | None) -> tuple[MainTable, MainRow, str] | None:
    """The main-table row an arm is (with a note when its token budget is far from the row's), or None."""
    if not model:
        return None
    if is_base_model(schedule):
        wanted = _hub_id(model["model"])
        return next(((t, r, "") for t in ref.main for r in t.rows if wanted in {h.lower() for h in r.hub}), None)
    table = ref.main_table(model_language(ref, model["model"]) or "")
    size = model_size(ref, model["n_layers"])
    rows = [r for r in table.rows if r.schedule == schedule and r.size == size] if table and size else []
    if len(rows) > 1 and model["tokens"]:
        rows = [min(rows, key=lambda r: abs(math.log(max(model["tokens"], 1.0) / r.tokens)))]
    if len(rows) != 1:
        return None
    row, note = rows[0], ""
    ratio = model["tokens"] / row.tokens if model["tokens"] and row.tokens else 1.0
    if max(ratio, 1 / ratio) > FAR_BUDGET:
        note = f"the arm trained {_tokens(model['tokens'])} tokens, the paper's row {_tokens(row.tokens)}"
    return table, row, note


def _blank(frame: pd.DataFrame, columns) -> pd.DataFrame:
    out = frame.copy()
    for c in columns:
        out[c] = "" if c in ("paper_row", "paper_tasks", "paper_note", "paper_source") else np.nan
    return out


def _tasks_label(k: int, n: int) -> str:
    return f"{n} of {n} tasks" if k == n else f"partial ({k} of {n} tasks)"


def beside_scores(table: pd.DataFrame, models: dict, ref: Reference) -> pd.DataFrame:
    """The score table (rows arm x task, `mean` in points) with the paper's columns (see the module's doc)."""
    out = _blank(table, COLUMNS)
    for (schedule, freeze), idx in out.groupby(["schedule", "freeze"], sort=False).groups.items():
        # the main tables' rows are unfrozen models: a freezing arm is the freeze table's (beside_freeze)
        found = main_row_for(ref, schedule, models.get((schedule, freeze))) if freeze == "none" else None
        if found is None:
            continue
        main, row, note = found
        paper = main.score(row)
        mine = out.loc[idx]
        on_task = mine.index[mine["task"].isin(list(paper))]
        out.loc[idx, ["paper_row", "paper_note", "paper_source"]] = [row.name, note, ref.source.cite(main.table)]
        out.loc[on_task, "paper"] = out.loc[on_task, "task"].map(paper)
        out.loc[on_task, "measured"] = out.loc[on_task, "mean"]
        measured = [t for t in main.tasks if t in set(mine["task"])]
        average = next((a for a in (language_average(main.language), AVERAGE) if a in set(mine["task"])), None)
        if average is None or not measured:
            continue
        at = mine.index[mine["task"] == average]
        k, n = len(measured), len(main.tasks)
        out.loc[at, "paper"] = row.average if k == n else float(np.mean([paper[t] for t in measured]))
        out.loc[at, "measured"] = float(mine.loc[mine["task"].isin(measured), "mean"].mean())
        out.loc[at, "paper_tasks"] = _tasks_label(k, n)
    out["paper_delta"] = out["measured"] - out["paper"]
    return out


def beside_freeze(
    frame: pd.DataFrame, scores: pd.DataFrame, models: dict, frozen: dict, ref: Reference
) -> pd.DataFrame:
    """The freeze table (a row per arm) with the paper's freezing rows beside it: the arm's model must be the
    paper's (French Base), its schedule and mask the row's, and what each phase froze (`frozen`, the freeze
    table's descriptions, when the sweep has them) the row's layers."""
    table = ref.freeze
    paper_tasks = ref.main_table(table.language).tasks
    out = _blank(frame, FREEZE_COLUMNS)
    for i, arm in out.iterrows():
        key = (arm["schedule"], arm["freeze"])
        model = models.get(key) or {"model": "", "n_layers": None}
        row = next((r for r in table.rows if (r.schedule, r.freeze) == key), None)
        if row is None:
            continue
        language, size = model_language(ref, model["model"]), model_size(ref, model["n_layers"])
        if (language, size) != (table.language, table.size):
            out.loc[i, "paper_note"] = (
                f"not the paper's model ({table.language} {table.size}, "
                f"{ref.sizes[table.size]} layers): {model['model'] or '?'}"
            )
            continue
        wanted = "; ".join(f"{phase}: {layers}" for phase, layers in row.frozen.items()) or "-"
        if key in frozen and frozen[key] != wanted:
            out.loc[i, "paper_note"] = f"froze {frozen[key]}, the paper's arm {wanted}"
            continue
        mine = scores[
            (scores["schedule"] == key[0]) & (scores["freeze"] == key[1]) & scores["task"].isin(list(paper_tasks))
        ]
        k, n = mine["task"].nunique(), table.n_tasks
        out.loc[i, ["paper_row", "paper_source", "paper_tasks"]] = [
            row.name,
            ref.source.cite(table.table),
            _tasks_label(k, n),
        ]
        out.loc[i, ["paper", "paper_delta_vs_mlm", "paper_p_vs_mlm"]] = [
            row.average,
            np.nan if row.delta_vs_mlm is None else row.delta_vs_mlm,
            np.nan if row.p_vs_mlm is None else row.p_vs_mlm,
        ]
        out.loc[i, "measured"] = float(mine["mean"].mean()) if k else np.nan
        if 0 < k < n:
            out.loc[i, "paper_note"] = FREEZE_PARTIAL.format(k=k)
    out["paper_delta"] = np.where(
        out["paper_tasks"].str.startswith("partial"), np.nan, out["measured"] - out["paper"]
    )
    return out


# ------------------------------------------------------------------ the compact blocks


def _triple(paper, measured, delta) -> str:
    def num(v, fmt):
        return "-" if v != v else format(round(v, 1) + 0.0, fmt)  # + 0.0: no "-0.0" from rounding noise

    return f"{num(paper, '.1f')} / {num(measured, '.1f')} / {num(delta, '+.1f')}"


def score_blocks(data: pd.DataFrame, ref: Reference) -> list[tuple[str, pd.DataFrame, list[str]]]:
    """(title, table of strings, notes) per main table of the paper whose tasks the sweep has: rows the arms
    with a score on any of them, columns those tasks and the average."""
    blocks = []
    for main in ref.main:
        tasks = [t for t in main.tasks if t in set(data["task"])]
        if not tasks:
            continue
        rows, partial = [], False
        for arm, mine in data.groupby("arm", sort=False):
            if not mine["task"].isin(tasks).any():
                continue
            by_task = mine.set_index("task")
            matched = bool(mine["paper_row"].iloc[0]) and mine["paper_source"].iloc[0].endswith(main.table)
            cells = {"arm": arm, "paper row": mine["paper_row"].iloc[0] if matched else "(not in the paper)"}
            for t in tasks:
                r = by_task.loc[t] if t in by_task.index else None
                cells[t] = (
                    ""
                    if r is None
                    else _triple(
                        r["paper"] if matched else np.nan, r["mean"], r["paper_delta"] if matched else np.nan
                    )
                )
            avg = mine[(mine["paper_tasks"] != "") & mine["task"].map(is_average)] if matched else mine.iloc[:0]
            if len(avg):
                a = avg.iloc[0]
                partial |= a["paper_tasks"].startswith("partial")
                cells["average"] = _triple(a["paper"], a["measured"], a["paper_delta"]) + (
                    f", {a['paper_tasks']}" if a["paper_tasks"].startswith("partial") else ""
                )
            else:
                k = int(mine["task"].isin(tasks).sum())
                cells["average"] = _triple(np.nan, mine.loc[mine["task"].isin(tasks), "mean"].mean(), np.nan) + (
                    f", {_tasks_label(k, len(main.tasks))}" if k < len(main.tasks) else ""
                )
            rows.append(cells)
        notes = (
            [UNITS_NOTE]
            + ([PARTIAL_NOTE] if partial else [])
            + sorted({f"{arm}: {n}" for arm, n in zip(data["arm"], data["paper_note"]) if n})
            + [f"Paper: {ref.source.cite(main.table)}: {main.caption}."]
        )
        blocks.append((f"Beside the paper: {main.caption}", pd.DataFrame(rows), notes))
    return blocks


def freeze_block(data: pd.DataFrame, ref: Reference) -> tuple[str, pd.DataFrame, list[str]]:
    """The freeze table's arms beside the paper's freezing rows: average paper / measured / delta, the
    paper's difference from MLM and the measured one, and why a row has no delta."""
    rows = []
    for _, r in data.iterrows():
        rows.append(
            {
                "arm": r["arm"],
                "paper row": r["paper_row"] or "(not in the paper)",
                "average": _triple(r["paper"], r["measured"], r["paper_delta"]),
                "tasks": r["paper_tasks"],
                "delta vs MLM (paper / measured)": _triple(
                    r["paper_delta_vs_mlm"], r["delta_vs_baseline"], np.nan
                ).rsplit(" / ", 1)[0],
                "p vs MLM (paper)": ""
                if r["paper_p_vs_mlm"] != r["paper_p_vs_mlm"]
                else f"{r['paper_p_vs_mlm']:.2f}",
                "note": r["paper_note"],
            }
        )
    notes = [
        UNITS_NOTE.replace(
            "each task's primary metric, the mean over seeds",
            "the mean of the arm's per-task means over the paper's tasks it has",
        ),
        f"Paper: {ref.source.cite(ref.freeze.table)}: {ref.freeze.caption}.",
    ]
    return f"Beside the paper: {ref.freeze.caption}", pd.DataFrame(rows), notes
