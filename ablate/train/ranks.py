"""One rank of a data-parallel run, as torchrun or a multi-task submitit job starts it:

    python -m ablate.train.ranks SPEC_JSON RUN_DIR [STOP_AFTER] [OUT_JSON]

May import: config, train.
"""

from __future__ import annotations

import os

from ablate.config.spec import parse_run_spec
from ablate.train.distributed import world_from_env
from ablate.train.loop import pretrain


def pretrain_ranks(spec: dict, run_dir: str, stop_after_steps: int | None = None) -> dict:
    """What each task of a multi-task submitit job (or each torchrun process) calls: pretrain as one rank.
    Returns a small summary (same on every rank) so a caller can check the ranks agreed."""
    rank = world_from_env()[0]
    state = pretrain(
        parse_run_spec(spec),
        run_dir,
        log=(print if rank == 0 else (lambda _m: None)),
        stop_after_steps=stop_after_steps,
    )
    return {
        "rank": rank,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "done": state.done,
        "global_step": state.global_step,
        "token_hash": state.token_hash,
        "losses": [c["loss"] for c in state.curves],
    }


def _main() -> None:
    """python -m ablate.train.distributed SPEC_JSON RUN_DIR [STOP_AFTER] [OUT_JSON]: one rank, env set by the caller."""
    import json
    import sys

    spec = json.loads(sys.argv[1])
    stop = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "0" else None
    summary = pretrain_ranks(spec, sys.argv[2], stop)
    if len(sys.argv) > 4:
        with open(sys.argv[4], "w") as f:
            json.dump(summary, f)


if __name__ == "__main__":
    _main()
