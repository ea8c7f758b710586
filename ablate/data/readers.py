"""A corpus reference -> its source files, their identity, and a stream of documents, never the whole corpus.

A reference is one file, a glob (`shards/*.jsonl.gz`), a folder of shards (its supported files, sorted), a
saved `datasets` dataset (a folder with dataset_info.json), or hf:NAME (a hub dataset). Formats: text (one
document a line), jsonl (optionally .gz / .zst), parquet, saved datasets. Each document is stripped; empty
ones are dropped; `max_documents` keeps the first N. Bad input is a SpecError naming the file and line.

A source's identity is its resolved path, size and mtime, plus a sha256 of its bytes taken while preparing:
a run compares size and mtime (no re-reading) and re-hashes only when they differ.

May import: config.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ablate.config import extras
from ablate.config.errors import SpecError
from ablate.config.paths import resolve_data_path
from ablate.config.spec import DataSpec

SUFFIXES = (
    ".txt",
    ".text",
    ".jsonl",
    ".json",
    ".jsonl.gz",
    ".json.gz",
    ".jsonl.zst",
    ".json.zst",
    ".parquet",
    ".txt.gz",
)
HASH_BLOCK = 1 << 22


class CorpusNotFound(SpecError):
    """No file matches a corpus reference: a dry run only warns of it, a submission refuses it."""


@dataclass(frozen=True)
class Source:
    """One file (or saved dataset folder) of a corpus and how to read it."""

    path: Path
    fmt: str  # text, jsonl, parquet, hf

    def stat(self) -> dict:
        files = self._files()
        return {
            "path": str(self.path),
            "size": sum(f.stat().st_size for f in files),
            "mtime_ns": max(f.stat().st_mtime_ns for f in files),
        }

    def content_hash(self) -> str:
        h = hashlib.sha256()
        for f in self._files():
            with f.open("rb") as fh:
                while block := fh.read(HASH_BLOCK):
                    h.update(block)
        return h.hexdigest()

    def _files(self) -> list[Path]:
        return sorted(p for p in self.path.rglob("*") if p.is_file()) if self.path.is_dir() else [self.path]


def _fmt_of(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    if path.is_dir():
        return "hf"
    name = path.name.lower()
    for suffix in (".gz", ".zst"):
        name = name.removesuffix(suffix)
    return {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}.get(Path(name).suffix, "text")


def resolve_sources(spec: DataSpec, which: str = "corpus") -> list[Source]:
    """The corpus's source files in reading order; SpecError when missing, empty or unreadable."""
    ref, key = getattr(spec, which), f"data.{which}"
    if ref.startswith("hf:"):
        extras.require("datasets", "a hub corpus", key=key, value=ref)
        return [Source(Path(ref), "hub")]
    path = resolve_data_path(ref, spec.data_root)
    if any(c in ref for c in "*?["):
        paths = [Path(p) for p in sorted(glob.glob(str(path), recursive=True)) if Path(p).is_file()]
    elif (
        path.is_dir() and not (path / "dataset_info.json").is_file() and not (path / "dataset_dict.json").is_file()
    ):
        paths = sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(SUFFIXES))
    elif path.exists():
        paths = [path]
    else:
        paths = []
    if not paths:
        raise CorpusNotFound(
            "corpus not found (relative paths are under the data root: ABLATE_DATA_ROOT or "
            "data.data_root; a glob or folder must match at least one corpus file)",
            key=key,
            value=str(path),
        )
    sources = [Source(p.resolve(), _fmt_of(p, spec.format)) for p in paths]
    if any(s.fmt == "hf" for s in sources):
        extras.require("datasets", "a saved datasets folder", key=key, value=ref)
    for s in sources:
        if not os.access(s.path, os.R_OK):
            raise SpecError("corpus file is not readable", file=str(s.path), key=key)
        if s.path.is_file() and s.path.stat().st_size == 0:
            raise SpecError("corpus is empty (a file of 0 bytes)", file=str(s.path), key=key)
    return sources


