"""What the statistics may treat as replicates: the pairing units of a sweep's runs, and the check that every
arm compared has scores for every task asked about.

A pairing unit is one (pretraining seed, fine-tuning seed) pair when the pretraining seeds are independent
replicates, else one fine-tuning seed (the scores of runs that differ only in their pretraining seed are
averaged into it). Whether a run's seed is independent is records/run.json's `seed_independent`
(ablate.plan.replicates); a run without it (finished by an older version) counts as not independent, since
near-copies counted as independent make intervals too narrow.

May import: config. Pure pandas otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ablate.config.errors import SpecError

WITH_PRETRAINING_SEED = ["seed", "finetune_seed"]
FINETUNE_SEED_ONLY = ["finetune_seed"]


def _truthy(column: pd.Series) -> pd.Series:
    """bool from parquet, "True"/"False" from csv; missing is False."""
    return column.map(lambda v: str(v).strip().lower() in ("true", "1", "1.0"))


def pairing_units(runs: pd.DataFrame) -> list[str]:
    """The scores-table columns that identify a pairing unit for these runs (the runs table, or the part of
    it an analysis compares): ["seed", "finetune_seed"] when there are several pretraining seeds and each
    done run's seed is an independent replicate, else ["finetune_seed"]. Rows without a pretraining seed
    (the base-model reference) do not count."""
    if "seed" not in runs.columns:
        return list(FINETUNE_SEED_ONLY)
    pretrained = runs[runs["seed"].notna()]
    if "status" in pretrained.columns:
        pretrained = pretrained[pretrained["status"] == "done"]
    if pretrained["seed"].nunique() < 2 or "seed_independent" not in pretrained.columns:
        return list(FINETUNE_SEED_ONLY)
    if not _truthy(pretrained["seed_independent"]).all():
        return list(FINETUNE_SEED_ONLY)
    return list(WITH_PRETRAINING_SEED)


def require_task_scores(
    scores: pd.DataFrame,
    runs: pd.DataFrame,
    tasks: Sequence[str],
    arm_columns: Sequence[str] = ("schedule", "freeze"),
) -> None:
    """A SpecError (exit 2) naming the first task asked for that an arm has no score for, and the tasks
    every arm has; `runs` holds the arms compared (one row per run, with the arm columns)."""
    missing_cols = [c for c in arm_columns if c not in runs.columns]
    if missing_cols:
        raise SpecError(
            "the runs table has no such arm column",
            key="arms",
            value=missing_cols,
            allowed=", ".join(map(str, runs.columns)),
        )
    scored = scores.merge(runs[["run_id", *arm_columns]], on="run_id")
    arms = runs[list(arm_columns)].drop_duplicates().itertuples(index=False, name=None)
    have = {arm: set(scored.loc[(scored[list(arm_columns)] == list(arm)).all(axis=1), "task"]) for arm in arms}
    everywhere = set.intersection(*have.values()) if have else set()
    for task in tasks:
        for arm, tasks_of_arm in have.items():
            if task not in tasks_of_arm:
                label = ", ".join(f"{c}={v}" for c, v in zip(arm_columns, arm))
                raise SpecError(
                    f"no scores for task {task!r} in arm {label}",
                    key="task",
                    value=task,
                    allowed=", ".join(sorted(everywhere)) or "(no task is scored in every arm)",
                )
