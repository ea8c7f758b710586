"""The datasets a data root holds: where each comes from (catalog.yaml: repository, pinned commit, the files
read there, or a `download:` block for a plain URL, a Zenodo record or a Hugging Face dataset repository;
licence, converter), what each of its files must be (manifest.tsv: size and sha256 of the files the tables
were computed on; for a `checked: derived` dataset, whose files ablate cannot know without the data, the
FETCHED.tsv the fetch wrote in its folder) and named sets of them (sets.yaml). Checking a data root against
them is `ablate data verify`. Every block of an entry is checked when the catalogue is read (a SpecError naming
catalog.yaml, the key, the value and what is allowed); a generated dataset's `generate:` block is the needle's
settings model (ablate.data.needle.generate.Settings).

May import: config, data.needle.
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
from ablate.data.needle.generate import Settings as NeedleSettings
from ablate.data.needle.generate import read_settings

HERE = Path(__file__).resolve().parent
CATALOG = HERE / "catalog.yaml"
MANIFEST = HERE / "manifest.tsv"
SETS = HERE / "sets.yaml"
MANIFEST_COLUMNS = ("dataset", "file", "size", "sha256")
FETCHED = "FETCHED.tsv"  # a derived dataset's files as its fetch wrote them (MANIFEST_COLUMNS[1:])
NOT_DATA = {"SOURCE.md", "README.md", FETCHED}  # notes beside the data: not fetched, not checked
DOWNLOAD_KINDS = ("url", "zenodo", "hf")
HASH_BLOCK = 1 << 22
OTHER_REPO = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)@(?P<commit>[0-9a-f]{40}):(?P<path>.+)$")


@dataclass(frozen=True)
class Expected:
    """One file of a dataset as the manifest records it."""

    file: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Download:
    """Where a dataset that is not a GitHub repository at a commit is downloaded from."""

    kind: str  # url | zenodo | hf
    files: tuple[tuple[str, str], ...]  # (input name, URL) for url; (file name, file name) otherwise
    sha256: tuple[tuple[str, str], ...] = ()  # input name -> pinned sha256 (optional per file)
    record: str | None = None  # zenodo
    repo: str | None = None  # hf: the dataset repository
    revision: str | None = None  # hf: commit sha or tag

    def pinned_sha256(self, name: str) -> str | None:
        return dict(self.sha256).get(name)


@dataclass(frozen=True)
class Dataset:
    name: str
    repo: str
    commit: str
    licence: str
    converter: str | None
    non_commercial: bool = False
    sources: tuple[tuple[str, str], ...] = ()  # (name the converter reads it by, path in the repository)
    archive: tuple[str, ...] = ()  # folders read from the repository's archive at the commit
    requires: tuple[str, ...] = ()  # datasets the converter reads (from the data root)
    files: tuple[Expected, ...] = ()  # what the data root must hold (the manifest)
    download: Download | None = None  # instead of repo / commit / sources
    derived: bool = False  # checked: derived (FETCHED.tsv, not the manifest)
    generate: NeedleSettings | None = None  # a generated dataset's `generate:` block (converter needle)


@cache
def catalog() -> dict[str, Dataset]:
    return read_catalog(CATALOG)


def read_catalog(path: Path) -> dict[str, Dataset]:
    """A catalogue file's datasets, every block checked (SpecError naming `path` and the key)."""
    entries = yaml.safe_load(path.read_text(encoding="utf-8"))
    manifest = read_manifest(MANIFEST)
    file = str(path)
    return {
        name: Dataset(
            name,
            e.get("repo", ""),
            e.get("commit", ""),
            e["licence"],
            e.get("converter"),
            bool(e.get("non_commercial", False)),
            _sources(e),
            tuple(e.get("archive") or ()),
            tuple(e.get("requires") or ()),
            tuple(manifest.get(name, ())),
            _download(name, e, file),
            _derived(name, e, manifest, file),
            _generate(name, e, file),
        )
        for name, e in entries.items()
    }


def _derived(name: str, entry: dict, manifest: dict, file: str) -> bool:
    checked = entry.get("checked")
    if checked not in (None, "derived"):
        raise SpecError(
            "unknown `checked`",
            file=file,
            key=f"{name}.checked",
            value=checked,
            allowed="derived (or no key: the manifest)",
        )
    if checked and name in manifest:
        raise SpecError("a `checked: derived` dataset has no manifest rows", file=str(MANIFEST), key=name)
    return checked == "derived"


def _generate(name: str, entry: dict, file: str) -> NeedleSettings | None:
    """The `generate:` block, validated as every file a user writes is (a SpecError naming the key)."""
    if "generate" not in entry:
        return None
    return read_settings(entry["generate"], file, f"{name}.generate")


