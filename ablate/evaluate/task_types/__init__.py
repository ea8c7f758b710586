"""Task types as entries (ablate.evaluate.task_types.entry.TaskType), one module per family of types:
classification (single-label, pair, multi-label, regression), token_ner (IOB2 tags, linear head) and span_ner
(the paper's span model). A task file's `type:` names an entry; a new type is a new entry (grids/tasks/README.md,
"A new task type").

`METRICS[type][name]` is the table a task file's `metrics:` list is checked against, and `compute` computes
them; every metric is "higher is better", so the first one of a task can pick its kept model.

May import: evaluate (task_types.*).
"""

from __future__ import annotations

from collections.abc import Sequence

from ablate.evaluate.task_types import classification, span_ner, token_ner
from ablate.evaluate.task_types.entry import TYPE_SETTINGS, TaskType, check_entry

__all__ = ["TASK_TYPES", "TYPE_NAMES", "METRICS", "TYPE_SETTINGS", "TaskType", "task_type", "compute", "register"]

# the registered entries, listed here (each module's ENTRIES); `register` adds one defined elsewhere
TASK_TYPES: dict[str, TaskType] = {}
METRICS: dict[str, dict] = {}  # type -> metric name -> function: what a task file's `metrics:` is checked against
TYPE_NAMES: tuple[str, ...] = ()


def register(entry: TaskType) -> TaskType:
    """Add a task type entry (checked: its name once, its selection metric computed, its settings known).
    Register before ablate.evaluate.tasks is imported: a task file's `type:` is checked against the names."""
    global TYPE_NAMES
    TASK_TYPES[entry.name] = check_entry(entry, TASK_TYPES)
    METRICS[entry.name] = dict(entry.metrics)
    TYPE_NAMES = tuple(TASK_TYPES)
    return entry


for _entry in (*classification.ENTRIES, *span_ner.ENTRIES, *token_ner.ENTRIES):
    register(_entry)


def task_type(name: str) -> TaskType:
    """The entry of a type name (a KeyError for a name no entry has: task files are checked before)."""
    return TASK_TYPES[name]


def compute(
    type_name: str, names: Sequence[str], gold, pred, negative_label: str | None = None
) -> dict[str, float]:
    """All the named metrics of one task type, in order; `negative_label` (single-label classification) is
    left out of the F1 averages."""
    entry = TASK_TYPES[type_name]
    return {
        name: entry.metrics[name](gold, pred, negative_label=negative_label)
        if negative_label is not None and name in entry.takes_negative
        else entry.metrics[name](gold, pred)
        for name in names
    }
