"""Sources that are not a GitHub repository at a commit (a catalog entry's `download:` block), each file
downloaded into the fetch cache and checked before any converter reads it:

- `url`: plain HTTPS files; a file with a `sha256` in the catalog must have it, an unpinned one has the sha256
  it got printed so that it can be pinned;
- `zenodo`: the files of a record, as its API lists them (`GET {ZENODO}/api/records/{id}`: files[].key,
  files[].checksum "md5:...", files[].links.self), each checked against the record's md5; $ABLATE_ZENODO_URL
  replaces https://zenodo.org (a mirror, a test's server);
- `hf`: files of a Hugging Face dataset repository at a pinned revision (huggingface_hub.hf_hub_download;
  $HF_ENDPOINT for a mirror).

A file whose checksum differs is removed from the cache and refused (ChecksumMismatch, exit 2, naming it).

May import: config, data.catalog, data.download.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ablate.config.errors import SpecError
from ablate.data.catalog import HASH_BLOCK, Dataset, sha256_of
from ablate.data.download import TIMEOUT_S, DownloadError, download, remove_quietly

ZENODO = "https://zenodo.org"
ZENODO_ENV = "ABLATE_ZENODO_URL"
HF_ENDPOINT_ENV = "HF_ENDPOINT"


class ChecksumMismatch(SpecError):
    """A download or a derived file is not what it must be: nothing was placed."""


def zenodo_base() -> str:
    return (os.environ.get(ZENODO_ENV) or ZENODO).rstrip("/")


def download_inputs(ds: Dataset, cache: Path, say: Callable[[str], None] = print) -> dict[str, Path]:
    """Input name -> checked local file, for a dataset with a `download:` block."""
    d = ds.download
    if d.kind == "url":
        got = {name: download(url, cache / "url" / ds.name / name, f"{ds.name} {name}") for name, url in d.files}
        checks = {}
    elif d.kind == "zenodo":
        got, checks = _zenodo(ds, cache / "zenodo" / d.record)
    else:
        got, checks = _hf(ds, cache / "hf"), {}
    for name, path in got.items():  # hf keeps a blob behind each link: a bad one goes with the whole cache
        _check(ds, name, path, checks.get(name), say, cache / "hf" if d.kind == "hf" else path)
    return got


def _check(ds: Dataset, name: str, path: Path, md5: str | None, say: Callable[[str], None], discard: Path) -> None:
    problems = []
    if md5 is not None and (got := md5_of(path)) != md5:
        problems.append(f"md5 {got}, the record lists {md5}")
    pinned = ds.download.pinned_sha256(name)
    digest = sha256_of(path)
    if pinned is not None and digest != pinned:
        problems.append(f"sha256 {digest}, the catalog pins {pinned}")
    if problems:
        remove_quietly(discard)  # a corrupt download must not be reused
        raise ChecksumMismatch(
            f"dataset {ds.name}: the download {name} is not the published file "
            f"({'; '.join(problems)}); nothing was placed",
            key="file",
            value=name,
        )
    if pinned is None:
        say(f"{ds.name}: {name} unpinned in ablate/data/catalog.yaml; got sha256 {digest}")


def md5_of(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def _zenodo(ds: Dataset, cache: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """The record's listed files the catalog names, downloaded; and their md5 as the record lists them."""
    url = f"{zenodo_base()}/api/records/{ds.download.record}"
    listed = {f.get("key"): f for f in _json(url).get("files") or []}
    got, md5s = {}, {}
    for name, _ in ds.download.files:
        entry = listed.get(name)
        if entry is None:
            raise DownloadError(
                f"dataset {ds.name}: Zenodo record {ds.download.record} lists no file {name}",
                key="file",
                value=name,
                allowed=", ".join(sorted(map(str, listed))) or "(none)",
            )
        algorithm, _, md5 = str(entry.get("checksum") or "").partition(":")
        links = entry.get("links") or {}
        file_url = links.get("self") or links.get("content") or links.get("download")
        if algorithm != "md5" or not md5 or not file_url:
            raise DownloadError(
                f"dataset {ds.name}: the record's entry for {name} has no md5 checksum or no links.self",
                key="url",
                value=url,
            )
        got[name] = download(file_url, cache / name, f"{ds.name} {name}")
        md5s[name] = md5.lower()
    return got, md5s


def _json(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        raise DownloadError(f"HTTP {e.code} {e.reason}", key="url", value=url) from None
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(f"cannot download ({getattr(e, 'reason', e)})", key="url", value=url) from None
    except ValueError:
        raise DownloadError("not a Zenodo record (the answer is not JSON)", key="url", value=url) from None


def _hf(ds: Dataset, cache: Path) -> dict[str, Path]:
    from huggingface_hub import hf_hub_download

    d = ds.download
    endpoint = os.environ.get(HF_ENDPOINT_ENV) or None
    got = {}
    for name, _ in d.files:
        try:
            got[name] = Path(
                hf_hub_download(
                    d.repo, name, repo_type="dataset", revision=d.revision, cache_dir=cache, endpoint=endpoint
                )
            )
        except Exception as e:  # huggingface_hub's errors: offline, not found, gated, a bad endpoint
            where = endpoint or "https://huggingface.co"
            raise DownloadError(
                f"cannot download {name} from the Hugging Face dataset {d.repo} at revision "
                f"{d.revision} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                key="url",
                value=where,
            ) from None
    return got
