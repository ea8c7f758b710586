"""Atomic writes: write under a temporary name in the same folder, fsync, then rename over the target.
A reader sees the old content or the new one, never half of either, even if the writer is killed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")


def publish_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Rename a fully written folder into place (replacing an older one of the same name)."""
    for f in tmp_dir.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    if final_dir.exists():
        shutil.rmtree(final_dir)
    os.rename(tmp_dir, final_dir)
    _fsync_dir(final_dir.parent)


def link_or_copy(src: Path, dst: Path) -> None:
    """dst as src's file: a hard link where the filesystem allows (no second copy on disk), a copy elsewhere;
    put in place by one rename."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)
