"""Downstream tasks: declarative task files -> a validated TaskSpec -> (text, label) examples per split.

A task file is YAML in the registry folder (grids/tasks/<name>.yaml, or $ABLATE_TASKS_DIR). Adding a dataset
of a known type is adding a file. Data paths are relative to the data root (ablate.config.paths). Label sets are
read from the data: a label in dev/test that train lacks is an error unless the file allows it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import Field, PositiveFloat, PositiveInt, PrivateAttr
from pydantic import field_validator, model_validator

from ablate.config.base import Located, Strict, read_yaml, unique_items, validate
from ablate.config.errors import SpecError
from ablate.config.paths import registry_dir, registry_names
from ablate.evaluate.access import Access
from ablate.evaluate.protocol import profile_settings
from ablate.evaluate.task_readers import HUB_PREFIX, SPLITS, Example, read_splits
from ablate.evaluate.task_types import METRICS, TASK_TYPES, TYPE_SETTINGS, task_type

TASKS_DIR_ENV = "ABLATE_TASKS_DIR"  # default: grids/tasks of this checkout


class FinetuneSettings(Strict):
    """How to fine-tune; a task file's `finetune:` block sets defaults, a sweep may override any field."""

    method: Literal["full", "lora"] = Field("full", description="full fine-tuning, or LoRA adapters")
    lr: PositiveFloat = Field(5e-5, description="peak learning rate")
    batch_size: PositiveInt = Field(16, description="training examples per step")
    eval_batch_size: PositiveInt = Field(64, description="examples per evaluation batch")
    group_by_length: bool = Field(
        True,
        description="batches of about one length (a fraction of the padding, the "
        "same scores over seeds as shuffled batches); false: shuffled batches",
    )
    # the same step in exact arithmetic, not in float rounding, so scores move by seed-level noise: opt-in
    length_pieces: bool = Field(
        False, description="CPU: each batch run as length-sorted pieces padded to their own longest"
    )
    epochs: PositiveInt = Field(10, description="training epochs at most")
    patience: PositiveInt | None = Field(
        3, description="epochs without a dev improvement before stopping; null: never"
    )
    max_length: int | None = Field(
        None, ge=8, description="tokens per example; null: the task's max_length; capped at the model's context"
    )
    max_train_examples: PositiveInt | None = Field(
        None, description="N examples of train (tests, CPU budgets), by `subset`; null: all"
    )
    max_eval_examples: PositiveInt | None = Field(
        None, description="N examples of dev and of test, by `subset`; null: all"
    )
    subset: Literal["first", "spread"] = Field(
        "first",
        description="which N: the first ones, or N spread evenly "
        "over the split (a file sorted by label gives one class in its first N)",
    )
    warmup_ratio: float = Field(0.1, ge=0, le=1, description="share of the steps with a linear LR warm-up")
    weight_decay: float = Field(0.01, ge=0, description="AdamW's weight decay")
    grad_clip: PositiveFloat | None = Field(1.0, description="gradient norm clipped to this; null: none")
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="auto: bf16 autocast on CUDA, float32 elsewhere; weights stay float32"
    )
    pooling: Literal["cls", "mean", "model"] = Field(
        "cls",
        description="sequence tasks: the first token's state, the masked mean, or the head as transformers "
        "builds it from the checkpoint's config (ModernBERT: its classifier_pooling)",
    )
    multi_label_pos_weight: bool = Field(
        True, description="multi-label: BCE with pos_weight = negatives / positives per label"
    )
    data_seed: int | None = Field(
        None,
        description="the seed of the batch order and of dropout once the model is built (the head is "
        "initialised with the fine-tuning seed); null: the fine-tuning seed",
    )
    lora_r: PositiveInt = Field(8, description="LoRA: the adapters' rank")
    lora_alpha: PositiveFloat = Field(16, description="LoRA: the adapters' scale")
    lora_dropout: float = Field(0.1, ge=0, lt=1, description="LoRA: dropout on the adapters' input")
    lora_target_modules: tuple[str, ...] | None = Field(
        None, description="LoRA: the modules adapted; null: a default per architecture"
    )
    max_steps: PositiveInt | None = Field(
        None, description="span_ner: optimizer steps in all (passes over train repeat); null: `epochs` passes"
    )
    eval_every: PositiveInt | None = Field(
        None, description="span_ner: steps between dev evaluations; null: one per epoch"
    )
    head_lr: PositiveFloat | None = Field(
        None, description="span_ner: the learning rate of everything but the encoder; null: lr"
    )
    head_dropout: float = Field(
        0.4,
        ge=0,
        lt=1,
        description="span_ner: dropout after each BiLSTM and on the tagger's and biaffine's inputs",
    )
    crf_precision: Literal["float32", "emissions"] = Field(
        "float32",
        description="span_ner: the CRF's forward-backward in float32, or in the emissions' dtype (bf16 under "
        "autocast: tabib casts its transitions so)",
    )
    max_span_length: PositiveInt = Field(40, description="span_ner: the longest span scored, in sub-tokens")
    lstm_hidden_size: int = Field(
        400, ge=2, multiple_of=2, description="span_ner: the BiLSTM block's size (both directions: even)"
    )
    lstm_layers: PositiveInt = Field(3, description="span_ner: the BiLSTM block's layers")
    biaffine_hidden_size: PositiveInt = Field(64, description="span_ner: the biaffine scorer's size per label")
    span_selection: Literal["sampled", "decoded"] = Field(
        "sampled",
        description="span_ner: the dev score that keeps a checkpoint: sampled, tabib's (F1 of the argmax "
        "over the dev examples' training spans, no decoding: sampled_span_f1); decoded, the task's first metric",
    )
    probe: Literal["none", "linear", "mlp"] = Field(
        "none",
        description="sequence tasks: none, fine-tune the whole model; linear / mlp: the encoder frozen, "
        "only a linear head or the paper's 2-layer MLP on the pooled sequence trained",
    )
    probe_hidden: PositiveInt | None = Field(None, description="probe mlp: the hidden size; null: the encoder's")
    probe_dropout: float = Field(
        0.1, ge=0, lt=1, description="probe: the dropout before each of its linear layers"
    )

    @model_validator(mode="after")
    def _probe_alone(self) -> FinetuneSettings:
        if self.probe != "none" and self.method == "lora":
            raise Located(
                "a probe trains no encoder weights: it has no LoRA adapters",
                "probe",
                self.probe,
                "none with method lora, or method full",
            )
        if self.probe_hidden is not None and self.probe != "mlp":
            raise Located("probe_hidden sizes the MLP probe", "probe_hidden", self.probe_hidden, "with probe: mlp")
        return self


LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")


def capped(examples: list, n: int | None, subset: str = "first") -> list:
    """At most n of `examples` (None: all): the first n, or n spread evenly over them, in their order."""
    if n is None or n >= len(examples):
        return list(examples)
    if subset == "first":
        return list(examples[:n])
    return [examples[i * len(examples) // n] for i in range(n)]


def unread_settings(keys, method: str, type_name: str) -> dict[str, str]:
    """The fine-tuning settings among `keys` that a `type_name` task fine-tuned by `method` never reads: why.
    The type-specific ones are its entry's `reads` (ablate.evaluate.task_types)."""
    entry = task_type(type_name)
    why = {
        **{k: f"a {type_name} task never {does}" for k, does in TYPE_SETTINGS.items() if k not in entry.reads},
        **{k: "LoRA settings apply with method: lora only" if method != "lora" else None for k in LORA_FIELDS},
        "method": f"a {type_name} task is fine-tuned in full (no LoRA)"
        if method == "lora" and entry.lora_task is None
        else None,
    }
    return {k: why[k] for k in keys if why.get(k)}


class Splits(Strict):
    """File paths (relative to the data root); for format hf, the dataset's split names."""

    train: str = Field(description="the training split")
    dev: str = Field(description="the split that picks the best epoch (early stopping)")
    test: str = Field(description="the split the scores report")


class DataSpec(Strict):
    format: Literal["conll", "jsonl", "csv", "json", "hf", "brat"] = Field(
        description="how the split files are read; hf: a `datasets` dataset; brat: a folder of BRAT .txt/.ann "
        "files per split (span_ner)"
    )
    delimiter: str | None = Field(
        None, description='conll: column separator (null: any whitespace); csv: default ","'
    )
    dataset: str | None = Field(
        None, description="hf: hf:ORG/NAME on the hub, or a save_to_disk folder (relative: to the data root)"
    )
    config: str | None = Field(None, description="hf hub datasets: the configuration (load_dataset's name)")
    units: Literal["lines", "documents"] | None = Field(
        None, description="brat: one example per non-empty line (lines; null: lines) or per document (documents)"
    )
    splits: Splits = Field(description="the three splits")


class Columns(Strict):
    """conll: `text` and `label` are column indexes (negative counts from the end).
    jsonl/csv/json/hf: field names; a dotted name reaches into nested objects (answers.a); a list of names is
    joined with a space. hf token classification: a list-of-tokens field and a list-of-tags field."""

    text: int | str | list[str] = Field(description="the input text (token classification: the tokens)")
    text_pair: str | list[str] | None = Field(None, description="sequence pairs: the second text")
    label: int | str = Field(description="the label (token classification: the tags)")


class LabelOptions(Strict):
    values: list[str] | None = Field(
        None, description="the expected label set; any other label in the data is an error"
    )
    allow_unseen_eval_labels: bool = Field(False, description="allow dev/test labels that train lacks")
    keep_entity_types: list[str] | None = Field(None, min_length=1, description="NER: other types' tags become O")

    @field_validator("values", "keep_entity_types")
    @classmethod
    def _each_once(cls, values):  # a label listed twice would be two outputs of one class
        return values if values is None else unique_items(values, "label")


class MetricOptions(Strict):
    # single-label classification: micro_f1 / macro_f1 / weighted_f1 average over the other labels only
    # (BLURB's DDI: DDI-false; GAD's binary F1 of label 1: negative_label "0"); accuracy counts every label
    negative_label: str | None = Field(None, description="left out of micro_f1 / macro_f1 / weighted_f1")


class TaskSpec(Strict):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", description="the task's name in tables (the file's name)"
    )
    language: str = Field(min_length=2, description="the texts' language code (en, fr, ...)")
    type: str = Field(  # a registered entry's name, checked when the file is validated (_consistent)
        description="what is predicted: "
        + "; ".join(f"{name}: {entry.description}" for name, entry in TASK_TYPES.items())
    )
    source: str = Field(min_length=1, description="where the data comes from publicly")
    description: str | None = Field(None, description="one line for tables and the report")
    data: DataSpec = Field(description="where the splits are and how they are read")
    columns: Columns = Field(description="which columns or fields hold the text and the label")
    metrics: list[str] = Field(
        min_length=1,
        description="scores computed on dev and test, by the task's type: "
        + "; ".join(f"{t}: {', '.join(m)}" for t, m in METRICS.items())
        + "; the first drives early stopping",
    )
    metric_options: MetricOptions = Field(MetricOptions(), description="options of the metrics")
    labels: LabelOptions = Field(LabelOptions(), description="the label set and its checks")
    max_length: int = Field(128, ge=8, description="tokens per example (longer ones are cut)")
    finetune: FinetuneSettings = Field(
        FinetuneSettings(), description="how to fine-tune; a grid's eval.finetune overrides any key"
    )
    group_by: list[str] | None = Field(
        None,
        min_length=1,
        description="fields of the records (jsonl, csv, json, "
        "hf) whose values group the examples: the metrics are also computed per "
        "value of each field and, with two fields or more, per combination "
        "(ablate.evaluate.groups); null: overall only",
    )
    access: Access | None = Field(
        None, description="how the data is obtained when no catalogued dataset holds it (ablate.evaluate.access)"
    )
    _file: str | None = PrivateAttr(default=None)

    @field_validator("group_by")
    @classmethod
    def _fields_once(cls, fields):  # a field listed twice would be grouped on twice
        return fields if fields is None else unique_items(fields, "group_by field")

    @property
    def file(self) -> str | None:
        """The task file this spec was loaded from (None when built in code)."""
        return self._file

    @property
    def entry(self):
        """The task type's entry (ablate.evaluate.task_types.TaskType)."""
        return task_type(self.type)

    @property
    def primary_metric(self) -> str:
        return self.metrics[0]

    @model_validator(mode="after")
    def _consistent(self) -> TaskSpec:
        if self.type not in TASK_TYPES:
            raise Located("unknown task type", "type", self.type, ", ".join(TASK_TYPES))
        allowed = METRICS[self.type]
        for i, m in enumerate(self.metrics):
            if m not in allowed:
                raise Located(f"unknown metric for a {self.type} task", f"metrics.{i}", m, ", ".join(allowed))
        if len(set(self.metrics)) != len(self.metrics):
            raise Located("a metric is listed twice", "metrics", self.metrics)
        _check_data(self)
        _check_labels(self)
        if self.finetune.max_length is not None and "max_length" in self.model_fields_set:
            raise Located(
                "the task's max_length and finetune.max_length are both given: finetune's would win",
                "finetune.max_length",
                self.finetune.max_length,
                "one of the two",
            )
        if self.group_by is not None:
            if self.data.format in ("conll", "brat"):
                raise Located(
                    "group_by reads fields of records",
                    "group_by",
                    self.group_by,
                    "data formats jsonl, csv, json, hf",
                )
        unread = unread_settings(self.finetune.model_fields_set, self.finetune.method, self.type)
        if unread:
            key, why = next(iter(unread.items()))
            raise Located(f"never read: {why}", f"finetune.{key}", getattr(self.finetune, key))
        return self


