"""Readers of a task's data: CoNLL, JSON lines, CSV and JSON files, BRAT folders (ablate.evaluate.brat), and
`datasets` datasets (a hub name or a folder saved with save_to_disk), each split -> a list of Examples. How a
record's label is read is the task type's `label_kind` (ablate.evaluate.task_types), asked through the task.
The checks of the whole label set across splits are ablate.evaluate.tasks'.

A record's label is normalised here: ClassLabel integers become their names, and labels.keep_entity_types
turns the tags of the other entity types into O.

May import: config, evaluate (brat).
"""

from __future__ import annotations

import csv
import functools
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from ablate.config import extras
from ablate.config.errors import SpecError
from ablate.config.paths import resolve_data_path
from ablate.evaluate.brat import read_folder

# The readers take an ablate.evaluate.tasks.TaskSpec; not imported, since that module imports this one.
TaskSpec = Any

SPLITS = ("train", "dev", "test")
IOB2_TAG = re.compile(r"^(O|[BI]-\S.*)$")
HUB_PREFIX = "hf:"


class Example(NamedTuple):
    """token_classification: text = the words, label = one IOB2 tag per word.
    (pair) classification: text (and text_pair) strings, label a string; multi-label: label a tuple of
    strings; regression: label a float; span_ner: text a string, label a tuple of (start, end, type)
    character spans."""

    text: str | tuple[str, ...]
    label: str | tuple[str, ...] | float
    text_pair: str | None = None


def read_splits(task: TaskSpec, data_root: str | os.PathLike | None = None) -> dict[str, list[Example]]:
    """Every split's examples, in file (or dataset) order; a SpecError for a missing file, an unknown column,
    an empty split or a malformed record."""
    if task.data.format == "hf":
        dataset = load_hf(task, data_root)
        return {
            split: _nonempty(task, split, _read_hf_split(task, dataset, split), task.data.dataset)
            for split in SPLITS
        }
    splits = {}
    for split in SPLITS:
        path = _split_path(task, split, data_root)
        try:
            examples = _READERS.get(task.data.format, _read_records)(task, path)
        except UnicodeDecodeError as e:
            raise SpecError(f"not UTF-8 text: {e}", file=str(path)) from None
        splits[split] = _nonempty(task, split, examples, path)
    return splits


def data_files(task: TaskSpec, data_root: str | os.PathLike | None = None) -> dict[str, Path]:
    """The files a task's data is read from, by a name that stays put (a score's data identity hashes
    them): a file format's split files by split name; a `datasets` dataset's Arrow files by split/index."""
    if task.data.format == "brat":
        return {
            f"{split}/{p.name}": p
            for split in SPLITS
            for p in sorted(_split_path(task, split, data_root).glob("*.[ta][xn][tn]"))
        }
    if task.data.format != "hf":
        return {split: _split_path(task, split, data_root) for split in SPLITS}
    dataset = load_hf(task, data_root)
    return {
        f"{split}/{i}": Path(f["filename"])
        for split in SPLITS
        for i, f in enumerate(dataset[_hf_split_name(task, dataset, split)].cache_files)
    }


def _split_path(task: TaskSpec, split: str, data_root) -> Path:
    rel = getattr(task.data.splits, split)
    path = resolve_data_path(rel, data_root)
    folder = task.data.format == "brat"
    if not (path.is_dir() if folder else path.is_file()):
        raise SpecError(
            f"data {'folder' if folder else 'file'} not found: {path}",
            file=task.file,
            key=f"data.splits.{split}",
            value=rel,
        )
    return path


_BRAT_FILES = "a folder of BRAT <doc>.txt files, each with its <doc>.ann beside it"


def _nonempty(task: TaskSpec, split: str, examples: list[Example], source) -> list[Example]:
    if not examples:
        brat = task.data.format == "brat"
        bare = brat and not any(Path(source).glob("*.txt"))
        raise SpecError(
            f"no BRAT .txt/.ann pairs in the folder {source}" if bare else f"split has no examples: {source}",
            file=task.file,
            key=f"data.splits.{split}",
            value=getattr(task.data.splits, split),
            allowed=_BRAT_FILES if brat else None,
        )
    return examples


# ---------------------------------------------------------------------------------------------------- conll


