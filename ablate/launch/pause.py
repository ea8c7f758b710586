"""A run held right after one of its checkpoints, on request (`ABLATE_PAUSE_AT=STEP:FILE`, read by
ablate.config.faults): how the tests make a preemption, a requeue or a kill land mid-run for certain.

The run holds right after the checkpoint at global step STEP until FILE exists (at most PAUSE_LIMIT_S); a run
resumed past STEP does not stop there again. The worker hands `hold_if_asked` to the training loop as its
after-checkpoint callback; the loop itself knows nothing of it.

May import: config.faults.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from ablate.config.faults import PAUSE_AT, PAUSE_LIMIT_S, pause_at


def hold_if_asked(global_step: int, log: Callable[[str], None]) -> None:
    """Wait at `global_step` until the file named by ABLATE_PAUSE_AT exists, when it names this step."""
    pause = pause_at()
    if pause is None or pause.step != global_step:
        return
    log(f"holding after the checkpoint at step {global_step} until {pause.release} exists ({PAUSE_AT})")
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not os.path.exists(pause.release) and time.monotonic() < deadline:
        time.sleep(0.2)
