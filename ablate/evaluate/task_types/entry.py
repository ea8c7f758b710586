"""What a task type declares (TaskType), and the check an entry passes to join the registry
(ablate.evaluate.task_types).

A task type is one entry: how its model is built, its loss, how outputs become predictions, its metrics and
the one the paper selects by, how a record's label is read and batched, which type-specific fine-tuning
settings it reads, which data formats it reads, and its protocol kind (the rows of ablate.evaluate.protocol).
The fine-tuning loop, the task files' checks, the readers, the protocol and the metrics' table ask the entry;
nothing compares a type's name.

May import: nothing of ablate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# Fine-tuning settings that only some types read; a task of another type that sets one is refused with `why`.
TYPE_SETTINGS: dict[str, str] = {
    "pooling": "pools a sequence into one vector",
    "multi_label_pos_weight": "has a multi-label loss to weigh",
    "max_steps": "trains for a number of steps",
    "eval_every": "evaluates every N steps",
    "head_lr": "has a head with its own learning rate",
    "head_dropout": "has a span head with its own dropout",
    "crf_precision": "has a CRF",
    "max_span_length": "scores spans",
    "lstm_hidden_size": "has a BiLSTM",
    "lstm_layers": "has a BiLSTM",
    "biaffine_hidden_size": "has a biaffine span scorer",
    "span_selection": "keeps a checkpoint by a span score",
    "probe": "is probed (a frozen encoder under a head on the pooled sequence)",
    "probe_hidden": "is probed with an MLP",
    "probe_dropout": "is probed",
}


@dataclass(frozen=True)
class TaskType:
    """One task type. The callables' arguments:
    head(model_dir, labels, settings) -> torch module whose forward(**batch) returns an object with `loss`
        (when the batch holds labels) and whatever `decode` reads;
    encode(tokenizer, examples, labels, max_length) -> list of batching.Encoded;
    collate(items) -> the batch's label tensors {name: tensor} (the inputs are batching.collate's);
    loss(settings, train_items, n_labels, device) -> None (the model's own loss) or fn(logits, labels);
    decode(outputs, rows, items, labels, examples) -> one prediction per row, in the form `metrics` take;
    gold(example) -> the example's label in that form; label_names(label) -> the label strings it holds;
    check(task) -> raises ablate.config.base.Located for data:/columns:/labels: this type cannot use;
    selection(settings) -> the metric of `metrics` that keeps a checkpoint on dev, or None: the task's first."""

    name: str
    description: str
    protocol_kind: Literal["ner", "classification", "span_ner"]
    metrics: Mapping[str, Callable]  # name -> fn(gold, pred[, negative_label])
    selects_by: str  # the paper's selection metric: a task file's usual first one
    formats: tuple[str, ...]  # data formats it reads
    label_kind: Literal["tags", "one", "set", "number", "spans"]  # how a record's label is read
    head: Callable[..., Any]
    encode: Callable[..., list]
    collate: Callable[[list], dict]
    decode: Callable[..., list]
    loss: Callable[..., Any] = lambda settings, train, n_labels, device: None
    gold: Callable[[Any], Any] = lambda example: example.label
    label_names: Callable[[Any], tuple[str, ...]] = lambda label: (label,)
    check: Callable[[Any], None] = lambda task: None
    reads: frozenset[str] = frozenset()  # of TYPE_SETTINGS, the ones it reads
    lora_task: str | None = None  # peft's TaskType name; None: fine-tuned in full only
    loss_terms: Callable[[Any], int] = lambda item: 1  # loss terms of one example (batch pieces' shares)
    has_label_set: bool = True
    takes_negative: frozenset[str] = field(default_factory=frozenset)  # metrics that take negative_label
    targets: tuple[str, ...] = ("labels",)  # the batch's keys that only training reads
    hub_pipeline: str = "other"  # the Hugging Face pipeline tag an exported model's card gives it
    host_reads: str | None = None  # why the GPU memory plan cannot trace its step on the meta device (a
    # forward that reads values back to the host); None: traced
    selection: Callable[[Any], str | None] = lambda settings: None
    revision: str = ""  # changed when the type computes otherwise: a score of another revision is recomputed


def check_entry(entry: TaskType, _registry=None) -> TaskType:
    """A complete entry, else a ValueError saying what is wrong (TASK_TYPES checks each entry with it)."""
    if entry.selects_by not in entry.metrics:
        raise ValueError(f"task type {entry.name!r} selects by {entry.selects_by!r}, which it does not compute")
    unknown = entry.reads - set(TYPE_SETTINGS)
    if unknown:
        raise ValueError(f"task type {entry.name!r} reads settings TYPE_SETTINGS lacks: {sorted(unknown)}")
    return entry
