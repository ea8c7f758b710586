"""The ranks of a data-parallel run share its fine-tunings: after pretraining, each rank fine-tunes its share
of the (task, seed) units (evaluate.scores.units_of: every world-th unit from its rank), each unit's score
file written by the rank that computed it. The ranks then wait for each other in a gloo group of their own
(train.distributed.finishing_group); rank 0 reads every unit back, fine-tunes any a rank left missing (one
that died), and only then may the run be marked done. A score is the same whichever rank computes it, so the
scores equal one process's.

May import: config, evaluate, train.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ablate.config.spec import RunSpec
from ablate.evaluate.runs import evaluate_run
from ablate.train.distributed import finishing_group, init as init_distributed, wait_for_ranks, world_from_env
from ablate.train.loop import pick_device


@dataclass(frozen=True)
class Team:
    """The ranks of this run as the worker holds them; Team() is one process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    finishing: object = None  # the gloo group the ranks finish in (None: one process, or no eval tasks)


@contextmanager
def team_for(spec: RunSpec) -> Iterator[Team]:
    """For a run of several ranks, the process group held over pretraining (which joins it instead of forming
    its own) and fine-tuning; one process: Team()."""
    rank, world, local = world_from_env()
    if world <= 1:
        yield Team()
        return
    dist = init_distributed(pick_device(spec.device).type)
    try:
        yield Team(rank, world, local, finishing_group() if spec.eval.tasks else None)
    finally:
        dist.close()


def fine_tune_share(
    run_dir: Path,
    spec: RunSpec,
    team: Team,
    log: Callable[[str], None],
    progress: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Fine-tune this rank's share of the run's units; on rank 0 (and alone), return every unit's rows once
    all ranks are done, [] on the others."""
    device = str(pick_device(spec.device, team.local_rank))
    if team.finishing is None:
        return evaluate_run(run_dir, spec, log=log, progress=progress, device=device)
    evaluate_run(run_dir, spec, log=log, progress=progress, share=(team.rank, team.world_size), device=device)
    missing = wait_for_ranks(team.finishing)
    if team.rank != 0:
        return []
    if missing:
        log(f"a rank did not finish its share of the fine-tunings ({missing}): what it left is fine-tuned here")
    log(f"the scores of all {team.world_size} ranks' shares:")
    return evaluate_run(run_dir, spec, log=log, progress=progress, device=device)
