"""Downstream tasks: declarative task files -> a validated TaskSpec -> (text, label) examples per split.

A task file is YAML in the registry folder (grids/tasks/<name>.yaml, or $ABLATE_TASKS_DIR). Adding a dataset
of a known type is adding a file. Data paths are relative to the data root (ablate.config.paths). Label sets are
read from the data: a label in dev/test that train lacks is an error unless the file allows it.
"""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import Field, PositiveFloat, PositiveInt, PrivateAttr
from pydantic import model_validator

from ablate.config.base import Located, Strict, read_yaml, validate
from ablate.config.errors import SpecError
from ablate.evaluate.metrics import METRICS
from ablate.evaluate.protocol import profile_settings
from ablate.config.paths import resolve_data_path

TASKS_DIR_ENV = "ABLATE_TASKS_DIR"   # default: grids/tasks of this checkout
SPLITS = ("train", "dev", "test")
TaskType = Literal["token_classification", "sequence_classification", "sequence_pair_classification",
                   "multi_label_classification", "regression"]
_IOB2_TAG = re.compile(r"^(O|[BI]-\S.*)$")


class FinetuneSettings(Strict):
    """How to fine-tune; a task file's `finetune:` block sets defaults, a sweep may override any field."""

    method: Literal["full", "lora"] = "full"
    lr: PositiveFloat = 5e-5
    batch_size: PositiveInt = 16
    eval_batch_size: PositiveInt = 64
    group_by_length: bool = False             # batches of about one length: less padding, less mixing
    # CPU: run each batch as length-sorted pieces padded to their own longest (evaluate.batching.length_pieces).
    # The same step in exact arithmetic, not in float rounding, so scores move by seed-level noise: opt-in.
    length_pieces: bool = False
    epochs: PositiveInt = 10
    patience: PositiveInt | None = 3          # epochs without dev improvement before stopping; null: never
    max_length: int | None = Field(None, ge=8)  # null: the task's max_length; capped at the model's context
    max_train_examples: PositiveInt | None = None   # first N examples of train (tests, CPU budgets)
    max_eval_examples: PositiveInt | None = None    # first N examples of dev and of test
    warmup_ratio: float = Field(0.1, ge=0, le=1)
    weight_decay: float = Field(0.01, ge=0)
    grad_clip: PositiveFloat | None = 1.0
    pooling: Literal["cls", "mean"] = "cls"   # sequence tasks: the first token's state, or the masked mean
    multi_label_pos_weight: bool = True       # multi-label: BCE with pos_weight = negatives / positives per label
    lora_r: PositiveInt = 8
    lora_alpha: PositiveFloat = 16
    lora_dropout: float = Field(0.1, ge=0, lt=1)
    lora_target_modules: tuple[str, ...] | None = None   # null: a default per architecture (finetune.py)


LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")


def unread_settings(keys, method: str, task_type: str) -> dict[str, str]:
    """The fine-tuning settings among `keys` that a `task_type` task fine-tuned by `method` never reads: why."""
    why = {"pooling": "token classification pools nothing" if task_type == "token_classification" else None,
           "multi_label_pos_weight": None if task_type == "multi_label_classification"
           else f"a {task_type} task has no multi-label loss to weigh",
           **{k: "LoRA settings apply with method: lora only" if method != "lora" else None for k in LORA_FIELDS}}
    return {k: why[k] for k in keys if why.get(k)}


class Splits(Strict):
    train: str
    dev: str
    test: str


class DataSpec(Strict):
    format: Literal["conll", "jsonl", "csv", "json"]
    delimiter: str | None = None   # conll: column separator (null: any whitespace); csv: default ","
    splits: Splits


class Columns(Strict):
    """conll: `text` and `label` are column indexes (negative counts from the end).
    jsonl/csv/json: field names; a dotted name reaches into nested objects (answers.a); a list of names is
    joined with a space."""

    text: int | str | list[str]
    text_pair: str | list[str] | None = None
    label: int | str


