"""A dataset's source files from its public repository at the pinned commit, over HTTP(S) with urllib: one file
(raw.githubusercontent.com) or the repository's archive (codeload.github.com). Each download goes to a
`.part` file that is renamed into place only once every byte the server announced has arrived, so a
completed download is kept (and skipped next time) and an interrupted one never looks complete.

A mirror (--mirror or $ABLATE_DATA_MIRROR) replaces both hosts and keeps their layout:
<mirror>/<owner>/<repo>/<commit>/<path> and <mirror>/<owner>/<repo>/tar.gz/<commit>.

May import: config, data.catalog.
"""

from __future__ import annotations

import http.client
import os
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from ablate.config.errors import SpecError
from ablate.data.catalog import Dataset, source_location

RAW_HOST = "https://raw.githubusercontent.com"
ARCHIVE_HOST = "https://codeload.github.com"
MIRROR_ENV = "ABLATE_DATA_MIRROR"
TIMEOUT_S = 60
CHUNK = 1 << 20


class DownloadError(SpecError):
    """A source could not be downloaded whole (offline, moved, truncated): exit 2 naming the URL."""


def mirror_of(explicit: str | None = None) -> str | None:
    value = explicit or os.environ.get(MIRROR_ENV)
    return value.rstrip("/") if value else None


def file_url(ds: Dataset, path: str, mirror: str | None = None) -> str:
    repo, commit, path = source_location(ds, path)
    return f"{mirror or RAW_HOST}/{repo}/{commit}/{path}"


def archive_url(ds: Dataset, mirror: str | None = None) -> str:
    return f"{mirror or ARCHIVE_HOST}/{ds.repo}/tar.gz/{ds.commit}"


def download(url: str, dest: Path, label: str) -> Path:
    """url -> dest, unless dest is already there (a completed earlier download). Progress on stderr."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f"{dest.name}.part-{os.getpid()}")
    try:
        _copy_response(url, part, label)
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    return dest


def _copy_response(url: str, part: Path, label: str) -> None:
    from tqdm import tqdm

    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(part, "wb") as out:
            announced = response.headers.get("Content-Length")
            total = int(announced) if announced else None
            with tqdm(
                total=total, unit="B", unit_scale=True, desc=label, file=sys.stderr, leave=False, disable=None
            ) as bar:
                got = 0
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as e:
        raise DownloadError(f"HTTP {e.code} {e.reason}", value=url) from None
    except http.client.IncompleteRead as e:
        raise DownloadError(
            f"truncated download: {len(e.partial):,} more bytes arrived, "
            f"{e.expected:,} were missing when the connection closed",
            value=url,
        ) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise DownloadError(f"cannot download ({getattr(e, 'reason', e)})", value=url) from None
    if total is not None and got != total:
        raise DownloadError(f"truncated download: {got:,} of {total:,} bytes", value=url)


def remove_quietly(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