def _check_data(t: TaskSpec) -> None:
    """data: and columns: agree with each other and with the task type."""
    fmt, c, d = t.data.format, t.columns, t.data
    formats = t.entry.formats
    if fmt not in formats:
        readers = [n for n, e in TASK_TYPES.items() if fmt in e.formats]
        raise Located(
            f"a {t.type} task reads {', '.join(formats)}"
            + (f"; {fmt} is for {', '.join(readers)}" if readers else ""),
            "data.format",
            fmt,
            ", ".join(formats),
        )
    if fmt == "conll":
        for key in ("text", "label"):
            if not isinstance(getattr(c, key), int):
                raise Located(
                    "a conll column is an index (0, 1, ... or -1 for the last)", f"columns.{key}", getattr(c, key)
                )
        if c.text_pair is not None:
            raise Located("conll tasks have no text_pair", "columns.text_pair", c.text_pair)
    else:
        for key in ("text", "label"):
            if isinstance(getattr(c, key), int):
                raise Located(f"a {fmt} column is a field name", f"columns.{key}", getattr(c, key))
    t.entry.check(t)
    if fmt == "csv" and d.delimiter is not None and len(d.delimiter) != 1:
        raise Located("a csv delimiter is one character", "data.delimiter", d.delimiter)
    if fmt in ("jsonl", "json", "hf") and d.delimiter is not None:
        raise Located(f"{fmt} data has no delimiter", "data.delimiter", d.delimiter)
    if fmt == "hf" and not d.dataset:
        raise Located(
            "format hf needs data.dataset",
            "data.dataset",
            None,
            f"{HUB_PREFIX}ORG/NAME, or a folder saved with save_to_disk",
        )
    if fmt != "brat" and d.units is not None:
        raise Located("units cut BRAT documents into examples", "data.units", d.units, "with data.format brat")
    if fmt != "hf" and (d.dataset is not None or d.config is not None):
        key = "data.dataset" if d.dataset is not None else "data.config"
        raise Located("dataset and config are for format hf", key, d.dataset or d.config)
    if fmt == "hf" and d.config is not None and not d.dataset.startswith(HUB_PREFIX):
        raise Located(
            "a config selects a hub dataset's configuration; a saved folder has none",
            "data.config",
            d.config,
            f"with data.dataset {HUB_PREFIX}ORG/NAME",
        )


