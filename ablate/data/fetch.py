"""`ablate data fetch`: datasets from their public sources into the data root, checked against the manifest.

Per dataset (the datasets it requires first): skipped when its files already match the manifest; else its
licence is printed (a non-commercial one said so first), its sources downloaded (kept in <root>/.fetch-cache
until every dataset of the command is in place, so an interrupted fetch resumes), its converter writes the
shipped files into a temporary folder beside the data root, every file is checked (size, sha256), and only
then are the files renamed into <root>/<dataset>/. A failure at any point leaves the data root as it was.

May import: config, data.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from ablate.config.errors import SpecError
from ablate.data.catalog import Dataset, dataset_problems, source_location, with_requirements
from ablate.data.converters import CONVERTERS
from ablate.data.download import DownloadError, archive_url, download, file_url, remove_quietly

CACHE = ".fetch-cache"
DOCS = "docs/data.md"


class ChecksumMismatch(SpecError):
    """What a converter wrote is not what the manifest records: nothing was placed."""


def by_hand(ds: Dataset, root: Path) -> str:
    """How to supply a dataset without this command."""
    return (f"to supply it by hand, build the files of {ds.name} as its SOURCE notes say ({DOCS}; from "
            f"{ds.repo} at {ds.commit}) into {root / ds.name}/ and check them with `ablate data verify {ds.name}`; "
            "a task can also read a `datasets` folder saved with save_to_disk or a hub dataset (format: hf in its "
            "task file), and a corpus any file, folder or hf: name (data.corpus)")


def fetch_datasets(datasets: list[Dataset], root: Path, mirror: str | None = None,
                   say: Callable[[str], None] = print) -> list[str]:
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
            raise SpecError(f"dataset {ds.name}: no converter yet for its derivation; {by_hand(ds, root)}",
                            key="dataset", value=ds.name)
        _fetch_one(ds, root, mirror)
        fetched.append(ds.name)
        say(f"{ds.name}: {len(ds.files)} files in {root / ds.name}, each checked (size, sha256)")
    remove_quietly(root / CACHE)
    return fetched


def _licence_line(ds: Dataset) -> str:
    notice = "NON-COMMERCIAL licence: research use only; " if ds.non_commercial else ""
    return f"{ds.name}: {notice}licence {ds.licence}; from {ds.repo} at {ds.commit[:12]}"


def _fetch_one(ds: Dataset, root: Path, mirror: str | None) -> None:
    inputs = _download_sources(ds, root / CACHE, mirror, root) | {name: root / name for name in ds.requires}
    with tempfile.TemporaryDirectory(dir=root, prefix=f".fetch-{ds.name}-") as tmp:
        out = Path(tmp)
        CONVERTERS[ds.converter](inputs, out, ds)
        problems = dataset_problems(out, ds)
        if problems:
            for path in _downloaded(inputs, ds):       # a corrupt download must not be reused
                remove_quietly(path)
            raise ChecksumMismatch(f"dataset {ds.name}: the derived files do not match the manifest ("
                                   f"{'; '.join(problems)}); nothing was placed in {root / ds.name}", key="dataset",
                                   value=ds.name)
        _place(out, root / ds.name, ds)


def _downloaded(inputs: dict[str, Path], ds: Dataset) -> list[Path]:
    return [path for name, path in inputs.items() if name not in ds.requires]


def _download_sources(ds: Dataset, cache: Path, mirror: str | None, root: Path) -> dict[str, Path]:
    wanted = [(name, file_url(ds, path, mirror), cache / "/".join(source_location(ds, path)))
              for name, path in ds.sources]
    if ds.archive:
        wanted.append(("archive", archive_url(ds, mirror), cache / ds.repo / "tar.gz" / ds.commit))
    inputs = {}
    for name, url, dest in wanted:
        try:
            inputs[name] = download(url, dest, f"{ds.name} {name}")
        except DownloadError as e:
            raise DownloadError(f"dataset {ds.name}: {e.message} (offline, or the source moved); "
                                f"{by_hand(ds, root)}", key="url", value=url) from None
    return inputs


def _place(out: Path, folder: Path, ds: Dataset) -> None:
    """Each checked file renamed into the dataset's folder (same file system: atomic per file)."""
    folder.mkdir(parents=True, exist_ok=True)
    for expected in ds.files:
        os.replace(out / expected.file, folder / expected.file)


