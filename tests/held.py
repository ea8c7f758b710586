"""A process held at a checkpoint (ABLATE_PAUSE_AT, ablate.launch.pause), for the tests that kill it there or start
a second process beside it."""

from __future__ import annotations

import subprocess


def start_held(cmd: list, env: dict) -> tuple[subprocess.Popen, list[str]]:
    """Start `cmd` (an `ablate run`, a worker or a sweep, with ABLATE_PAUSE_AT in `env`) and return once it says
    it holds after its checkpoint: the process and the lines it printed so far. Reading its output blocks until
    then: no polling, no race."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "holding after" in line:
            break
    assert "holding after" in seen[-1], "".join(seen)
    return proc, seen
