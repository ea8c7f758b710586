"""Metrics per group of examples: a task file's `group_by: [length, position]` names fields of its records
(ablate.evaluate.task_readers.read_groups reads their values per example), and every metric of the task is computed
again over the examples of each value of each field, and, with two fields or more, of each combination of
values (the needle's (length, position) cells). Pure: the predictions in, rows out.

A row: {split, metric, group_by, group, value, n_examples}; group_by names the fields ("length",
"length,position"), group their values in the same order ("512", "512,start"). Groups are in order of first
appearance in the split.

May import: evaluate (task_types).
"""

from __future__ import annotations

from ablate.evaluate.task_types import compute

SEPARATOR = ","


def _partitions(fields: tuple[str, ...]) -> list[tuple[int, ...]]:
    """Which fields each grouping reads: each field alone, then all of them together (when more than one)."""
    alone = [(i,) for i in range(len(fields))]
    return alone + ([tuple(range(len(fields)))] if len(fields) > 1 else [])


def group_rows(task, split: str, groups: list[tuple[str, ...]], gold: list, preds: list) -> list[dict]:
    """Each of the task's metrics on `split` per group of its `group_by` fields ([] without group_by);
    groups[i]: example i's values of those fields."""
    fields = tuple(task.group_by or ())
    rows: list[dict] = []
    for idx in _partitions(fields):
        members: dict[tuple[str, ...], list[int]] = {}
        for i, values in enumerate(groups):
            members.setdefault(tuple(values[j] for j in idx), []).append(i)
        for values, rows_of in members.items():
            scores = compute(
                task.type,
                task.metrics,
                [gold[i] for i in rows_of],
                [preds[i] for i in rows_of],
                task.metric_options.negative_label,
            )
            rows += [
                {
                    "split": split,
                    "metric": metric,
                    "group_by": SEPARATOR.join(fields[j] for j in idx),
                    "group": SEPARATOR.join(values),
                    "value": value,
                    "n_examples": len(rows_of),
                }
                for metric, value in scores.items()
            ]
    return rows
