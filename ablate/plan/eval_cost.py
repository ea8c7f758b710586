"""The dry run's evaluation cost per task: a grid's fine-tuning work (ablate.plan.cost.FinetuneWork, gathered by
ablate.launch.estimates) summed per task and settings over its runs, the rows a suite's tasks are listed in.

May import: plan (cost).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ablate.plan.cost import FinetuneWork, Throughput, _hours, _total, finetune_seconds  # one hours format


def finetune_task_rows(
    work: dict[str, list[FinetuneWork]], throughput: Throughput | None, groups: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """One row per (task, fine-tuning settings) over a grid's runs (`work`: run id -> its fine-tuning) and a
    total: how many runs fine-tune it, seeds per run, fine-tunings in all, training examples x epochs and
    dev / test examples of one fine-tuning, and when a fine-tuning throughput was measured, the hours of one
    fine-tuning and of all. `groups` (task -> e.g. "suite:fr_paper") fills the column `from`."""
    runs: dict[FinetuneWork, int] = {}  # the same work (frozen, hashable) -> how many runs do it
    for items in work.values():
        for w in items:
            runs[w] = runs.get(w, 0) + 1
    rows, hours = [], []
    for w, n in runs.items():
        one = finetune_seconds([replace(w, seeds=1)], throughput)
        total = None if one is None else one * w.seeds * n / 3600
        hours.append(total)
        rows.append(
            {
                "task": w.key.task,
                "from": (groups or {}).get(w.key.task, "-"),
                "runs": n,
                "seeds": w.seeds,
                "fine-tunings": w.seeds * n,
                "train x epochs": f"{w.train:,} x {w.epochs}",
                "dev / test": f"{w.dev:,} / {w.test:,}",
                "h each": "not estimated" if one is None else _hours(one / 3600),
                "h total": "not estimated" if total is None else _hours(total),
            }
        )
    if rows:
        total = _total(hours)
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
                "h total": "not estimated" if total is None else _hours(total),
            }
        )
    return rows
