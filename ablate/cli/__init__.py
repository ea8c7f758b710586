"""The `ablate` command: parse (parser), call (commands), print.

Exit codes: 0 ok; 1 some runs failed, or records could not be read; 2 bad input (the message names the file,
key, value and what is allowed; nothing was submitted); 130 interrupted.

May import: every stage.
"""

from __future__ import annotations

import sys

from ablate.cli.commands import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED
from ablate.config import faults
from ablate.config.errors import SpecError
from ablate.config.paths import absolute_env_paths


def main(argv: list[str] | None = None) -> int:
    from ablate.cli.parser import build_parser
    from ablate.store.rundir import AlreadyRunning

    absolute_env_paths()
    args = build_parser().parse_args(argv)
    try:
        faults.check()
        return args.func(args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except AlreadyRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(
            "interrupted: run folders keep their checkpoints; run the same command again to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
