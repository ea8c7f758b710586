"""A run held right after one of its checkpoints, on request: how the tests make a preemption, a requeue or
a kill land mid-run for certain.

`ABLATE_PAUSE_AT=STEP:FILE` in a worker's environment holds its run right after the checkpoint at global
step STEP until FILE exists (at most PAUSE_LIMIT_S); a run resumed past STEP does not stop there again. The
worker hands `hold_if_asked` to the training loop as its after-checkpoint callback; the loop itself knows
nothing of it.

May import: nothing from ablate.
"""

from __future__ import annotations

import os
import time
from typing import Callable

PAUSE_ENV = "ABLATE_PAUSE_AT"  # STEP:FILE
PAUSE_LIMIT_S = 300.0


def hold_if_asked(global_step: int, log: Callable[[str], None]) -> None:
    """Wait at `global_step` until the file named by ABLATE_PAUSE_AT exists, when it names this step."""
    step, _, path = os.environ.get(PAUSE_ENV, "").partition(":")
    if not step.isdigit() or int(step) != global_step:
        return
    log(f"holding after the checkpoint at step {global_step} until {path} exists ({PAUSE_ENV})")
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.2)
