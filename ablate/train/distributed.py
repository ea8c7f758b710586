"""Data parallelism for the training loop, explicit (no DDP wrapper): the process group, and the few
collectives pretrain() needs.

Every rank builds the same global batch and the same MLM masking (both depend only on seeds and the step),
takes its own contiguous slice, and after backward the gradients are all-reduced with SUM: each rank's loss
is already divided by the label count of the GLOBAL batch, so the sum is the single-process gradient.

Where the ranks come from, in order:
  RANK / WORLD_SIZE (/ LOCAL_RANK, MASTER_ADDR, MASTER_PORT)   torchrun, or a test that sets them
  a submitit job with several Slurm tasks                      submitit's TorchDistributedEnvironment
  neither                                                      one process: every function here is a no-op
A submitit job with several tasks whose environment does not say each task's rank is an error, never
"one process": one rank would train while the others die on the run lock. Its MASTER_PORT (unless set) is
derived from the Slurm job id outside the kernel's ephemeral port range (see master_port_for).
Forming the process group, and every collective after it, gives up after ABLATE_DIST_TIMEOUT_S seconds
(default 1800), so a rank whose peer died fails in bounded time instead of hanging.
Backend: nccl on CUDA, gloo otherwise.

May import: config.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as tdist

from ablate.config.device import local_device_index
from ablate.config.errors import SpecError

BUCKET_ELEMENTS = 25_000_000  # gradients are flattened into buckets of at most this many elements
TIMEOUT_ENV = "ABLATE_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0
FINISH_TIMEOUT_S = 7 * 24 * 3600.0  # how long ranks wait for each other's fine-tunings (finishing_group)
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default, when the file above cannot be read
# what a task of a multi-task submitit job needs to know its rank and its master (submitit defaults the
# missing ones to rank 0 and to this host: every task would think it is rank 0)
SLURM_TASK_VARS = ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_JOB_NODELIST")


@dataclass(frozen=True)
class Dist:
    """This process's place in the run; Dist() is the single-process case."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this module created the process group, so it tears it down

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()

    def sum_tensor(self, value: torch.Tensor) -> torch.Tensor:
        """A 0-dim tensor summed over ranks, on its device (the loss for logging: nothing read back)."""
        if not self.enabled:
            return value
        t = value.detach().reshape(1).clone()
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return t[0]

    def sum_grads(self, grads: list[torch.Tensor]) -> None:
        """In place: every gradient becomes its sum over ranks (flattened into buckets, one all-reduce each)."""
        if not self.enabled or not grads:
            return
        bucket: list[torch.Tensor] = []
        size = 0
        for g in grads:
            if bucket and (size + g.numel() > BUCKET_ELEMENTS or g.dtype != bucket[0].dtype):
                _reduce_bucket(bucket)
                bucket, size = [], 0
            bucket.append(g)
            size += g.numel()
        if bucket:
            _reduce_bucket(bucket)

    def close(self) -> None:
        if self.owns_group and tdist.is_initialized():
            tdist.destroy_process_group()


def _reduce_bucket(bucket: list[torch.Tensor]) -> None:
    if len(bucket) == 1:
        tdist.all_reduce(bucket[0], op=tdist.ReduceOp.SUM)
        return
    flat = torch.cat([g.reshape(-1) for g in bucket])
    tdist.all_reduce(flat, op=tdist.ReduceOp.SUM)
    offset = 0
    for g in bucket:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def _from_submitit() -> bool:
    """Export torch.distributed variables when running as one of several tasks of a submitit job; an
    error (naming what is missing) when such a task cannot tell its rank."""
    ntasks = int(os.environ.get("SLURM_NTASKS", "1"))
    if ntasks <= 1 or os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return False
    missing = [v for v in SLURM_TASK_VARS if not os.environ.get(v)]
    if missing:
        raise RuntimeError(
            f"this process is one of SLURM_NTASKS={ntasks} tasks of a submitit Slurm job, but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, so it cannot "
            "form the process group (its rank or the master node is unknown); refusing to train "
            "as a single process"
        )
    from submitit.helpers import TorchDistributedEnvironment

    os.environ.setdefault("MASTER_PORT", str(master_port_for(os.environ["SLURM_JOB_ID"])))
    env = TorchDistributedEnvironment()  # reads MASTER_PORT; its own pick can be an ephemeral port in use
    os.environ.setdefault("MASTER_ADDR", env.master_addr)
    os.environ.update(
        RANK=str(env.rank),
        WORLD_SIZE=str(env.world_size),
        LOCAL_RANK=str(env.local_rank),
        LOCAL_WORLD_SIZE=str(env.local_world_size),
    )
    return True


