"""How a task's data is obtained (a task file's optional `access:` block), whether the data root holds it, and
the one line that tells a user how to get it.

Two ways: `fetch` (`ablate data fetch DATASET`: a dataset of ablate/data/catalog.yaml, fetched from its public
source) and `brought` (data ablate cannot fetch: credentialed, or with no public download; the user obtains it
and places it under the data root in the stated format). A task file whose split files lie in a catalogued
dataset's folder needs no block: the catalog says where they come from.

May import: config, data (catalog).
"""

from __future__ import annotations

import glob
import os
from typing import Literal

from pydantic import Field, model_validator

from ablate.config.base import Located, Strict
from ablate.config.paths import resolve_data_path
from ablate.data.catalog import dataset_of_path

HUB = "hf:"


class Access(Strict):
    """Where a task's data comes from and how a user gets it."""

    kind: Literal["fetch", "brought"] = Field(
        description="fetch: `ablate data fetch DATASET`; brought: the user "
        "obtains the data and places it under the data root"
    )
    dataset: str | None = Field(None, description="fetch: the catalog's dataset name")
    source: str | None = Field(None, description="brought: where the data comes from")
    obtain: str | None = Field(None, description="brought: how access is obtained (a licence, a credential)")
    place: str | None = Field(
        None, description="brought: the files to write under the data root, and their format"
    )

    @model_validator(mode="after")
    def _complete(self) -> Access:
        needed = ("dataset",) if self.kind == "fetch" else ("source", "obtain", "place")
        for key in needed:
            if not getattr(self, key):
                raise Located(f"access of kind {self.kind} needs {key}", f"access.{key}")
        unread = [k for k in ("dataset", "source", "obtain", "place") if k not in needed and getattr(self, k)]
        if unread:
            raise Located(f"never read with kind {self.kind}", f"access.{unread[0]}", getattr(self, unread[0]))
        return self


def task_data_paths(task) -> list[str]:
    """The data-root-relative paths a task reads (its split files or folders, or a saved dataset's folder);
    a hub dataset has none here."""
    if task.data.format == "hf":
        return [] if task.data.dataset.startswith(HUB) else [task.data.dataset]
    splits = task.data.splits
    return list(dict.fromkeys([splits.train, splits.dev, splits.test]))


def missing_paths(task, data_root: str | os.PathLike | None = None) -> list[str]:
    """The paths of `task_data_paths` that the data root lacks (a glob matching nothing counts as missing)."""
    missing = []
    for rel in task_data_paths(task):
        where = resolve_data_path(rel, data_root)
        if not (where.exists() or glob.glob(str(where))):
            missing.append(rel)
    return missing


def how_to_get(task) -> str:
    """One line: the fetch command, or where brought data comes from, how access is obtained, and where it goes."""
    access = getattr(task, "access", None)
    if access is not None and access.kind == "brought":
        return f"brought: {access.source}; access: {access.obtain}; place: {access.place}"
    name = (
        access.dataset
        if access is not None
        else next((n for n in map(dataset_of_path, task_data_paths(task)) if n), None)
    )
    if name:
        return f"`ablate data fetch {name}`"
    return f"not catalogued: see the task file's source ({task.source.strip()})"


def catalogued(task) -> bool:
    """Whether ablate/data/catalog.yaml knows where the task's data comes from (its paths lie in a dataset)."""
    return any(dataset_of_path(p) for p in task_data_paths(task))