class LabelOptions(Strict):
    values: list[str] | None = None            # the expected label set; any other label in the data is an error
    allow_unseen_eval_labels: bool = False     # allow dev/test labels that train lacks


class TaskSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    language: str = Field(min_length=2)
    type: TaskType
    source: str = Field(min_length=1)          # where the data comes from publicly
    description: str | None = None
    data: DataSpec
    columns: Columns
    metrics: list[str] = Field(min_length=1)    # the first drives early stopping
    labels: LabelOptions = LabelOptions()
    max_length: int = Field(128, ge=8)
    finetune: FinetuneSettings = FinetuneSettings()
    _file: str | None = PrivateAttr(default=None)

    @property
    def file(self) -> str | None:
        """The task file this spec was loaded from (None when built in code)."""
        return self._file

    @property
    def primary_metric(self) -> str:
        return self.metrics[0]

    @model_validator(mode="after")
    def _consistent(self) -> TaskSpec:
        allowed = METRICS[self.type]
        for i, m in enumerate(self.metrics):
            if m not in allowed:
                raise Located(f"unknown metric for a {self.type} task", f"metrics.{i}", m, ", ".join(allowed))
        if len(set(self.metrics)) != len(self.metrics):
            raise Located("a metric is listed twice", "metrics", self.metrics)
        conll, c = self.data.format == "conll", self.columns
        if conll != (self.type == "token_classification"):
            raise Located("token_classification reads conll files, and conll files are for token_classification",
                           "data.format", self.data.format)
        if conll:
            for key in ("text", "label"):
                if not isinstance(getattr(c, key), int):
                    raise Located("a conll column is an index (0, 1, ... or -1 for the last)", f"columns.{key}",
                                   getattr(c, key))
            if c.text_pair is not None:
                raise Located("conll tasks have no text_pair", "columns.text_pair", c.text_pair)
        else:
            for key in ("text", "label"):
                if isinstance(getattr(c, key), int):
                    raise Located(f"a {self.data.format} column is a field name", f"columns.{key}", getattr(c, key))
        if self.type == "sequence_pair_classification" and c.text_pair is None:
            raise Located("a pair task needs columns.text_pair", "columns.text_pair")
        if self.type == "sequence_classification" and c.text_pair is not None:
            raise Located("a task with text_pair is of type sequence_pair_classification", "columns.text_pair",
                           c.text_pair)
        if self.data.format == "csv" and self.data.delimiter is not None and len(self.data.delimiter) != 1:
            raise Located("a csv delimiter is one character", "data.delimiter", self.data.delimiter)
        if self.data.format in ("jsonl", "json") and self.data.delimiter is not None:
            raise Located(f"{self.data.format} files have no delimiter", "data.delimiter", self.data.delimiter)
        if self.type == "regression" and self.labels.values is not None:
            raise Located("a regression task has no label set", "labels.values", self.labels.values)
        if self.finetune.max_length is not None and "max_length" in self.model_fields_set:
            raise Located("the task's max_length and finetune.max_length are both given: finetune's would win",
                          "finetune.max_length", self.finetune.max_length, "one of the two")
        unread = unread_settings(self.finetune.model_fields_set, self.finetune.method, self.type)
        if unread:
            key, why = next(iter(unread.items()))
            raise Located(f"never read: {why}", f"finetune.{key}", getattr(self.finetune, key))
        if self.type == "token_classification" and self.labels.values:
            bad = [v for v in self.labels.values if not _IOB2_TAG.match(v)]
            if bad:
                raise Located("not an IOB2 tag", "labels.values", bad[0], "O, B-<type>, I-<type>")
        return self


# ---------------------------------------------------------------------------------------------------- registry

def tasks_dir() -> Path:
    env = os.environ.get(TASKS_DIR_ENV)
    return Path(env).expanduser() if env else Path(__file__).resolve().parents[2] / "grids" / "tasks"


