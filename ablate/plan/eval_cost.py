"""The dry run's evaluation cost per task: a grid's fine-tuning work (ablate.plan.cost.FinetuneWork, gathered by
ablate.launch.estimates) summed per task and settings over its runs, the rows a suite's tasks are listed in.

May import: plan (cost).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ablate.plan.cost import FinetuneWork, Throughput, _total, finetune_hours_cell, finetune_time  # one format


def finetune_task_rows(
    work: dict[str, list[FinetuneWork]], throughput: Throughput | None, groups: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """One row per (task, fine-tuning settings) over a grid's runs (`work`: run id -> its fine-tuning) and a
    total: how many runs fine-tune it, seeds per run, fine-tunings in all, training examples x epochs (a
    max_steps task: steps x batch) and dev / test examples of one fine-tuning, and when a throughput is known,
    the hours of one fine-tuning and of all, marked where estimated (ablate.plan.cost.finetune_hours_cell).
    `groups` (task -> e.g. "suite:fr_paper") fills the column `from`."""
    runs: dict[FinetuneWork, int] = {}  # the same work (frozen, hashable) -> how many runs do it
    for items in work.values():
        for w in items:
            runs[w] = runs.get(w, 0) + 1
    rows, hours, estimated = [], [], 0.0
    for w, n in runs.items():
        one = finetune_time([replace(w, seeds=1)], throughput)
        each = None if one is None else one.seconds / 3600
        each_estimated = 0.0 if one is None else one.estimated / 3600
        total = None if each is None else each * w.seeds * n
        total_estimated = each_estimated * w.seeds * n
        hours.append(total)
        estimated += total_estimated
        rows.append(
            {
                "task": w.key.task,
                "from": (groups or {}).get(w.key.task, "-"),
                "runs": n,
                "seeds": w.seeds,
                "fine-tunings": w.seeds * n,
                "train x epochs": w.describe_training(),
                "dev / test": f"{w.dev:,} / {w.test:,}",
                "h each": finetune_hours_cell(each, each_estimated),
                "h total": finetune_hours_cell(total, total_estimated),
            }
        )
    if rows:
        rows.append(
            {
                "task": "total",
                "from": "",
                "runs": "",
                "seeds": "",
                "fine-tunings": sum(r["fine-tunings"] for r in rows),
                "train x epochs": "",
                "dev / test": "",
                "h each": "",
                "h total": finetune_hours_cell(_total(hours), estimated),
            }
        )
    return rows
