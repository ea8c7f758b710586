"""Downloaded archives read whole and strictly, and what makes one unreadable.

zipfile checks a member's CRC-32 when the member is read whole; tarfile's own gzip reader checks neither the gzip
trailer (CRC-32, length) nor that the stream was not cut short between two members (it reads a truncated archive
as a shorter one). `gzip_tar` reads a .tar.gz through the gzip module to the end of its stream, so that a
truncated or corrupted archive raises instead of converting into fewer documents. UNREADABLE are the errors an
unreadable zip, tar or gzip stream raises, and a member that is not the UTF-8 text its converter reads (a `.ann`
in another encoding: UnicodeDecodeError, whichever converter decodes it); `archive_problem` says which download
raises one: `ablate data fetch` turns them into exit 2 naming the dataset, the download and its source
(ablate.data.fetch).

May import: nothing of ablate.
"""

from __future__ import annotations

import gzip
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHUNK = 1 << 20
ZIP_MAGIC, GZIP_MAGIC = b"PK", b"\x1f\x8b"
# what a truncated or corrupted zip, tar or gzip stream raises (BadGzipFile is an OSError: named, not OSError),
# and a member decoded as UTF-8 that is not
UNREADABLE = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    tarfile.TarError,
    gzip.BadGzipFile,
    EOFError,
    zlib.error,
    UnicodeDecodeError,
)


@contextmanager
def gzip_tar(path: Path) -> Iterator[tarfile.TarFile]:
    """A .tar.gz opened to be read in order (tarfile "r|") through the gzip module; when the block ends normally,
    the rest of the stream is read as well, so that the gzip trailer's CRC-32 and length are checked."""
    with gzip.open(path, "rb") as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        yield tar
        while stream.read(CHUNK):
            pass


def describe(error: BaseException) -> str:
    if isinstance(error, UnicodeDecodeError):
        return f"a member that is not UTF-8 text (UnicodeDecodeError: {error})"
    return f"{type(error).__name__}: {error}"


def archive_problem(path: Path) -> str | None:
    """Why the zip or gzip file at `path` cannot be read whole (each zip member against its CRC-32, a gzip
    stream to its trailer); None when it can, or when it is neither."""
    with open(path, "rb") as f:
        magic = f.read(len(ZIP_MAGIC))
    try:
        if magic == ZIP_MAGIC:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
            return None if bad is None else f"BadZipFile: Bad CRC-32 for file {bad!r}"
        if magic == GZIP_MAGIC:
            with gzip.open(path, "rb") as stream:
                while stream.read(CHUNK):
                    pass
    except UNREADABLE as e:
        return describe(e)
    return None