def _download(name: str, entry: dict, file: str) -> Download | None:
    """The `download:` block, checked: each kind names what it needs (a missing pin is bad input)."""
    block = entry.get("download")
    if block is None:
        return None
    key = f"{name}.download"
    kind = block.get("kind")
    if kind not in DOWNLOAD_KINDS:
        raise SpecError(
            "unknown download kind",
            file=file,
            key=f"{key}.kind",
            value=kind,
            allowed=", ".join(DOWNLOAD_KINDS),
        )
    files = block.get("files") or {}
    if kind == "url":
        pairs = tuple(files.items()) if isinstance(files, dict) else ()
        bad = [url for _, url in pairs if not str(url).startswith(("https://", "http://"))]
        if not pairs or bad:
            raise SpecError(
                "kind url takes `files: {INPUT_NAME: URL}`",
                file=file,
                key=f"{key}.files",
                value=bad[0] if bad else files,
            )
    else:
        if not isinstance(files, list) or not files:
            raise SpecError(f"kind {kind} takes `files: [FILE, ...]`", file=file, key=f"{key}.files", value=files)
        pairs = tuple((str(f), str(f)) for f in files)
    needs = {"zenodo": ("record",), "hf": ("repo", "revision")}.get(kind, ())
    for field in needs:
        if not block.get(field):
            raise SpecError(f"kind {kind} needs `{field}`", file=file, key=f"{key}.{field}")
    sha256 = block.get("sha256") or {}
    unknown = sorted(set(sha256) - {n for n, _ in pairs})
    if unknown:
        raise SpecError(
            "sha256 for a file the block does not download",
            file=file,
            key=f"{key}.sha256",
            value=unknown[0],
            allowed=", ".join(n for n, _ in pairs),
        )
    return Download(
        kind,
        pairs,
        tuple((str(k), str(v).lower()) for k, v in sha256.items()),
        str(block["record"]) if kind == "zenodo" else None,
        block.get("repo"),
        str(block["revision"]) if kind == "hf" else None,
    )


PINNINGS = ("commit", "record md5", "sha256", "unverified")
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")


def pinning(ds: Dataset) -> str:
    """How a dataset's source is pinned (PINNINGS): "commit", a repository (or a Hugging Face dataset) at a
    commit, its files checked against the manifest (a generated dataset: from such corpora); "record md5",
    a Zenodo record's files, each checked against the md5 the record lists; "sha256", downloads each
    checked against a sha256 the catalogue pins; "unverified", downloads nothing pins (a Hugging Face
    revision that is a branch, a URL without a sha256): the files may differ from the paper's."""
    d = ds.download
    if d is None:
        return "commit"
    if d.kind == "zenodo":
        return "record md5"
    if all(d.pinned_sha256(name) for name, _ in d.files):
        return "sha256"
    if d.kind == "hf" and COMMIT_SHA.match(d.revision or ""):
        return "commit"
    return "unverified"


def unverified_reason(ds: Dataset) -> str | None:
    """Why a dataset's download is unverified, in words (None when it is pinned: pinning)."""
    if pinning(ds) != "unverified":
        return None
    d = ds.download
    unpinned = [url if d.kind == "url" else name for name, url in d.files if not d.pinned_sha256(name)]
    where = (
        f"Hugging Face dataset {d.repo} at revision {d.revision} (not a commit sha), " if d.kind == "hf" else ""
    )
    return f"{where}no pinned sha256 for {', '.join(unpinned)}"


def origin(ds: Dataset) -> str:
    """Where a dataset comes from, in words."""
    d = ds.download
    if d is None:
        return f"{ds.repo} at {ds.commit[:12]}"
    if d.kind == "zenodo":
        return f"Zenodo record {d.record} ({', '.join(n for n, _ in d.files)})"
    if d.kind == "hf":
        return f"Hugging Face dataset {d.repo} at revision {d.revision} ({', '.join(n for n, _ in d.files)})"
    return ", ".join(url for _, url in d.files)


def _sources(entry: dict) -> tuple[tuple[str, str], ...]:
    """`sources` as written, then `each`: every path template once per id, named by its file name."""
    each = entry.get("each") or {"paths": [], "ids": []}
    templated = [
        (PurePosixPath(path).name, path)
        for i in each["ids"]
        for path in (template.format(id=i) for template in each["paths"])
    ]
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


SHA256 = re.compile(r"^[0-9a-f]{64}$")


class DamagedRecord(SpecError):
    """A manifest.tsv or FETCHED.tsv that is not the table it should be: exit 2 naming the file, the line and
    what is wrong, and what to do."""