def _read_conll(task: TaskSpec, path: Path) -> list[Example]:
    delim, ti, li = task.data.delimiter, task.columns.text, task.columns.label
    need = max(ti if ti >= 0 else -ti - 1, li if li >= 0 else -li - 1) + 1
    examples: list[Example] = []
    words: list[str] = []
    tags: list[str] = []

    def flush():
        if words:
            examples.append(Example(tuple(words), keep_entity_types(task, tags)))
            words.clear()
            tags.clear()

    with open(path, encoding="utf-8", newline="") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip() or line.startswith("-DOCSTART-"):
                flush()
                continue
            parts = line.split(delim) if delim else line.split()
            if len(parts) < need:
                sep = repr(delim) if delim else "whitespace"
                raise SpecError(
                    f"malformed line: expected at least {need} columns separated by {sep}",
                    file=str(path),
                    key=f"line {n}",
                    value=line,
                )
            word, tag = parts[ti], parts[li].strip()
            if not word.strip():
                raise SpecError("malformed line: empty token", file=str(path), key=f"line {n}", value=line)
            if not IOB2_TAG.match(tag):
                raise SpecError(
                    "malformed IOB2 tag",
                    file=str(path),
                    key=f"line {n}",
                    value=tag,
                    allowed="O, B-<type>, I-<type>",
                )
            words.append(word)
            tags.append(tag)
    flush()
    return examples


def keep_entity_types(task: TaskSpec, tags: Iterable[str]) -> tuple[str, ...]:
    """The tags with every entity type outside labels.keep_entity_types turned into O (all kept when unset)."""
    keep = task.labels.keep_entity_types
    if keep is None:
        return tuple(tags)
    return tuple(t if t == "O" or t[2:] in keep else "O" for t in tags)


def _read_brat(task: TaskSpec, folder: Path) -> list[Example]:
    return [Example(text, spans) for text, spans in read_folder(folder, task.data.units or "lines")[0]]


# ---------------------------------------------------------------------------------------------------- records


def _iter_records(task: TaskSpec, path: Path) -> Iterator[tuple[str, dict]]:
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


def _field(rec: dict, name: str, where: str, task: TaskSpec, key: str):
    if name in rec:
        return rec[name]
    value: Any = rec
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            raise SpecError(
                f"{where} has no column {name!r}",
                file=task.file,
                key=key,
                value=name,
                allowed=", ".join(sorted(map(str, rec))),
            )
        value = value[part]
    return value


def _text(rec, names, where, task, key) -> str:
    parts = []
    for name in [names] if isinstance(names, str) else names:
        v = _field(rec, name, where, task, key)
        if v is None or isinstance(v, (dict, list)):
            raise SpecError(
                f"{where}: column {name!r} is not text", file=task.file, key=key, value=type(v).__name__
            )
        parts.append(str(v))
    return " ".join(parts)


def _read_records(task: TaskSpec, path: Path) -> list[Example]:
    return _record_examples(task, ((f"{path} {where}", rec) for where, rec in _iter_records(task, path)))


def _record_examples(task: TaskSpec, records: Iterable[tuple[str, dict]]) -> list[Example]:
    c, examples = task.columns, []
    for where, rec in records:
        text = _text(rec, c.text, where, task, "columns.text")
        pair = _text(rec, c.text_pair, where, task, "columns.text_pair") if c.text_pair else None
        raw = _field(rec, c.label, where, task, "columns.label")
        examples.append(Example(text, _label(task, raw, where), pair))
    return examples


def _label(task: TaskSpec, raw: Any, where: str) -> str | tuple[str, ...] | float:
    def bad(msg):
        return SpecError(f"{where}: {msg}", file=task.file, key="columns.label", value=raw)

    kind = task.entry.label_kind
    if kind == "number":
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise bad("a regression label must be a number") from None
    if kind == "set":
        if not isinstance(raw, list) or any(isinstance(v, (dict, list)) or v is None for v in raw):
            raise bad("a multi-label label must be a list of labels")
        return tuple(sorted({str(v) for v in raw}))
    if raw is None or isinstance(raw, (dict, list)) or (isinstance(raw, str) and not raw.strip()):
        raise bad("a label must be one non-empty value")
    return str(raw)


_READERS = {"conll": _read_conll, "brat": _read_brat}


def read_groups(task: TaskSpec, data_root: str | os.PathLike | None = None) -> dict[str, list[tuple[str, ...]]]:
    """Per split, each record's values of the task's `group_by` fields (as text), in the order read_splits
    gives its examples (one per record). Records formats only (jsonl, csv, json, hf)."""

    def values(records: Iterable[tuple[str, dict]]) -> list[tuple[str, ...]]:
        return [
            tuple(str(_field(rec, name, where, task, "group_by")) for name in task.group_by or ())
            for where, rec in records
        ]

    if task.data.format == "hf":
        dataset = load_hf(task, data_root)
        return {
            split: values(
                (f"{task.data.dataset} [{split}] row {i}", rec)
                for i, rec in enumerate(dataset[_hf_split_name(task, dataset, split)])
            )
            for split in SPLITS
        }
    return {
        split: values((f"{path} {where}", rec) for where, rec in _iter_records(task, path))
        for split in SPLITS
        for path in (_split_path(task, split, data_root),)
    }


# ---------------------------------------------------------------------------------------------------- datasets


