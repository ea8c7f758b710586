"""`ablate ARGS` called inside the test's process: the exit code, stdout and stderr a subprocess gives, without its
seconds of imports (torch, transformers). For tests where the process boundary is not what they test; a test of
kill -9, of two processes at once or of `python -m ablate.cli` itself keeps its subprocess."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Done:
    """What subprocess.run(..., capture_output=True, text=True) gives, for the tests that read it."""

    returncode: int
    stdout: str
    stderr: str


def ablate(args: list, cwd: Path | None = None, env: dict | None = None) -> Done:
    """Run `ablate *args` from cwd with env added to the environment; both are restored after."""
    from ablate.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    try:
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        if cwd is not None:
            os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return Done(code, out.getvalue(), err.getvalue())