def _check_labels(t: TaskSpec) -> None:
    """labels: and metric_options: agree with the task type."""
    values, keep, negative = t.labels.values, t.labels.keep_entity_types, t.metric_options.negative_label
    tag_types = [n for n, e in TASK_TYPES.items() if e.label_kind == "tags"]
    if keep is not None:
        if t.entry.label_kind != "tags":
            raise Located(
                "keep_entity_types selects NER entity types",
                "labels.keep_entity_types",
                keep,
                "only with type " + ", ".join(tag_types),
            )
        dropped = [v for v in values or () if v != "O" and v[2:] not in keep]
        if dropped:
            raise Located(
                "labels.values lists a tag of a type keep_entity_types drops",
                "labels.values",
                dropped[0],
                "O and the B-/I- tags of " + ", ".join(keep),
            )
    if negative is not None:
        if not t.entry.takes_negative:
            raise Located(
                "negative_label is for single-label classification", "metric_options.negative_label", negative
            )
        if values is not None and negative not in values:
            raise Located(
                "the negative label is not in labels.values",
                "metric_options.negative_label",
                negative,
                ", ".join(values),
            )


# ---------------------------------------------------------------------------------------------------- registry


def tasks_dir() -> Path:
    return registry_dir(TASKS_DIR_ENV, "tasks")


