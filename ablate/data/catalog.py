"""The datasets a data root holds: where each comes from (catalog.yaml: repository, pinned commit, the files
read there, licence, converter), what each of its files must be (manifest.tsv: size and sha256 of the
files the tables were computed on) and named sets of them (sets.yaml). Checking a data root against the
manifest is `ablate data verify`.

May import: config.
"""

from __future__ import annotations

import csv
import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath

import yaml

from ablate.config.errors import SpecError

HERE = Path(__file__).resolve().parent
CATALOG = HERE / "catalog.yaml"
MANIFEST = HERE / "manifest.tsv"
SETS = HERE / "sets.yaml"
MANIFEST_COLUMNS = ("dataset", "file", "size", "sha256")
NOT_DATA = {"SOURCE.md", "README.md"}     # notes beside the data: not fetched, not checked
HASH_BLOCK = 1 << 22
OTHER_REPO = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)@(?P<commit>[0-9a-f]{40}):(?P<path>.+)$")


@dataclass(frozen=True)
class Expected:
    """One file of a dataset as the manifest records it."""

    file: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Dataset:
    name: str
    repo: str
    commit: str
    licence: str
    converter: str | None
    non_commercial: bool = False
    sources: tuple[tuple[str, str], ...] = ()     # (name the converter reads it by, path in the repository)
    archive: tuple[str, ...] = ()                 # folders read from the repository's archive at the commit
    requires: tuple[str, ...] = ()                # datasets the converter reads (from the data root)
    files: tuple[Expected, ...] = ()              # what the data root must hold (the manifest)


@cache
def catalog() -> dict[str, Dataset]:
    entries = yaml.safe_load(CATALOG.read_text(encoding="utf-8"))
    manifest = read_manifest(MANIFEST)
    # e.get: `download:` entries (not a GitHub commit) have neither; fetch.py/download.py read them
    return {name: Dataset(name, e.get("repo", ""), e.get("commit", ""), e["licence"], e.get("converter"),
                          bool(e.get("non_commercial", False)), _sources(e), tuple(e.get("archive") or ()),
                          tuple(e.get("requires") or ()), tuple(manifest.get(name, ())))
            for name, e in entries.items()}


def _sources(entry: dict) -> tuple[tuple[str, str], ...]:
    """`sources` as written, then `each`: every path template once per id, named by its file name."""
    each = entry.get("each") or {"paths": [], "ids": []}
    templated = [(PurePosixPath(path).name, path) for i in each["ids"] for path in
                 (template.format(id=i) for template in each["paths"])]
    return tuple((entry.get("sources") or {}).items()) + tuple(templated)


@cache
def dataset_sets() -> dict[str, tuple[str, ...]]:
    """Named sets of catalogued datasets (sets.yaml), e.g. `tests`: what the test suite reads."""
    sets = yaml.safe_load(SETS.read_text(encoding="utf-8"))
    for name, members in sets.items():
        for member in members:
            dataset(member, key=f"{SETS.name}: {name}")
    return {name: tuple(members) for name, members in sets.items()}


def dataset(name: str, key: str = "dataset") -> Dataset:
    known = catalog()
    if name not in known:
        raise SpecError("unknown dataset", key=key, value=name, allowed=", ".join(sorted(known)))
    return known[name]


def with_requirements(datasets: list[Dataset]) -> list[Dataset]:
    """The datasets and those they require, each requirement before the first dataset that needs it."""
    ordered: dict[str, Dataset] = {}

    def add(ds: Dataset) -> None:
        for name in ds.requires:
            add(dataset(name))
        ordered.setdefault(ds.name, ds)

    for ds in datasets:
        add(ds)
    return list(ordered.values())


def source_location(ds: Dataset, path: str) -> tuple[str, str, str]:
    """(repository, commit, path) of a source: a path in the dataset's repository, or OWNER/REPO@COMMIT:PATH."""
    if match := OTHER_REPO.match(path):
        return match["repo"], match["commit"], match["path"]
    return ds.repo, ds.commit, path


def dataset_of_path(rel: str) -> str | None:
    """The catalogued dataset a data-root-relative path belongs to (its first folder), None if none."""
    parts = PurePosixPath(str(rel).replace("\\", "/")).parts
    return parts[0] if len(parts) > 1 and parts[0] in catalog() else None


def read_manifest(path: Path) -> dict[str, list[Expected]]:
    rows: dict[str, list[Expected]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            rows.setdefault(row["dataset"], []).append(Expected(row["file"], int(row["size"]), row["sha256"]))
    return rows


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def manifest_rows(root: Path) -> list[tuple[str, str, int, str]]:
    """(dataset, file, size, sha256) of every data file under root's dataset folders, sorted."""
    return [(d.name, f.name, f.stat().st_size, sha256_of(f))
            for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
            for f in sorted(d.iterdir()) if f.is_file() and f.name not in NOT_DATA]


def write_manifest(rows: list[tuple[str, str, int, str]], path: Path = MANIFEST) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f, delimiter="\t", lineterminator="\n")
        out.writerow(MANIFEST_COLUMNS)
        out.writerows(rows)


def file_problem(path: Path, expected: Expected) -> str | None:
    """Why a file is not the one the manifest records (missing, size, sha256), None when it is."""
    if not path.is_file():
        return f"{expected.file}: missing"
    size = path.stat().st_size
    if size != expected.size:
        return f"{expected.file}: size {size:,} B, the manifest has {expected.size:,} B"
    digest = sha256_of(path)
    if digest != expected.sha256:
        return f"{expected.file}: sha256 {digest[:16]}..., the manifest has {expected.sha256[:16]}..."
    return None


def dataset_problems(folder: Path, ds: Dataset) -> list[str]:
    """Every way a dataset folder differs from the manifest; [] when it holds exactly what was recorded."""
    return [p for e in ds.files if (p := file_problem(folder / e.file, e))]
