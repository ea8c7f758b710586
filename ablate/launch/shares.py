"""The ranks of a data-parallel run share its fine-tunings: after pretraining, each rank fine-tunes its share
of the (task, seed) units (evaluate.score_files.units_of: every world-th unit from its rank), each unit's score
file written by the rank that computed it. The ranks then wait for each other in a gloo group of their own
(train.distributed.finishing_group); rank 0 reads every unit back, fine-tunes any a rank left missing (one
that died), and only then may the run be marked done. A score is the same whichever rank computes it, so the
scores equal one process's.

Each process's units share its GPUs (evaluate.unit_processes): `eval.units_per_gpu` of them at once on each
GPU, each a process of its own, over every GPU the process sees (a rank: its own; launch.gpus.process_devices).
`auto` (the default) fits each task's units by its predicted peak (predict.finetune_memory, the longest batch)
into the memory the device has free, AUTO_MARGIN of it kept, and at most as many processes per GPU as the
job has CPU cores per GPU (each process feeds its GPU from a core); a task the trace cannot size runs alone.
On a machine without GPU auto is 1: one unit after another in this process, as before; a number there runs
that many processes on the CPU.

May import: config, evaluate, predict, train, launch.gpus.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ablate.config.spec import RunSpec
from ablate.evaluate.runs import evaluate_run
from ablate.evaluate.unit_processes import Placement
from ablate.predict.finetune_memory import finetune_shapes, finetune_step_memory, units_at_once
from ablate.predict.gpu_memory import AUTO_MARGIN, gib
from ablate.launch.gpus import process_devices
from ablate.train.distributed import finishing_group, init as init_distributed, wait_for_ranks, world_from_env
from ablate.config.device import pick_device


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
    """Fine-tune this rank's share of the run's units, several at once where they fit its GPUs; on rank 0
    (and alone), return every unit's rows once all ranks are done, [] on the others."""
    device = str(pick_device(spec.device, team.local_rank))
    place = placer(spec, process_devices(device, team.world_size), log)
    if team.finishing is None:
        return evaluate_run(run_dir, spec, log=log, progress=progress, device=device, place=place)
    share = (team.rank, team.world_size)
    evaluate_run(run_dir, spec, log=log, progress=progress, share=share, device=device, place=place)
    missing = wait_for_ranks(team.finishing)
    if team.rank != 0:
        return []
    if missing:
        log(f"a rank did not finish its share of the fine-tunings ({missing}): what it left is fine-tuned here")
    log(f"the scores of all {team.world_size} ranks' shares:")
    return evaluate_run(run_dir, spec, log=log, progress=progress, device=device, place=place)


def run_placer(log: Callable[[str], None]) -> Callable[[RunSpec], Callable[[list[str]], Placement]]:
    """`ablate evaluate`'s placement, per finished run: its units share the GPUs this process sees as its job's
    did (the run's eval.units_per_gpu; on the CPU auto is one after another, here)."""
    return lambda spec: placer(spec, process_devices(str(pick_device(spec.device))), log)


def placer(
    spec: RunSpec, devices: tuple[str, ...], log: Callable[[str], None]
) -> Callable[[list[str]], Placement]:
    """What evaluate_run asks once it knows the tasks with units left: where they run and how many at once."""

    def place(tasks: list[str]) -> Placement:
        wanted = spec.eval.units_per_gpu
        if wanted != "auto":
            return Placement(devices, {task: wanted for task in tasks})
        if not devices[0].startswith("cuda"):
            return Placement(devices)  # auto on the CPU: one after another, in this process
        return Placement(devices, _auto_at_once(spec, tasks, devices, log))

    return place


def _auto_at_once(spec: RunSpec, tasks: list[str], devices: tuple[str, ...], log) -> dict[str, int]:
    """Each task's units at once on one of `devices`: its predicted peak into the least free memory of them."""
    import torch

    torch.cuda.empty_cache()  # what pretraining left cached here is free for the units
    free, total = min(torch.cuda.mem_get_info(torch.device(d)) for d in devices)
    cores = max(1, len(os.sched_getaffinity(0)) // len(devices))
    peaks = _predicted_peaks(spec, tasks, log)
    at_once = auto_at_once(peaks, free, total, cores)
    log(
        f"units per GPU (eval.units_per_gpu: auto): {gib(free)} of {gib(total)} GiB free, "
        f"{AUTO_MARGIN:.0%} kept, at most {cores} per GPU (CPU cores); "
        + ", ".join(
            f"{task} {at_once[task]}"
            + (f" ({gib(peaks[task])} GiB each)" if peaks.get(task) else " (not predicted)")
            for task in tasks
        )
    )
    return at_once


def auto_at_once(peaks: dict[str, int | None], free: int, total: int, cores: int) -> dict[str, int]:
    """Each task's units at once on a device of `total` bytes with `free` of them free: as many as its
    predicted peak fits with AUTO_MARGIN of the device kept (finetune_memory.units_at_once), at most `cores`;
    1 for a task without a prediction."""
    return {
        task: 1 if peak is None else units_at_once(total, peak, cores, in_use=total - free)
        for task, peak in peaks.items()
    }


def _predicted_peaks(spec: RunSpec, tasks: list[str], log) -> dict[str, int | None]:
    """Each task's predicted fine-tuning peak (predict.finetune_memory; None: not traced, or the trace failed,
    said in the log: the task's units then run alone)."""
    peaks: dict[str, int | None] = dict.fromkeys(tasks)
    for shape in finetune_shapes(spec):
        if shape.task not in peaks:
            continue
        try:
            memory = finetune_step_memory(shape).memory
        except Exception as exc:  # noqa: BLE001  (the plan is a courtesy: the units still run, alone)
            log(f"{shape.task}: no memory prediction ({type(exc).__name__}: {exc}); its units run alone")
            continue
        peaks[shape.task] = None if memory is None else memory.predicted
    return peaks
