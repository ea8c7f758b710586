"""The transplant table's arithmetic: per hybrid arm (a layer or component transplant, ablate.evaluate.transplant)
and task, its score, its two arms' scores and the share of the gap between them it recovers:

    recovery = (hybrid - into) / (from - into)        (in percent: 0 is the into arm, 100 the from arm)

with a percentile interval from resampling the pairing units the three share (fine-tuning seeds, or
(pretraining seed, fine-tuning seed): ablate.evaluate.units), as the paired bootstrap does
(ablate.evaluate.bootstrap.recovery_bootstrap). Undefined (nan, and the note says so) when the two arms
score the same. The average is over the hybrid's own tasks only, on units scored on all of them.

The arms' scores must come from the same evaluation as the hybrid's. A hybrid evaluated as its into run
(no eval overrides) is compared with the arms' own runs. One with its own scoring (a transplant entry's
`eval: {finetune: {probe: linear}}`) is compared with whole-model copies of each arm under that same
scoring: transplants of `layers: [encoder, head]` (the copy is the arm's model bit for bit) with the same
eval; without them the row says which entry to add.

May import: config, evaluate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ablate.config.errors import SpecError
from ablate.evaluate.bootstrap import recovery_bootstrap

AVERAGE = "average"
Arm = tuple[str, str]


def hybrid_arms(runs: pd.DataFrame, file: str | None = None) -> tuple[dict[str, dict], dict[tuple[Arm, str], str]]:
    """({hybrid schedule: from_arm, into_arm, eval, layers, components}, {(arm, eval): schedule of its
    whole-model copy}) from the done runs table; SpecError when the sweep has no transplant."""
    if "derived_from" not in runs.columns or not runs["derived_from"].fillna("").astype(str).ne("").any():
        raise SpecError(
            "the sweep has no transplants (derived runs) to tabulate",
            file=file,
            key="--table",
            value="transplant",
            allowed="a sweep whose grid has a transplants: block, or `ablate transplant` run on it",
        )
    arm_of = {r.run_id: (str(r.schedule), str(r.freeze)) for r in runs.itertuples()}
    hybrids: dict[str, dict] = {}
    copies: dict[tuple[Arm, str], str] = {}
    for r in runs[runs["derived_from"].fillna("").astype(str) != ""].itertuples():
        if r.derived_from not in arm_of or r.derived_into not in arm_of:
            continue  # a source run not done (or not collected): nothing to compare with
        scoring = str(getattr(r, "transplant_eval", "") or "")
        scoring = "" if scoring == "nan" else scoring
        if _truthy(getattr(r, "transplant_whole", False)):
            copies[(arm_of[r.derived_from], scoring)] = str(r.schedule)
            continue
        hybrids.setdefault(
            str(r.schedule),
            {
                "from_arm": arm_of[r.derived_from],
                "into_arm": arm_of[r.derived_into],
                "eval": scoring,
                "layers": str(getattr(r, "transplant_layers", "") or ""),
                "components": str(getattr(r, "transplant_components", "") or ""),
            },
        )
    return hybrids, copies


def recovery_table(
    u: pd.DataFrame, runs: pd.DataFrame, units: tuple[str, ...], seed: int = 0, file: str | None = None
) -> pd.DataFrame:
    """One row per (hybrid arm, task) and the hybrid's average. `u`: unit scores (schedule, freeze, task,
    score and the `units` columns), per-task rows only; `runs`: the done runs."""
    hybrids, copies = hybrid_arms(runs, file)
    by = list(units)
    rows = []
    for schedule, info in hybrids.items():
        mine = u[(u["schedule"] == schedule) & (u["freeze"] == "none")]
        tasks = list(dict.fromkeys(mine["task"]))
        if not tasks:
            continue
        refs = {side: _reference(info[side], info["eval"], copies) for side in ("from_arm", "into_arm")}
        scored = {side: None if ref is None else _per_task(u, ref[1], tasks, by) for side, ref in refs.items()}
        hybrid = _per_task(u, (schedule, "none"), tasks, by)
        for task in tasks + ([AVERAGE] if len(tasks) > 1 else []):
            rows.append(_row(schedule, info, refs, task, hybrid, scored, seed))
    if not rows:
        raise SpecError("no scores for the sweep's transplants", file=file, key="scores")
    return pd.DataFrame(rows)


def _reference(arm: Arm, scoring: str, copies: dict) -> tuple[str, Arm] | None:
    """Where an arm's scores under the hybrid's scoring come from: its whole-model copy, else (no overrides)
    its own runs; None when neither holds them."""
    if (arm, scoring) in copies:
        return "whole-model copy", (copies[(arm, scoring)], "none")
    return ("arm runs", arm) if scoring == "" else None


def _per_task(u: pd.DataFrame, arm: Arm, tasks: list[str], by: list[str]) -> pd.DataFrame:
    """Scores by unit (rows) and task (columns), plus the average over `tasks` on complete units."""
    mine = u[(u["schedule"] == arm[0]) & (u["freeze"] == arm[1]) & u["task"].isin(tasks)]
    wide = mine.groupby(by + ["task"])["score"].mean().unstack("task").reindex(columns=tasks)
    wide[AVERAGE] = wide[tasks].dropna().mean(axis=1)
    return wide


def _row(schedule: str, info: dict, refs: dict, task: str, hybrid: pd.DataFrame, scored: dict, seed: int) -> dict:
    h = hybrid[task].dropna()
    row = {
        "arm": schedule,
        "from_arm": _name(info["from_arm"]),
        "into_arm": _name(info["into_arm"]),
        "layers": info["layers"],
        "components": info["components"] or "-",
        "task": task,
        "mean": float(h.mean()),
        "std": float(h.std()) if len(h) > 1 else np.nan,
        "n": len(h),
        "from_mean": np.nan,
        "into_mean": np.nan,
        "recovery_pct": np.nan,
        "ci_low_pct": np.nan,
        "ci_high_pct": np.nan,
        "n_units": 0,
        "reference": "; ".join(f"{side[:-4]}: {ref[0]}" for side, ref in refs.items() if ref),
        "note": "",
    }
    missing = [info[side] for side, ref in refs.items() if ref is None]
    if missing:
        row["note"] = (
            f"no scores of {', '.join(map(_name, missing))} under the hybrid's evaluation "
            f"({info['eval']}): add a transplant of layers [encoder, head] from each into the other "
            "with the same eval"
        )
        return row
    s, i = (
        scored[side][task].dropna() if task in scored[side] else pd.Series(dtype=float)
        for side in ("from_arm", "into_arm")
    )
    row.update(from_mean=float(s.mean()) if len(s) else np.nan, into_mean=float(i.mean()) if len(i) else np.nan)
    shared = h.index.intersection(s.index).intersection(i.index)
    if shared.empty:
        row["note"] = "no pairing unit scored for the hybrid and both arms"
        return row
    r = recovery_bootstrap(h[shared].to_numpy(), i[shared].to_numpy(), s[shared].to_numpy(), seed=seed)
    row.update(
        recovery_pct=100 * r.recovery, ci_low_pct=100 * r.ci_low, ci_high_pct=100 * r.ci_high, n_units=r.n_units
    )
    if r.recovery != r.recovery:
        row["note"] = "undefined: the from and into arms score the same (no gap to recover)"
    elif r.n_units < 2:
        row["note"] = "one pairing unit: no interval"
    return row


def _name(arm: Arm) -> str:
    return arm[0] if arm[1] == "none" else "/".join(arm)


def _truthy(value) -> bool:
    return str(value).lower() in ("true", "1")
