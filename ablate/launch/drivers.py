"""Who else is on a run or a sweep: another driver (`ablate sweep` / `ablate tune` process), or a job.

Two drivers of one sweep (two terminals, or a re-run while the first still watches) must not both submit a
run. A driver that queues a run writes itself into its status (`pending` / `submitted`, field `driver`: host
and pid), and every check-then-write of a run's state is made under the run's claim lock (`.claim.lock`):
when queueing it, and again right before its job is submitted. A run finished, running, or queued by another
live driver since this driver decided to run it is dropped, saying so. The sweep folder's drivers.json lists
the drivers that watch it, so that each says what the other is doing.

May import: store.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator

from ablate.store import atomic, rundir
from ablate.store.lock import FileLock

DRIVERS_FILE = "drivers.json"
KEEP_ENDED = 20  # ended drivers kept in drivers.json for the ones still watching to report
HELD = "held elsewhere"  # the final state of an unfinished run another live driver, worker or job holds


def me() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def is_me(driver: dict) -> bool:
    return {k: driver.get(k) for k in ("host", "pid")} == me()


def alive(driver: dict) -> bool:
    """Is this driver's process alive? One on another host counts as alive: this host cannot tell."""
    if driver.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(driver["pid"]), 0)
    except PermissionError:
        return True
    except (OSError, KeyError, TypeError, ValueError):
        return False
    return True


def describe(driver: dict) -> str:
    return f"pid {driver.get('pid')} on {driver.get('host')}"


