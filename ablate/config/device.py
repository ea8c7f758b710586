"""Which device a `device:` setting means on this machine (auto: CUDA when there is one, else the CPU), and
which GPU a data-parallel rank takes: one small module every stage may import (pretraining, fine-tuning,
evaluation, calibration, the ranks sharing fine-tunings).

May import: config.errors.
"""

from __future__ import annotations

import os

import torch

from ablate.config.errors import SpecError


def pick_device(choice: str, local_rank: int = 0) -> torch.device:
    """The device of `choice` (auto, cpu, cuda, mps, ...); a CUDA device is the GPU of `local_rank`."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise SpecError("CUDA is not available on this machine", key="device", value=choice, allowed="auto, cpu")
    if choice == "cuda":
        return torch.device("cuda", local_device_index(local_rank))
    return torch.device(choice)


def local_device_index(local_rank: int) -> int:
    """The GPU of this rank: its local rank among the GPUs this process sees, or 0 when it sees exactly one
    (a job that gives each task a GPU of its own: --gpus-per-task=1, --gpu-bind; two ranks left on one GPU
    are refused by nccl in their first collective, "Duplicate GPU detected"). A rank beyond the visible
    GPUs is an error: sending it to GPU 0 would put two ranks' models, moments and contexts on one device."""
    visible = torch.cuda.device_count()
    if visible == 1:
        return 0
    if local_rank < visible:
        return local_rank
    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise SpecError(
        f"the rank with local rank {local_rank} has no GPU of its own: this process sees {visible} "
        "GPUs" + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown else ""),
        key="LOCAL_RANK",
        value=local_rank,
        allowed=f"one rank per visible GPU: local ranks 0..{visible - 1} (launcher.slurm."
        "tasks_per_node = gpus_per_node, or torchrun --nproc-per-node <= GPUs)"
        if visible
        else "a machine with GPUs, or device: cpu",
    )
