"""`ablate ARGS` and `python SCRIPT ARGS` called inside the test's process: the exit code, stdout and stderr a
subprocess gives, without its seconds of imports (torch, transformers). For tests where the process boundary is not
what they test; a test of kill -9, of two processes at once or of `python -m ablate.cli` itself keeps its
subprocess."""

from __future__ import annotations

import io
import os
import runpy
import sys
import tempfile
from contextlib import contextmanager, redirect_stderr, redirect_stdout
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

    with _process_state(cwd, env) as (out, err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 1
    return Done(code, out.getvalue(), err.getvalue())


def script(path: Path, args: list, cwd: Path | None = None, env: dict | None = None) -> Done:
    """Run `python path *args` as __main__, its folder first on sys.path as Python puts it; what a script may set
    for its own process (sys.argv and sys.path, the environment, the temporary folder, the working folder,
    torch's thread count and random state) is restored after. `sys.exit(msg)` is exit code 1 with msg on stderr,
    as in a subprocess; any other exception propagates, with its traceback, to the test."""
    import torch

    argv, path_entries, temp = list(sys.argv), list(sys.path), tempfile.tempdir
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    code = 0
    with _process_state(cwd, env) as (out, err):
        try:
            tempfile.tempdir = None  # read again from the environment (TMPDIR), as a new process would
            sys.argv = [str(path), *(str(a) for a in args)]
            sys.path.insert(0, str(Path(path).parent))
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as exc:
            if isinstance(exc.code, int) or exc.code is None:
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        finally:
            sys.argv, sys.path[:], tempfile.tempdir = argv, path_entries, temp
            torch.set_num_threads(threads)
            torch.random.set_rng_state(rng)
    return Done(code, out.getvalue(), err.getvalue())


@contextmanager
def _process_state(cwd: Path | None, env: dict | None):
    """Within: env added to os.environ, cwd as the working folder, stdout and stderr captured (yielded)."""
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    try:
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        if cwd is not None:
            os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            yield out, err
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
