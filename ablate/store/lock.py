"""An exclusive lock on a file, held by one process at a time (fcntl.flock): the OS drops it when the process
dies, kill -9 included. The one lock of ablate: a run folder while its worker runs, a tune study while one
`ablate tune` drives it, a corpus while it is being prepared.

May import: nothing of ablate.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path


class FileLock:
    """Looking (held_elsewhere, as `status`, `collect` and the launcher do for run folders) takes a shared
    lock for an instant and writes nothing; an acquirer that meets such a look retries for up to `wait_s`
    seconds rather than give up. `wait_s=None` waits as long as it takes. The holder's host and pid are
    written into the file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self, wait_s: float | None = 1.0) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if wait_s is None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks until the holder releases or dies
            return self._hold(fd)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
        return self._hold(fd)

    def _hold(self, fd: int) -> bool:
        os.ftruncate(fd, 0)
        os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        self.fd = fd
        return True

    def holder(self) -> str:
        """Who holds it, as written (host pid): only ever shown, never trusted (the flock decides)."""
        try:
            return self.path.read_bytes().decode("utf-8", "replace").strip()[:200]
        except OSError:
            return ""

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def held_elsewhere(self) -> bool:
        """Is another process (or another RunLock in this one) holding the lock? Never blocks, never writes."""
        if self.fd is not None:
            return False
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the shared lock, if taken
        return False