def list_tasks() -> list[str]:
    """Names of the task files in the registry folder."""
    d = tasks_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


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
        raise SpecError("a task's name is its file name", file=file, key="name", value=spec.name,
                        allowed=path.stem)
    spec._file = file
    return spec


def resolve_settings(task: TaskSpec, overrides: dict[str, Any] | None = None,
                     protocol: str | None = None) -> FinetuneSettings:
    """The task file's fine-tuning settings, then the protocol profile's (ablate.evaluate.protocol), then a
    sweep's or the command line's overrides, validated."""
    merged = {**task.finetune.model_dump(), **profile_settings(protocol, task.language, task.type),
              **(overrides or {})}
    return validate(FinetuneSettings, merged, what="fine-tuning settings", prefix="finetune")


# ---------------------------------------------------------------------------------------------------- data

class Example(NamedTuple):
    """token_classification: text = the words, label = one IOB2 tag per word.
    (pair) classification: text (and text_pair) strings, label a string; multi-label: label a tuple of
    strings; regression: label a float."""

    text: str | tuple[str, ...]
    label: str | tuple[str, ...] | float
    text_pair: str | None = None


class TaskData(NamedTuple):
    splits: dict[str, list[Example]]   # train, dev, test
    labels: tuple[str, ...]            # model output order; () for regression


def load_task_data(task: TaskSpec, data_root: str | os.PathLike | None = None) -> TaskData:
    """Read and check every split. Raises SpecError for a missing file, an unknown column, an empty split,
    a malformed line, or a label set problem."""
    splits: dict[str, list[Example]] = {}
    for split in SPLITS:
        rel = getattr(task.data.splits, split)
        path = resolve_data_path(rel, data_root)
        key = f"data.splits.{split}"
        if not path.is_file():
            raise SpecError(f"data file not found: {path}", file=task.file, key=key, value=rel)
        try:
            examples = _read_conll(task, path) if task.data.format == "conll" else _read_records(task, path)
        except UnicodeDecodeError as e:
            raise SpecError(f"not UTF-8 text: {e}", file=str(path)) from None
        if not examples:
            raise SpecError(f"split has no examples: {path}", file=task.file, key=key, value=rel)
        splits[split] = examples
    return TaskData(splits, _label_set(task, splits))


def _read_conll(task: TaskSpec, path: Path) -> list[Example]:
    delim, ti, li = task.data.delimiter, task.columns.text, task.columns.label
    need = max(ti if ti >= 0 else -ti - 1, li if li >= 0 else -li - 1) + 1
    examples: list[Example] = []
    words: list[str] = []
    tags: list[str] = []

    def flush():
        if words:
            examples.append(Example(tuple(words), tuple(tags)))
            words.clear()
            tags.clear()

    with open(path, encoding="utf-8", newline="") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                flush()
                continue
            if line.startswith("-DOCSTART-"):
                flush()
                continue
            parts = line.split(delim) if delim else line.split()
            if len(parts) < need:
                sep = repr(delim) if delim else "whitespace"
                raise SpecError(f"malformed line: expected at least {need} columns separated by {sep}",
                                file=str(path), key=f"line {n}", value=line)
            word, tag = parts[ti], parts[li].strip()
            if not word.strip():
                raise SpecError("malformed line: empty token", file=str(path), key=f"line {n}", value=line)
            if not _IOB2_TAG.match(tag):
                raise SpecError("malformed IOB2 tag", file=str(path), key=f"line {n}", value=tag,
                                allowed="O, B-<type>, I-<type>")
            words.append(word)
            tags.append(tag)
    flush()
    return examples