def list_tasks() -> list[str]:
    """Names of the task files in the registry folder."""
    return registry_names(tasks_dir())


def load_task(name_or_path: str | os.PathLike, key: str = "task") -> TaskSpec:
    """A registry name (ncbi_disease) or a path to a task file (anything ending in .yaml/.yml or with a /);
    an unknown name is a SpecError under `key` (the CLI's --task) listing the registry's tasks."""
    s = str(name_or_path)
    if s.endswith((".yaml", ".yml")) or os.sep in s or "/" in s:
        path = Path(s).expanduser()
        if not path.is_file():
            raise SpecError("task file not found", file=s)
    else:
        path = tasks_dir() / f"{s}.yaml"
        if not path.is_file():
            raise SpecError("unknown task", key=key, value=s, allowed=", ".join(list_tasks()) or "(no task files)")
    file = str(path)
    spec = validate(TaskSpec, read_yaml(path), file, "task file")
    if spec.name != path.stem:
        raise SpecError(
            "a task's name is its file name", file=file, key="name", value=spec.name, allowed=path.stem
        )
    spec._file = file
    return spec


def resolve_settings(
    task: TaskSpec, overrides: dict[str, Any] | None = None, protocol: str | None = None
) -> FinetuneSettings:
    """The task file's fine-tuning settings, then the protocol profile's (ablate.evaluate.protocol), then a
    sweep's or the command line's overrides, validated."""
    merged = {
        **task.finetune.model_dump(),
        **profile_settings(protocol, task.language, task.type, task.name),
        **(overrides or {}),
    }
    return validate(FinetuneSettings, merged, what="fine-tuning settings", prefix="finetune")


# ---------------------------------------------------------------------------------------------------- data


class TaskData(NamedTuple):
    splits: dict[str, list[Example]]  # train, dev, test
    labels: tuple[str, ...]  # model output order; () for regression


def load_task_data(task: TaskSpec, data_root: str | os.PathLike | None = None) -> TaskData:
    """Read and check every split (ablate.evaluate.task_readers). Raises SpecError for a missing file or
    dataset, an unknown column, an empty split, a malformed line, or a label set problem."""
    splits = read_splits(task, data_root)
    return TaskData(splits, _label_set(task, splits))


def _label_set(task: TaskSpec, splits: dict[str, list[Example]]) -> tuple[str, ...]:
    if not task.entry.has_label_set:
        return ()
    seen: dict[str, set[str]] = {}
    for split, examples in splits.items():
        s: set[str] = set()
        for ex in examples:
            s.update(task.entry.label_names(ex.label))
        seen[split] = s
    declared = task.labels.values
    if declared is not None:
        for split, s in seen.items():
            outside = sorted(s - set(declared))
            if outside:
                raise SpecError(
                    f"{split} has labels outside labels.values",
                    file=task.file,
                    key="labels.values",
                    value=outside[:10],
                    allowed=", ".join(declared),
                )
    train = seen["train"]
    unseen: set[str] = set()
    for split in SPLITS[1:]:
        extra = seen[split] - train
        if extra and not task.labels.allow_unseen_eval_labels:
            raise SpecError(
                f"labels in {split} that train lacks",
                file=task.file,
                key=f"data.splits.{split}",
                value=sorted(extra),
                allowed="set labels.allow_unseen_eval_labels: true to accept them",
            )
        unseen |= extra
    if declared is not None:
        return tuple(declared)
    return tuple(sorted(train)) + tuple(sorted(unseen))


def task_texts(name: str, split: str, data_root: str | os.PathLike | None = None) -> list[str]:
    """A layer probe's texts from a task (probe.texts task:NAME[:SPLIT]): its split's texts in file order
    (all: train, dev, then test); an example's (first) text, a token-classification example's words joined
    by spaces."""
    splits = read_splits(load_task(name, key="probe.texts"), data_root)
    parts = SPLITS if split == "all" else (split,)
    return [ex.text if isinstance(ex.text, str) else " ".join(ex.text) for part in parts for ex in splits[part]]
