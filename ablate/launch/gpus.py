"""Which GPUs each local job sees: on a machine with several GPUs, every run the local executor runs at once
gets GPUs of its own (its CUDA_VISIBLE_DEVICES), instead of all of them sharing one; and which GPUs a job's
fine-tunings spread over.

The GPUs to share out are the ones this process sees: CUDA_VISIBLE_DEVICES when it is set (indices, UUIDs or
MIG ids are passed on as written; set but empty: none), else torch's device count. A local run pretrains as
one process on one GPU, so `parallel` runs at once need `parallel` GPUs; asking for more than there are is an
error before anything is submitted (not a silent queue: the user wrote `parallel`). GPUs beyond one per run
are spread over the runs' sets (4 GPUs, 2 at once: two each): a run pretrains on the first of its set and its
fine-tunings spread over all of it (launch.shares), so no GPU of the machine sits idle through them. A machine
without GPUs shares nothing out, and jobs see no GPU, as before.

May import: config.
"""

from __future__ import annotations

import os

from ablate.config.errors import SpecError

GPUS_PER_LOCAL_RUN = 1  # a local run is one process, one rank (Launcher.gpus("local"))


def visible_gpus(environ: dict | None = None, device_count: int | None = None) -> tuple[str, ...]:
    """The GPUs this process may hand out, as CUDA_VISIBLE_DEVICES entries."""
    environ = os.environ if environ is None else environ
    shown = environ.get("CUDA_VISIBLE_DEVICES")
    if shown is not None:
        return tuple(part.strip() for part in shown.split(",") if part.strip())
    if device_count is None:
        import torch

        device_count = torch.cuda.device_count()
    return tuple(str(i) for i in range(device_count))


def gpu_sets(visible: tuple[str, ...], parallel: int, per_run: int = GPUS_PER_LOCAL_RUN) -> list[tuple[str, ...]]:
    """`parallel` disjoint sets of at least `per_run` GPUs covering `visible`, in order (the first sets one
    more where they do not divide evenly); [] without GPUs. SpecError when the runs at once need more GPUs
    than there are."""
    if not visible:
        return []
    if parallel * per_run > len(visible):
        raise SpecError(
            f"{parallel} local runs at once need {parallel * per_run} GPUs ({per_run} each), but this "
            f"machine shows {len(visible)} (CUDA_VISIBLE_DEVICES={','.join(visible)})",
            key="launcher.local.parallel",
            value=parallel,
            allowed=f"1..{len(visible) // per_run}, or CUDA_VISIBLE_DEVICES= (empty) to run on the CPU",
        )
    each, extra = divmod(len(visible), parallel)
    starts = [i * each + min(i, extra) for i in range(parallel + 1)]
    return [visible[starts[i] : starts[i + 1]] for i in range(parallel)]


def process_devices(device: str, ranks: int = 1, device_count: int | None = None) -> tuple[str, ...]:
    """The devices this process's fine-tunings may spread over: every GPU it sees when it is a run's only
    process on CUDA (a local job's set, a Slurm job's GPUs), its own GPU when it is one rank of several
    (the others fine-tune their shares on theirs), else `device` (the CPU)."""
    if not device.startswith("cuda") or ranks > 1:
        return (device,)
    if device_count is None:
        import torch

        device_count = torch.cuda.device_count()
    return tuple(f"cuda:{i}" for i in range(device_count)) or (device,)


def local_pool(parallel: int) -> "GpuPool":
    """The pool of the local executor's `parallel` jobs on this machine."""
    return GpuPool(gpu_sets(visible_gpus(), parallel))


class GpuPool:
    """The GPU sets of the local jobs running now: `take` one for a job, `give_back` when it ended."""

    def __init__(self, sets: list[tuple[str, ...]]):
        self.free = list(sets)
        self.held: dict[object, tuple[str, ...]] = {}

    def take(self, owner) -> tuple[str, ...] | None:
        """A free set for `owner` (None on a machine without GPUs)."""
        if not self.free and not self.held:
            return None
        if not self.free:
            raise RuntimeError("no free GPU set: more local jobs at once than launcher.local.parallel")
        self.held[owner] = self.free.pop(0)
        return self.held[owner]

    def give_back(self, owner) -> None:
        if owner in self.held:
            self.free.append(self.held.pop(owner))


def job_parameters(gpus: tuple[str, ...] | None) -> dict:
    """The local executor's parameters that give one job `gpus` (None: leave them as they are). Integer
    indices go through submitit's own visible_gpus; UUIDs or MIG ids, which it refuses, as an export in the
    job's setup line."""
    if gpus is None:
        return {}
    if all(g.isdigit() for g in gpus):
        return {"visible_gpus": tuple(int(g) for g in gpus), "gpus_per_node": len(gpus), "setup": []}
    import shlex

    return {
        "visible_gpus": (),
        "gpus_per_node": 0,
        "setup": [f"export CUDA_VISIBLE_DEVICES={shlex.quote(','.join(gpus))}"],
    }