def job_alive(status: dict) -> bool:
    """Is the job that a 'submitted' status names still queued or running?"""
    job_id, executor = status.get("job_id"), status.get("executor")
    if not job_id:
        return False
    if executor == "slurm":
        try:
            out = subprocess.run(
                ["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return True  # cannot tell: do not risk a second copy
        return bool(out.stdout.strip())
    if executor == "local":
        return alive({"host": socket.gethostname(), "pid": job_id})
    return False


def owned_elsewhere(status: dict) -> dict | None:
    """The other live driver that has this run queued or submitted, if any."""
    driver = status.get("driver")
    if (
        status.get("state") in ("pending", "submitted")
        and isinstance(driver, dict)
        and not is_me(driver)
        and alive(driver)
    ):
        return driver
    return None


@contextlib.contextmanager
def claimed(run_dirs: list[Path]) -> Iterator[None]:
    """The claim locks of these run folders, held together (in a fixed order: two drivers never deadlock)."""
    with contextlib.ExitStack() as stack:
        for run_dir in sorted(run_dirs):
            lock = FileLock(Path(run_dir) / ".claim.lock")
            lock.acquire(wait_s=None)
            stack.callback(lock.release)
        yield


def taken(run_dir: Path) -> str | None:
    """Why this driver must not queue or submit the run now (the caller holds its claim), or None."""
    try:
        status = rundir.read_status(run_dir)
    except rundir.CorruptStatus:
        return None  # classify set it aside; a corrupt file read now is a worker's, which holds the run lock
    state = rundir.effective_state(run_dir, status)
    if state == "done":
        return "finished meanwhile (by another driver or job)"
    if state == "running" or rundir.RunLock(run_dir).held_elsewhere():
        return "running elsewhere"
    other = owned_elsewhere(status)
    if other:
        return f"{state} by another driver ({describe(other)})"
    if state == "submitted" and job_alive(status) and not is_me(status.get("driver") or {}):
        return f"its job {status.get('job_id')} is queued or running"
    return None


def still_free(run_dirs: list[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The runs no other driver or job has taken since this driver decided to run them (the caller holds their
    claims), and the others with why."""
    free, gone = [], []
    for run_dir in map(Path, run_dirs):
        why = taken(run_dir)
        if why:
            gone.append((run_dir, why))
        else:
            free.append(run_dir)
    return free, gone


def decided(decisions: dict[str, str]) -> str:
    """What a driver decided for its runs (scheduler.classify's words), as it says it and drivers.json keeps it."""
    n = {
        d: sum(1 for x in decisions.values() if x == d)
        for d in ("submit", "skip-done", "skip-failed", "skip-active")
    }
    return (
        f"to run {n['submit']}; already done {n['skip-done']}; failed (not retried; --retry-failed) "
        f"{n['skip-failed']}; queued or running elsewhere {n['skip-active']}"
    )


def holder(run_dir: Path) -> str | None:
    """Who else holds this unfinished run (another live driver, a worker, a job), None when nobody does or the
    run is done or failed."""
    try:
        if rundir.effective_state(run_dir) in ("done", "failed"):
            return None
    except rundir.CorruptStatus:
        return None
    return taken(run_dir)


def final_states(run_dirs: dict[str, Path], out: Callable[[str], None]) -> dict[str, list[str]]:
    """Run ids by state when this driver is through; the unfinished runs another driver, worker or job holds
    under HELD, each holder named on `out`."""
    by_state: dict[str, list[str]] = {}
    holders: dict[str, list[str]] = {}
    for run_id, run_dir in run_dirs.items():
        why = holder(run_dir)
        if why:
            holders.setdefault(why, []).append(run_id)
        by_state.setdefault(HELD if why else rundir.effective_state(run_dir), []).append(run_id)
    for why, ids in holders.items():
        out(f"left to others: {len(ids)} run{'s' if len(ids) != 1 else ''} {why}: {', '.join(ids)}")
    return by_state


def wait_released(run_dirs: list[Path], poll_s: float, out: Callable[[str], None]) -> None:
    """Until no other driver, worker or job holds any of these runs: each is done, failed, or left unfinished by
    a holder that ended."""
    out(f"waiting for the {len(run_dirs)} runs held elsewhere to end (--wait; a check every {poll_s:g} s)")
    while any(holder(run_dir) for run_dir in run_dirs):
        time.sleep(poll_s)


class Watch:
    """This driver's entry in the sweep's drivers.json: says which other drivers watch the sweep when it
    starts, and (at `poll`) any that started since, with what they did if they have ended."""

    def __init__(self, sweep_dir: Path, out: Callable[[str], None]):
        self.path, self.out = Path(sweep_dir) / DRIVERS_FILE, out
        self.lock = FileLock(Path(sweep_dir) / ".drivers.lock")
        self.did = "it ended before deciding what to run"  # the driver sets what it decided
        entries = self._update(lambda mine: [{**me(), "started": time.time()}])
        self.seen = {_key(d) for d in entries}
        for d in entries:
            if not d.get("ended") and not is_me(d) and alive(d):
                out(
                    f"another driver ({describe(d)}) is watching this sweep since {_clock(d['started'])}: the runs "
                    "it has queued or started are left to it; this driver submits only what no driver has taken"
                )

    def poll(self) -> None:
        for d in self._read():
            if _key(d) in self.seen or is_me(d):
                continue
            self.seen.add(_key(d))
            if d.get("ended"):
                self.out(
                    f"another driver ({describe(d)}) looked at this sweep from {_clock(d['started'])} to "
                    f"{_clock(d['ended'])}: {d.get('did', '')}"
                )
            else:
                self.out(
                    f"another driver ({describe(d)}) started on this sweep at {_clock(d['started'])}: the "
                    "runs this driver has queued or started are left to this driver"
                )

    def close(self) -> None:
        """Mark this driver ended, with what it did (kept for the drivers still watching to report)."""
        self._update(lambda mine: [{**d, "ended": time.time(), "did": self.did} for d in mine])

    def _read(self) -> list[dict]:
        try:
            return [d for d in rundir.read_json(self.path).get("drivers", []) if _entry(d)]
        except (OSError, ValueError, AttributeError, TypeError):  # unreadable: no other driver is known
            return []

    def _update(self, change: Callable[[list[dict]], list[dict]]) -> list[dict]:
        """Rewrite drivers.json under its lock: dead drivers dropped, the ended kept (the last KEEP_ENDED), this
        driver's entries replaced by change(them). Returns the entries found before."""
        self.lock.acquire(wait_s=None)
        try:
            found = self._read()
            live = [d for d in found if not is_me(d) and not d.get("ended") and alive(d)]
            ended = [d for d in found if not is_me(d) and d.get("ended")][-KEEP_ENDED:]
            atomic.write_json(self.path, {"drivers": ended + live + change([d for d in found if is_me(d)])})
        finally:
            self.lock.release()
        return found


def _entry(d) -> bool:
    """An entry as a driver writes it (host, a pid, when it started, when it ended if it did); others are left
    out, never computed with."""
    return (
        isinstance(d, dict)
        and isinstance(d.get("host"), str)
        and type(d.get("pid")) is int
        and all(isinstance(d.get(k), (int, float)) for k in ("started", "ended") if d.get(k) is not None)
        and isinstance(d.get("started"), (int, float))
    )


def _key(driver: dict) -> tuple:
    return driver.get("host"), driver.get("pid"), driver.get("started")


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