def _open_text(path: Path) -> io.BufferedIOBase:
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise SpecError(
                "reading .zst needs the zstandard package (pip install zstandard)", file=str(path)
            ) from None
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def _decode(raw: bytes, path: Path, lineno: int, errors: str) -> str:
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"line {lineno} is not valid UTF-8 ({exc.reason} at byte {exc.start}); fix the file or "
            f"set data.errors: replace",
            file=str(path),
            key="data.errors",
            value=errors,
            allowed="strict (the default), replace",
        ) from None


def _read_lines(source: Source, spec: DataSpec) -> Iterator[str]:
    with _open_text(source.path) as f:
        for lineno, raw in enumerate(f, 1):
            if source.fmt == "text":
                yield _decode(raw, source.path, lineno, spec.errors)
                continue
            if not raw.strip():
                continue
            line = _decode(raw, source.path, lineno, spec.errors)
            try:
                yield str(json.loads(line)[spec.text_field])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise SpecError(
                    f"line {lineno} is not a JSON object with field {spec.text_field!r}",
                    file=str(source.path),
                    key="data.text_field",
                    value=spec.text_field,
                    allowed="a field of every JSON line, or data.format: text for a file of plain lines",
                ) from None


def _read_parquet(source: Source, spec: DataSpec) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(source.path)
    except (pa.ArrowException, OSError) as exc:
        raise SpecError(
            f"not a parquet file ({exc})",
            file=str(source.path),
            key="data.format",
            value=source.fmt,
            allowed="the format the file is written in: text, jsonl or parquet (auto: by its suffix)",
        ) from None
    if spec.text_field not in f.schema_arrow.names:
        raise SpecError(
            "text field not in the parquet file",
            file=str(source.path),
            key="data.text_field",
            value=spec.text_field,
            allowed=", ".join(f.schema_arrow.names),
        )
    for batch in f.iter_batches(batch_size=4096, columns=[spec.text_field]):
        yield from (str(x) for x in batch.column(0).to_pylist())


def load_dataset_source(source: Source, spec: DataSpec):
    datasets = extras.load("datasets", "a hub corpus or saved datasets folder", key="data.corpus")
    name = str(source.path).removeprefix("hf:") if source.fmt == "hub" else str(source.path)
    try:
        ds = datasets.load_from_disk(name) if source.fmt != "hub" else datasets.load_dataset(name, split="train")
    except Exception as exc:  # datasets raises many types for a missing dataset
        raise SpecError(f"cannot load the dataset: {exc}", key="data.corpus", value=name) from None
    if isinstance(ds, datasets.DatasetDict):
        ds = ds["train"]
    if spec.text_field not in ds.column_names:
        raise SpecError(
            "text field not in the dataset",
            key="data.text_field",
            value=spec.text_field,
            allowed=", ".join(ds.column_names),
        )
    return ds


def _read_dataset(source: Source, spec: DataSpec) -> Iterator[str]:
    ds = load_dataset_source(source, spec)
    for batch in ds.select_columns([spec.text_field]).iter(batch_size=4096):
        yield from (str(x) for x in batch[spec.text_field])


def iter_documents(sources: list[Source], spec: DataSpec) -> Iterator[str]:
    """Every non-empty stripped document, in file order, the first `max_documents` of them."""
    readers = {
        "text": _read_lines,
        "jsonl": _read_lines,
        "parquet": _read_parquet,
        "hf": _read_dataset,
        "hub": _read_dataset,
    }
    n = 0
    for source in sources:
        for doc in readers[source.fmt](source, spec):
            doc = doc.strip()
            if not doc:
                continue
            yield doc
            n += 1
            if spec.max_documents is not None and n >= spec.max_documents:
                return


def hub_identity(source: Source, spec: DataSpec) -> dict:
    """A hub dataset has no file of ours: its identity is the datasets library's fingerprint."""
    ds = load_dataset_source(source, spec)
    return {"path": str(source.path), "fingerprint": ds._fingerprint}
