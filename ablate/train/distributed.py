"""Data parallelism for the training loop, explicit (no DDP wrapper): the process group, and the few
collectives pretrain() needs.

Every rank builds the same global batch and the same MLM masking (both depend only on seeds and the step),
takes its own contiguous slice, and after backward the gradients are all-reduced with SUM: each rank's loss
is already divided by the label count of the GLOBAL batch, so the sum is the single-process gradient.

Where the ranks come from, in order:
  RANK / WORLD_SIZE (/ LOCAL_RANK, MASTER_ADDR, MASTER_PORT)   torchrun, or a test that sets them
  a submitit job with several Slurm tasks                      TorchDistributedEnvironment().export()
  neither                                                      one process: every function here is a no-op
Backend: nccl on CUDA, gloo otherwise.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as tdist

BUCKET_ELEMENTS = 25_000_000     # gradients are flattened into buckets of at most this many elements


@dataclass(frozen=True)
class Dist:
    """This process's place in the run; Dist() is the single-process case."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False      # this module created the process group, so it tears it down

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()

    def sum_float(self, value: float, device: torch.device) -> float:
        """Sum of a Python float over ranks (loss for logging)."""
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=device)
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return float(t.item())

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
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def _from_submitit() -> bool:
    """Export torch.distributed variables when running as one of several tasks of a submitit job."""
    if int(os.environ.get("SLURM_NTASKS", "1")) <= 1 or os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return False
    try:
        from submitit.helpers import TorchDistributedEnvironment

        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    except Exception:   # not inside a submitit job after all
        return False
    return True


def world_from_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) this process was started with; (0, 1, 0) when alone."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        _from_submitit()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, world, local


def init(device_type: str, timeout_s: float = 1800) -> Dist:
    """Join (or create) the process group for this process; a no-op Dist when the world size is 1."""
    if tdist.is_available() and tdist.is_initialized():
        return Dist(tdist.get_rank(), tdist.get_world_size(), int(os.environ.get("LOCAL_RANK", tdist.get_rank())))
    rank, world, local = world_from_env()
    if world <= 1:
        return Dist()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        raise RuntimeError(f"WORLD_SIZE={world} but MASTER_PORT is not set")
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_device_index(local))
    tdist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                             timeout=datetime.timedelta(seconds=timeout_s))
    return Dist(rank, world, local, owns_group=True)


def local_device_index(local_rank: int) -> int:
    """The GPU of this rank: its local rank, or 0 when the job restricted each task to one visible GPU."""
    n = torch.cuda.device_count()
    return local_rank if local_rank < n else 0


def rank_slice(batch_size: int, dist: Dist) -> slice:
    """This rank's contiguous part of the global batch."""
    per = batch_size // dist.world_size
    return slice(dist.rank * per, (dist.rank + 1) * per)
