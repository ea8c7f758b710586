"""The dry run's evaluation cost per task: a grid's fine-tuning work (ablate.plan.cost.FinetuneWork, gathered by
ablate.launch.estimates) summed per task and settings over its runs, the rows a suite's tasks are listed in.

May import: plan (cost).
"""

from __future__ import annotations

from typing import Any

from ablate.plan.cost import FinetuneWork, Throughput, _hours, _total, finetune_seconds   # one hours format


def finetune_task_rows(work: dict[str, list[FinetuneWork]], throughput: Throughput | None,
                       groups: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per (task, fine-tuning settings) over a grid's runs (`work`: run id -> its fine-tuning) and a
    total: how many runs fine-tune it, seeds per run, fine-tunings in all, training examples x epochs and
    dev / test examples of one fine-tuning, and when a fine-tuning throughput was measured, the hours of one
    fine-tuning and of all. `groups` (task -> e.g. "suite:fr_paper") fills the column `from`."""
    by_key: dict[tuple, list[FinetuneWork]] = {}
    for items in work.values():
        for w in items:
            by_key.setdefault((w.key, w.seeds, w.epochs, w.train, w.dev, w.test), []).append(w)
    rows, hours = [], []
    for (key, seeds, epochs, train, dev, test), ws in by_key.items():
        one = finetune_seconds([FinetuneWork(key, 1, epochs, train, dev, test)], throughput)
        total = None if one is None else one * seeds * len(ws) / 3600
        hours.append(total)
        rows.append({"task": key.task, "from": (groups or {}).get(key.task, "-"), "runs": len(ws),
                     "seeds": seeds, "fine-tunings": seeds * len(ws), "train x epochs": f"{train:,} x {epochs}",
                     "dev / test": f"{dev:,} / {test:,}",
                     "h each": "not estimated" if one is None else _hours(one / 3600),
                     "h total": "not estimated" if total is None else _hours(total)})
    if rows:
        total = _total(hours)
        rows.append({"task": "total", "from": "", "runs": "", "seeds": "",
                     "fine-tunings": sum(r["fine-tunings"] for r in rows), "train x epochs": "", "dev / test": "",
                     "h each": "", "h total": "not estimated" if total is None else _hours(total)})
    return rows