def _iter_records(task: TaskSpec, path: Path):
    """(location, record) pairs; location names the line or item for error messages."""
    fmt = task.data.format
    if fmt == "jsonl":
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SpecError(f"not valid JSON: {e.msg}", file=str(path), key=f"line {n}") from None
                if not isinstance(rec, dict):
                    raise SpecError("a JSON line must be an object", file=str(path), key=f"line {n}")
                yield f"line {n}", rec
    elif fmt == "json":
        try:
            items = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise SpecError(f"not valid JSON: {e.msg}", file=str(path), key=f"line {e.lineno}") from None
        if not isinstance(items, list):
            raise SpecError("a json data file must hold an array of objects", file=str(path))
        for i, rec in enumerate(items):
            if not isinstance(rec, dict):
                raise SpecError("array items must be objects", file=str(path), key=f"item {i}")
            yield f"item {i}", rec
    else:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, delimiter=task.data.delimiter or ",")
            for rec in reader:
                yield f"line {reader.line_num}", rec


def _field(rec: dict, name: str, where: str, path: Path, task: TaskSpec, key: str):
    if name in rec:
        return rec[name]
    value: Any = rec
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            raise SpecError(f"{path} {where} has no column {name!r}", file=task.file, key=key, value=name,
                            allowed=", ".join(sorted(map(str, rec))))
        value = value[part]
    return value


def _text(rec, names, where, path, task, key) -> str:
    parts = []
    for name in [names] if isinstance(names, str) else names:
        v = _field(rec, name, where, path, task, key)
        if v is None or isinstance(v, (dict, list)):
            raise SpecError(f"{path} {where}: column {name!r} is not text", file=task.file, key=key,
                            value=type(v).__name__)
        parts.append(str(v))
    return " ".join(parts)


def _read_records(task: TaskSpec, path: Path) -> list[Example]:
    c, examples = task.columns, []
    for where, rec in _iter_records(task, path):
        text = _text(rec, c.text, where, path, task, "columns.text")
        pair = _text(rec, c.text_pair, where, path, task, "columns.text_pair") if c.text_pair else None
        raw = _field(rec, c.label, where, path, task, "columns.label")
        examples.append(Example(text, _label(task, raw, where, path), pair))
    return examples


def _label(task: TaskSpec, raw: Any, where: str, path: Path) -> str | tuple[str, ...] | float:
    def bad(msg):
        return SpecError(f"{path} {where}: {msg}", file=task.file, key="columns.label", value=raw)

    if task.type == "regression":
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise bad("a regression label must be a number") from None
    if task.type == "multi_label_classification":
        if not isinstance(raw, list) or any(isinstance(v, (dict, list)) or v is None for v in raw):
            raise bad("a multi-label label must be a list of labels")
        return tuple(sorted({str(v) for v in raw}))
    if raw is None or isinstance(raw, (dict, list)) or (isinstance(raw, str) and not raw.strip()):
        raise bad("a label must be one non-empty value")
    return str(raw)


def _label_set(task: TaskSpec, splits: dict[str, list[Example]]) -> tuple[str, ...]:
    if task.type == "regression":
        return ()
    seen: dict[str, set[str]] = {}
    for split, examples in splits.items():
        s: set[str] = set()
        for ex in examples:
            s.update(ex.label if isinstance(ex.label, tuple) else (ex.label,))
        seen[split] = s
    declared = task.labels.values
    if declared is not None:
        for split, s in seen.items():
            outside = sorted(s - set(declared))
            if outside:
                raise SpecError(f"{split} has labels outside labels.values", file=task.file, key="labels.values",
                                value=outside[:10], allowed=", ".join(declared))
    train = seen["train"]
    unseen: set[str] = set()
    for split in SPLITS[1:]:
        extra = seen[split] - train
        if extra and not task.labels.allow_unseen_eval_labels:
            raise SpecError(f"labels in {split} that train lacks", file=task.file, key=f"data.splits.{split}",
                            value=sorted(extra), allowed="set labels.allow_unseen_eval_labels: true to accept them")
        unseen |= extra
    if declared is not None:
        return tuple(declared)
    return tuple(sorted(train)) + tuple(sorted(unseen))
