"""Task types as entries (ablate.evaluate.task_types.entry.TaskType), one module per family of types:
classification (single-label, pair, multi-label, regression), token_ner (IOB2 tags, linear head) and span_ner
(the paper's span model), each registered in TASK_TYPES (an ablate.config.registry.Registry, checked as it is
registered). A task file's `type:` names an entry, looked up when the file is validated, so an entry registered
after ablate.evaluate.tasks was imported is served as the shipped ones are; a new type is a new entry
(docs/extending.md, "A task type").

`METRICS[type][name]` is the table a task file's `metrics:` list is checked against, and `compute` computes
them; every metric is "higher is better", so the first one of a task can pick its kept model.

May import: config.registry, evaluate (task_types.*).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from ablate.config.registry import Registry
from ablate.evaluate.task_types import classification, span_ner, token_ner
from ablate.evaluate.task_types.entry import TYPE_SETTINGS, TaskType, check_entry

__all__ = ["TASK_TYPES", "METRICS", "TYPE_SETTINGS", "TaskType", "task_type", "compute", "register"]

# the shipped entries, each module's ENTRIES; `register` adds one defined elsewhere (checked: its name once,
# its selection metric computed, its settings known)
TASK_TYPES: Registry[TaskType] = Registry("task type", TaskType, check_entry)
register = TASK_TYPES.register
for _entry in (*classification.ENTRIES, *span_ner.ENTRIES, *token_ner.ENTRIES):
    register(_entry)


class _Metrics(Mapping):
    """type -> metric name -> function, read from the entries as they are now: what a task file's `metrics:`
    is checked against."""

    def __getitem__(self, name: str) -> Mapping:
        return TASK_TYPES[name].metrics

    def __iter__(self) -> Iterator[str]:
        return iter(TASK_TYPES)

    def __len__(self) -> int:
        return len(TASK_TYPES)


METRICS: Mapping[str, Mapping] = _Metrics()


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