def master_port_for(job_id: str) -> int:
    """The rendezvous port of a job: the same on all its tasks, and outside the kernel's ephemeral range,
    where an outgoing connection (slurmctld's to slurmdbd, say) may hold it. submitit's own choice,
    random.Random(job_id).randint(20000, 60000), falls inside that range for most job ids."""
    low, high = _rendezvous_ports()
    digest = int.from_bytes(hashlib.sha256(str(job_id).encode()).digest()[:8], "little")
    return low + digest % (high - low + 1)


def _rendezvous_ports() -> tuple[int, int]:
    """20000 up to the ephemeral range (or above it, when it starts too low to leave room below)."""
    try:
        first, last = (int(x) for x in EPHEMERAL_PORTS.read_text().split())
    except (OSError, ValueError):
        first, last = LINUX_EPHEMERAL
    if first - 20000 >= 1000:
        return 20000, first - 1
    if 65535 - last >= 1000:
        return last + 1, 65535
    return 20000, LINUX_EPHEMERAL[0] - 1


def world_from_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) this process was started with; (0, 1, 0) when alone."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        _from_submitit()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, world, local


def timeout_s() -> float:
    """Seconds a rank waits for its peers (forming the group, and in each collective): ABLATE_DIST_TIMEOUT_S."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise SpecError("not a timeout", key=TIMEOUT_ENV, value=raw, allowed="a number of seconds > 0")
    return value


def init(device_type: str) -> Dist:
    """Join (or create) the process group for this process; a no-op Dist when the world size is 1."""
    if tdist.is_available() and tdist.is_initialized():
        return Dist(tdist.get_rank(), tdist.get_world_size(), int(os.environ.get("LOCAL_RANK", tdist.get_rank())))
    rank, world, local = world_from_env()
    if world <= 1:
        return Dist()
    wait = timeout_s()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        raise RuntimeError(f"WORLD_SIZE={world} but MASTER_PORT is not set")
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_device_index(local))
    try:
        tdist.init_process_group(
            backend, init_method="env://", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=wait)
        )
    except Exception as exc:  # torch's own error, with where and how long it waited in front of it
        raise RuntimeError(
            f"rank {rank} of {world} could not form the process group at "
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} (waited at most {wait:g} s, "
            f"{TIMEOUT_ENV}): {type(exc).__name__}: {exc}"
        ) from exc
    return Dist(rank, world, local, owns_group=True)


def finishing_group():
    """A gloo group of all ranks in which they wait for each other's share of the fine-tunings (every rank
    calls this, once, right after the process group is formed). Its timeout is FINISH_TIMEOUT_S: the training
    group's (ABLATE_DIST_TIMEOUT_S) is sized for one collective, not for a share of a task suite."""
    return tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=FINISH_TIMEOUT_S))


def wait_for_ranks(group) -> str | None:
    """Every rank calls this when its share is done: None once all have, else why not (a rank died, or
    gave up): the caller then computes what is missing itself."""
    try:
        tdist.monitored_barrier(
            group=group, timeout=datetime.timedelta(seconds=FINISH_TIMEOUT_S), wait_all_ranks=True
        )
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def rank_slice(batch_size: int, dist: Dist) -> slice:
    """This rank's contiguous part of the global batch."""
    per = batch_size // dist.world_size
    return slice(dist.rank * per, (dist.rank + 1) * per)
