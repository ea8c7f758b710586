"""Fault injection: the one place ablate reads the settings that make a child process fail or wait at a chosen
point, for the tests that must land a kill, a requeue or an out-of-memory exactly there (a child process cannot
be monkeypatched, so its environment carries the request).

- `ABLATE_PAUSE_AT=STEP:FILE`: a run holds right after its checkpoint at global step STEP until FILE exists (at
  most PAUSE_LIMIT_S seconds); a run resumed past STEP does not stop there again (ablate.launch.pause).
- `ABLATE_OOM_UNIT=TASK:SEED`: that fine-tuning unit's first process raises CUDA out of memory
  (ablate.evaluate.unit_processes).
- `ABLATE_PREPARE_DIE_AFTER_SHARDS=N`: corpus preparation kills itself (SIGKILL) once N shards are written
  (ablate.data.prepare).

Each is off unless its variable is set. A set value that does not read is a SpecError naming the variable, the
value and the form allowed (exit 2: `ablate` checks them all before it does anything), so a mistyped request
fails at once instead of never firing.

May import: config.errors.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ablate.config.errors import SpecError

PAUSE_AT = "ABLATE_PAUSE_AT"
OOM_UNIT = "ABLATE_OOM_UNIT"
DIE_AFTER_SHARDS = "ABLATE_PREPARE_DIE_AFTER_SHARDS"
PAUSE_LIMIT_S = 300.0


@dataclass(frozen=True)
class Pause:
    step: int
    release: str  # the file whose existence releases the run


def _read(name: str, form: str, pattern: str) -> re.Match | None:
    value = os.environ.get(name, "")
    if not value:
        return None
    found = re.fullmatch(pattern, value)
    if not found:
        raise SpecError("a fault-injection setting does not read", key=name, value=value, allowed=form)
    return found


def pause_at() -> Pause | None:
    found = _read(PAUSE_AT, "STEP:FILE (a step >= 0 and a file path)", r"(\d+):(.+)")
    return Pause(int(found.group(1)), found.group(2)) if found else None


def oom_unit() -> tuple[str, int] | None:
    """(task, seed) of the unit whose first process runs out of memory."""
    found = _read(OOM_UNIT, "TASK:SEED (a task name and a seed >= 0)", r"([^:\s]+):(\d+)")
    return (found.group(1), int(found.group(2))) if found else None


def die_after_shards() -> int | None:
    found = _read(DIE_AFTER_SHARDS, "N (a number of shards >= 1)", r"0*[1-9]\d*")
    return int(found.group(0)) if found else None


def check() -> None:
    """Read every setting, so a bad one fails before anything runs."""
    pause_at(), oom_unit(), die_after_shards()