def _checked_rows(path: Path, columns: tuple[str, ...], fix: str) -> list[dict[str, str]]:
    """The rows of a tab-separated file of `columns` (file, size, sha256 among them), each value checked: a
    relative file name, a size in bytes, a sha256 in hex. DamagedRecord (with `fix`: what to do) otherwise."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t")
            if tuple(reader.fieldnames or ()) != columns:
                raise DamagedRecord(
                    f"columns are {list(reader.fieldnames or [])}, not {list(columns)}; {fix}", file=str(path)
                )
            rows = list(reader)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DamagedRecord(f"not a UTF-8 tab-separated table ({exc}); {fix}", file=str(path)) from None
    for line, row in enumerate(rows, start=2):
        name, size, digest = row.get("file"), row.get("size"), row.get("sha256")
        if None in row or None in row.values():
            fields = sum(row[c] is not None for c in columns) + len(row.get(None) or [])
            problem = f"{fields} fields where {len(columns)} belong"
        elif not name or name.startswith("/") or ".." in PurePosixPath(name).parts:
            problem = f"file {name!r} is not a file name inside the dataset's folder"
        elif not (size.isascii() and size.isdigit()):
            problem = f"size {size!r} is not a number of bytes"
        elif not SHA256.match(digest):
            problem = f"sha256 {digest!r} is not 64 hexadecimal digits"
        else:
            continue
        raise DamagedRecord(f"line {line}: {problem}; {fix}", file=str(path))
    return rows


def read_manifest(path: Path) -> dict[str, list[Expected]]:
    rows: dict[str, list[Expected]] = {}
    fix = "the manifest ships with ablate: reinstall it"
    for row in _checked_rows(path, MANIFEST_COLUMNS, fix):
        rows.setdefault(row["dataset"], []).append(Expected(row["file"], int(row["size"]), row["sha256"]))
    return rows


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def manifest_rows(root: Path) -> list[tuple[str, str, int, str]]:
    """(dataset, file, size, sha256) of every data file under root's dataset folders, sorted; not those of
    `checked: derived` datasets (their FETCHED.tsv holds that)."""
    derived = {name for name, ds in catalog().items() if ds.derived}
    return [
        (d.name, f.name, f.stat().st_size, sha256_of(f))
        for d in sorted(
            p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in derived
        )
        for f in sorted(d.iterdir())
        if f.is_file() and f.name not in NOT_DATA
    ]


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


def expected_files(folder: Path, ds: Dataset) -> tuple[Expected, ...] | None:
    """What a dataset folder must hold: the manifest's rows, or for a derived dataset its FETCHED.tsv (None
    when there is none: not fetched; DamagedRecord when it is not the table its fetch writes)."""
    if not ds.derived:
        return ds.files
    fetched = folder / FETCHED
    if not fetched.is_file():
        return None
    fix = f"`ablate data fetch {ds.name}` fetches the dataset again and rewrites it"
    rows = _checked_rows(fetched, MANIFEST_COLUMNS[1:], fix)
    if not rows:
        raise DamagedRecord(f"records no file; {fix}", file=str(fetched))
    return tuple(Expected(r["file"], int(r["size"]), r["sha256"]) for r in rows)


def write_fetched(folder: Path, files: list[Path]) -> None:
    """FETCHED.tsv: file, size, sha256 of each file a derived dataset's fetch wrote."""
    with open(folder / FETCHED, "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f, delimiter="\t", lineterminator="\n")
        out.writerow(MANIFEST_COLUMNS[1:])
        out.writerows((p.name, p.stat().st_size, sha256_of(p)) for p in sorted(files))


def dataset_problems(folder: Path, ds: Dataset) -> list[str]:
    """Every way a dataset folder differs from the manifest (a derived dataset: from the FETCHED.tsv its fetch
    wrote); [] when it holds exactly what was recorded."""
    try:
        expected = expected_files(folder, ds)
    except DamagedRecord as exc:  # verify says so (exit 2); fetch fetches the dataset again
        return [str(exc)]
    if expected is None:
        return [f"{FETCHED}: missing (not fetched by `ablate data fetch {ds.name}`)"]
    problems = [p for e in expected if (p := file_problem(folder / e.file, e))]
    if ds.derived:  # its fetch recorded every file it wrote: one it does not list is a row lost, or a stranger
        listed = {e.file for e in expected}
        problems += [
            f"{rel}: in the folder but not in {FETCHED}"
            for path in sorted(folder.rglob("*"))
            if path.is_file()
            and (rel := path.relative_to(folder).as_posix()) not in listed
            and path.name not in NOT_DATA
            and not any(part.startswith(".") for part in path.relative_to(folder).parts)
        ]
    return problems
