"""What a stored score was computed from: a hash of the task definition, of its data files' bytes and of
the fine-tuning settings. A score file records the three; a score is read back only when all three still
match, so that editing a task file, its data or a setting recomputes it (ablate.evaluate.score_files).

The task hash is over the resolved task file (the validated TaskSpec, defaults filled in) less what does
not change the computation: `description`, `source` (provenance text; the data are hashed themselves) and
`finetune` (the settings hash covers the settings actually used, whatever layer they came from). A data
file's hash is kept per (path, size, mtime) for the life of the process, so a sweep's evaluation reads each
file once, not once per run.

May import: evaluate.tasks.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Any

from ablate.evaluate.task_readers import data_files
from ablate.evaluate.tasks import FinetuneSettings, TaskSpec

PARTS = {"task": "the task file", "data": "the task's data files", "settings": "the fine-tuning settings"}
_NOT_COMPUTATION = {"description", "source", "finetune"}


def _digest(value: Any) -> str:
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=256)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:  # size and mtime: the cache key
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, read again only when its size or mtime changed."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return _file_sha256(real, st.st_size, st.st_mtime_ns)


def task_hash(task: TaskSpec) -> str:
    # group_by (issue 46) adds per-group scores, data.units (issue 56) cuts BRAT documents otherwise; unset,
    # each computes what every older score computed
    exclude: dict[str, Any] = {
        k: True for k in _NOT_COMPUTATION | ({"group_by"} if task.group_by is None else set())
    }
    if task.data.units is None:
        exclude["data"] = {"units"}
    dump = task.model_dump(mode="json", exclude=exclude)
    if task.entry.revision:  # the type computes otherwise than when older scores were stored
        dump["type_revision"] = task.entry.revision
    return _digest(dump)


def data_hash(task: TaskSpec, data_root: str | os.PathLike | None = None) -> str:
    return _digest({name: file_sha256(path) for name, path in data_files(task, data_root).items()})


# Settings added after score files existed, at the value that computes exactly what was computed before them:
# left out of the hash at that value, so that older score files still match. group_by_length's default is
# true since issue 32, so a default score no longer matches an older default one (shuffled batches): they are
# kept apart. precision is hashed as it resolves on the device (finetune.resolve_precision): fp32 is what
# every older score computed in; bf16 (CUDA's auto) is another identity.
NEUTRAL_SETTINGS = {
    "group_by_length": False,
    "length_pieces": False,
    "subset": "first",
    "precision": "fp32",
    # span_ner's settings (issue 44), at their defaults: what every older score computed with
    "max_steps": None,
    "eval_every": None,
    "head_lr": None,
    "head_dropout": 0.4,
    "max_span_length": 40,
    "lstm_hidden_size": 400,
    "lstm_layers": 3,
    "biaffine_hidden_size": 64,
    "span_selection": "sampled",  # issue 56: with the span model's revision (task_hash), tabib's default
    # the probes (issue 46): none is full fine-tuning, what every older score computed
    "probe": "none",
    "probe_hidden": None,
    "probe_dropout": 0.1,
    # issue 62: each seed seeding everything, and the span model's CRF in float32, what older scores did
    "data_seed": None,
    "crf_precision": "float32",
}


def settings_hash(settings: FinetuneSettings) -> str:
    dump = settings.model_dump(mode="json")
    return _digest({k: v for k, v in dump.items() if k not in NEUTRAL_SETTINGS or v != NEUTRAL_SETTINGS[k]})


def score_identity(task: TaskSpec, settings: FinetuneSettings, data_root=None) -> dict[str, str]:
    """{"task": ..., "data": ..., "settings": ...}: what a score file records and is compared on."""
    return {"task": task_hash(task), "data": data_hash(task, data_root), "settings": settings_hash(settings)}


def changed(stored: Any, wanted: dict[str, str]) -> list[str]:
    """What differs between a score file's recorded identity and the wanted one, in words; [] when none."""
    if not isinstance(stored, dict):
        return ["no identity recorded (computed by an older version)"]
    return [f"{PARTS[k]} changed" for k in PARTS if stored.get(k) != wanted[k]]
