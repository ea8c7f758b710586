"""`ablate data fetch`: datasets from their public sources into the data root, checked against the manifest.

Per dataset (the datasets it requires first): skipped when its files already match the manifest; else its
licence is printed (a non-commercial one said so first), its sources downloaded (kept in <root>/.fetch-cache
until every dataset of the command is in place, so an interrupted fetch resumes), its converter writes the
shipped files into a temporary folder beside the data root, every file is checked (size, sha256), and only
then are the files renamed into <root>/<dataset>/. A failure at any point leaves the data root as it was.
A dataset with a `download:` block (a URL, a Zenodo record, a Hugging Face dataset: ablate.data.remote) has
its downloads checked (sha256, the record's md5) before the converter reads them; a `checked: derived` one,
whose files no manifest can know, gets a FETCHED.tsv (each file's size and sha256) placed last, which `ablate
data verify` checks from then on. A download the converter cannot read (a zip, tar or gzip stream truncated or
corrupted, even one listed with its own md5: ablate.data.archives) is exit 2 naming the dataset, the download
and where it came from; it is removed from the cache, so that the next fetch downloads it again, and nothing is
placed.

May import: config, data.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from ablate.config.errors import SpecError
from ablate.data.archives import UNREADABLE, archive_problem, describe
from ablate.data.catalog import (
    FETCHED,
    Dataset,
    dataset_problems,
    expected_files,
    origin,
    source_location,
    with_requirements,
    write_fetched,
)
from ablate.data.converters import CONVERTERS
from ablate.data.download import DownloadError, archive_url, download, file_url, remove_quietly
from ablate.data.remote import ChecksumMismatch, download_inputs, zenodo_base

CACHE = ".fetch-cache"
DOCS = "docs/data.md"


class UnreadableDownload(ChecksumMismatch):
    """A download that cannot be read whole: removed from the fetch cache, nothing placed."""


def by_hand(ds: Dataset, root: Path) -> str:
    """How to supply a dataset without this command."""
    if ds.download is not None:
        return (
            f"to supply it by hand, put {', '.join(n for n, _ in ds.download.files)} (from {origin(ds)}) "
            f"where the fetch caches its downloads ({root / CACHE}/, see {DOCS}) and fetch again: the "
            "files are checked and converted as if downloaded"
        )
    return (
        f"to supply it by hand, build the files of {ds.name} as its SOURCE notes say ({DOCS}; from "
        f"{ds.repo} at {ds.commit}) into {root / ds.name}/ and check them with `ablate data verify {ds.name}`; "
        "a task can also read a `datasets` folder saved with save_to_disk or a hub dataset (format: hf in its "
        "task file), and a corpus any file, folder or hf: name (data.corpus)"
    )


def fetch_datasets(
    datasets: list[Dataset], root: Path, mirror: str | None = None, say: Callable[[str], None] = print
) -> list[str]:
    """Fetch each dataset not already in place; returns the names fetched. A SpecError (exit 2) for the first
    that cannot be fetched, after the ones before it were placed."""
    root.mkdir(parents=True, exist_ok=True)
    fetched = []
    for ds in with_requirements(datasets):
        if not dataset_problems(root / ds.name, ds):
            say(f"{ds.name}: in place, every file matches the manifest")
            continue
        say(_licence_line(ds))
        if ds.converter is None:
            raise SpecError(
                f"dataset {ds.name}: no converter yet for its derivation; {by_hand(ds, root)}",
                key="dataset",
                value=ds.name,
            )
        _fetch_one(ds, root, mirror, say)
        fetched.append(ds.name)
        n = len(expected_files(root / ds.name, ds) or ())
        checked = f"derived, their sha256 in {FETCHED}" if ds.derived else "each checked (size, sha256)"
        say(f"{ds.name}: {n} files in {root / ds.name}, {checked}")
    remove_quietly(root / CACHE)
    return fetched


def _licence_line(ds: Dataset) -> str:
    notice = "NON-COMMERCIAL licence: research use only; " if ds.non_commercial else ""
    return f"{ds.name}: {notice}licence {ds.licence}; from {origin(ds)}"


def _fetch_one(ds: Dataset, root: Path, mirror: str | None, say: Callable[[str], None] = print) -> None:
    if ds.download is not None:
        downloads = _remote_sources(ds, root / CACHE, root, say)
    else:
        downloads = _download_sources(ds, root / CACHE, mirror, root)
    inputs = downloads | {name: root / name for name in ds.requires}
    with tempfile.TemporaryDirectory(dir=root, prefix=f".fetch-{ds.name}-") as tmp:
        out = Path(tmp)
        try:
            CONVERTERS[ds.converter](inputs, out, ds)
        except UNREADABLE as e:
            raise _unreadable(ds, inputs, e, root, mirror) from None
        if ds.derived:
            write_fetched(out, [p for p in out.iterdir() if p.is_file()])
        problems = dataset_problems(out, ds)
        if problems:
            for path in _downloaded(inputs, ds).values():  # a corrupt download must not be reused
                _discard(ds, path, root / CACHE)
            raise ChecksumMismatch(
                f"dataset {ds.name}: the derived files do not match the manifest ("
                f"{'; '.join(problems)}); nothing was placed in {root / ds.name}",
                key="dataset",
                value=ds.name,
            )
        _place(out, root / ds.name, ds)


def _downloaded(inputs: dict[str, Path], ds: Dataset) -> dict[str, Path]:
    return {name: path for name, path in inputs.items() if name not in ds.requires}


def _unreadable(
    ds: Dataset, inputs: dict[str, Path], error: Exception, root: Path, mirror: str | None
) -> UnreadableDownload:
    """The downloads that cannot be read whole (when none is found so, every download, with the converter's
    error), each removed from the cache so that the next fetch downloads it again."""
    downloads = _downloaded(inputs, ds)
    problems = {name: why for name, path in downloads.items() if (why := archive_problem(path))}
    problems = problems or dict.fromkeys(downloads, describe(error))
    for name in problems:
        _discard(ds, downloads[name], root / CACHE)
    named = "; ".join(f"{name} from {_source(ds, name, mirror)} ({why})" for name, why in problems.items())
    return UnreadableDownload(
        f"dataset {ds.name}: cannot read the download {named}; it was removed from the fetch cache "
        f"({root / CACHE}), so that the next fetch downloads it again; nothing was placed in {root / ds.name}",
        key="file",
        value=", ".join(problems),
    )


def _source(ds: Dataset, name: str, mirror: str | None) -> str:
    """Where a download comes from: its URL, or the record it is a file of."""
    d = ds.download
    if d is None:
        return archive_url(ds, mirror) if name == "archive" else file_url(ds, dict(ds.sources)[name], mirror)
    if d.kind == "zenodo":
        return f"Zenodo record {d.record}, {zenodo_base()}/records/{d.record}"
    if d.kind == "hf":
        return f"the Hugging Face dataset {d.repo} at revision {d.revision}"
    return dict(d.files)[name]


def _discard(ds: Dataset, path: Path, cache: Path) -> None:
    """A bad download removed from the cache; a Hugging Face one with the whole hub cache, whose blob the next
    fetch would otherwise link again without downloading it."""
    remove_quietly(cache / "hf" if ds.download is not None and ds.download.kind == "hf" else path)


def _remote_sources(ds: Dataset, cache: Path, root: Path, say: Callable[[str], None]) -> dict[str, Path]:
    try:
        return download_inputs(ds, cache, say)
    except DownloadError as e:
        raise DownloadError(
            f"{e.message} (offline, or the source moved); {by_hand(ds, root)}",
            key=e.key,
            value=e.value,
            allowed=e.allowed,
        ) from None


def _download_sources(ds: Dataset, cache: Path, mirror: str | None, root: Path) -> dict[str, Path]:
    wanted = [
        (name, file_url(ds, path, mirror), cache / "/".join(source_location(ds, path)))
        for name, path in ds.sources
    ]
    if ds.archive:
        wanted.append(("archive", archive_url(ds, mirror), cache / ds.repo / "tar.gz" / ds.commit))
    inputs = {}
    for name, url, dest in wanted:
        try:
            inputs[name] = download(url, dest, f"{ds.name} {name}")
        except DownloadError as e:
            raise DownloadError(
                f"dataset {ds.name}: {e.message} (offline, or the source moved); {by_hand(ds, root)}",
                key="url",
                value=url,
            ) from None
    return inputs


def _place(out: Path, folder: Path, ds: Dataset) -> None:
    """Each checked file renamed into the dataset's folder (same file system: atomic per file); a derived
    dataset's FETCHED.tsv last, so that an interrupted placing never verifies."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FETCHED).unlink(missing_ok=True)
    for expected in expected_files(out, ds):
        (folder / expected.file).parent.mkdir(parents=True, exist_ok=True)  # a dataset of nested folders
        os.replace(out / expected.file, folder / expected.file)
    if ds.derived:
        os.replace(out / FETCHED, folder / FETCHED)