def load_hf(task: TaskSpec, data_root=None):
    """The task's `datasets` DatasetDict: `hf:ORG/NAME` from the hub (datasets.load_dataset, with
    data.config), anything else a folder saved with save_to_disk (relative to the data root). Loaded once per
    dataset and version: its data, its score identity and its fine-tuning read the same one."""
    ref = task.data.dataset
    if ref.startswith(HUB_PREFIX):
        return _load_hf(task.file, ref, task.data.config, None, None)
    path = resolve_data_path(ref, data_root)
    stamp = tuple(p.stat().st_mtime_ns for p in (path, *sorted(path.glob("**/*.json")))) if path.is_dir() else None
    return _load_hf(task.file, ref, task.data.config, str(path), stamp)


@functools.lru_cache(maxsize=8)
def _load_hf(file: str | None, ref: str, config: str | None, folder: str | None, _stamp):
    datasets = extras.load("datasets", "format hf", file=file, key="data.format", value="hf")
    if ref.startswith(HUB_PREFIX):
        name = ref[len(HUB_PREFIX) :]
        try:
            loaded = datasets.load_dataset(name, config)
        except Exception as e:  # the hub's errors have no common base: each is reported as it is
            offline = datasets.config.HF_HUB_OFFLINE or isinstance(e, (ConnectionError, OSError))
            hint = (
                " The Hugging Face hub is unreachable from here (offline, or HF_HUB_OFFLINE is set): save "
                "the dataset with save_to_disk where the hub is reachable and name that folder instead."
                if offline
                else ""
            )
            raise SpecError(
                f"could not load {name!r} from the Hugging Face hub: {type(e).__name__}: {e}.{hint}",
                file=file,
                key="data.dataset",
                value=ref,
            ) from None
    else:
        path = Path(folder)
        if not path.is_dir():
            raise SpecError(
                f"saved dataset folder not found: {path}",
                file=file,
                key="data.dataset",
                value=ref,
                allowed=f"a folder saved with save_to_disk, or {HUB_PREFIX}ORG/NAME",
            )
        try:
            loaded = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError) as e:
            raise SpecError(
                f"not a dataset saved with save_to_disk: {path}: {e}", file=file, key="data.dataset", value=ref
            ) from None
    if not isinstance(loaded, datasets.DatasetDict):
        raise SpecError(
            "the dataset has no named splits (a DatasetDict is needed)", file=file, key="data.dataset", value=ref
        )
    return loaded


def _hf_split_name(task: TaskSpec, dataset, split: str) -> str:
    name = getattr(task.data.splits, split)
    if name not in dataset:
        raise SpecError(
            f"the dataset has no split {name!r}",
            file=task.file,
            key=f"data.splits.{split}",
            value=name,
            allowed=", ".join(dataset),
        )
    return name


def _class_names(feature) -> list[str] | None:
    """The names of a ClassLabel feature, or of a list of ClassLabel; None for anything else."""
    from datasets import ClassLabel

    inner = getattr(feature, "feature", None)
    for f in (feature, inner):
        if isinstance(f, ClassLabel):
            return list(f.names)
    return None


def _read_hf_split(task: TaskSpec, dataset, split: str) -> list[Example]:
    name = _hf_split_name(task, dataset, split)
    part = dataset[name]
    label_col = task.columns.label
    names = _class_names(part.features[label_col]) if label_col in part.features else None
    where = f"{task.data.dataset} [{name}]"

    def records() -> Iterator[tuple[str, dict]]:
        for i, rec in enumerate(part):
            if names is not None and label_col in rec:
                v = rec[label_col]
                rec[label_col] = [names[j] for j in v] if isinstance(v, list) else names[v]
            yield f"{where} row {i}", rec

    if task.entry.label_kind == "tags":
        return [_token_example(task, rec, at) for at, rec in records()]
    return _record_examples(task, records())


def _token_example(task: TaskSpec, rec: dict, where: str) -> Example:
    words = _field(rec, task.columns.text, where, task, "columns.text")
    tags = _field(rec, task.columns.label, where, task, "columns.label")
    if not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words):
        raise SpecError(
            f"{where}: the tokens column must be a list of non-empty strings",
            file=task.file,
            key="columns.text",
            value=task.columns.text,
        )
    if not isinstance(tags, list) or len(tags) != len(words):
        raise SpecError(
            f"{where}: the tags column must be a list of one tag per token",
            file=task.file,
            key="columns.label",
            value=tags if not isinstance(tags, list) else len(tags),
        )
    bad = [t for t in tags if not isinstance(t, str) or not IOB2_TAG.match(t)]
    if bad:
        raise SpecError(
            f"{where}: malformed IOB2 tag",
            file=task.file,
            key="columns.label",
            value=bad[0],
            allowed="O, B-<type>, I-<type> (or ClassLabel integers with such names)",
        )
    return Example(tuple(words), keep_entity_types(task, tags))
