"""A run's CUDA out-of-memory said as what it is: where it happened (a pretraining phase and step, or a
fine-tuning task and seed), the micro-batch or batch, the predicted peak of that step (predict.gpu_memory,
predict.finetune_memory) and the device's memory. What the worker writes into the run's status.

May import: config, predict.gpu_memory, predict.finetune_memory.
"""

from __future__ import annotations

import torch

from ablate.config.spec import RunSpec
from ablate.predict.finetune_memory import finetune_shapes, finetune_step_memory
from ablate.predict.gpu_memory import gib, phase_memory


def oom_reason(
    exc: BaseException,
    spec: RunSpec,
    progress: dict | None,
    world_size: int = 1,
    device_bytes: int | None = None,
    predict: bool = True,
) -> str | None:
    """A run's CUDA out-of-memory said as what it is (None for any other failure): the phase and step of the
    last progress line, the micro-batch, the predicted peak of that phase (traced here, on the CPU) and the
    device's memory. Nothing here may hide the failure: a trace that fails leaves the prediction out."""
    if not isinstance(exc, torch.OutOfMemoryError):
        return None
    unit = getattr(exc, "finetune_unit", None)  # evaluate.unit_processes: a unit out of memory in its process
    if unit and ((progress or {}).get("task"), (progress or {}).get("seed")) != (unit["task"], unit["seed"]):
        progress = {"stage": "finetune", **unit}  # the last progress line was another unit's
    if (progress or {}).get("stage") == "finetune":
        parts = _finetune_oom(spec, progress, predict)
    else:
        parts = _pretrain_oom(spec, progress, world_size, predict)
    if device_bytes is None and torch.cuda.is_available():
        device_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if device_bytes:
        parts.append(f"device memory {gib(device_bytes)} GiB")
    return ", ".join(parts) + " (docs/gpu-memory.md: set the launcher's gpu_memory_gb, or micro_batch_size: auto)"


def _pretrain_oom(spec: RunSpec, progress: dict | None, world_size: int, predict: bool) -> list[str]:
    micro = spec.micro_batch_size or spec.batch_size // world_size
    phase_name = (progress or {}).get("phase") or spec.phases[0].name
    names = [p.name for p in spec.phases]
    index = names.index(phase_name) if phase_name in names else 0
    step = (progress or {}).get("step")
    parts = [
        f"out of GPU memory in phase {phase_name}"
        + (f" after step {step}" if step is not None else " before its first logged step"),
        f"micro-batch {micro}",
    ]
    if predict:
        try:
            parts.append(f"predicted peak {gib(phase_memory(spec, micro, world_size)[index].predicted)} GiB")
        except Exception:  # noqa: BLE001  (the prediction is a courtesy; the OOM is the failure)
            pass
    return parts


def _finetune_oom(spec: RunSpec, progress: dict, predict: bool) -> list[str]:
    """A fine-tuning step's OOM: the task and seed of the last progress line, the task's batch and the
    predicted peak of its longest batch (predict.finetune_memory)."""
    task, step = progress.get("task"), progress.get("step")
    if task is None:
        return ["out of GPU memory fine-tuning, before the first task reported"]
    parts = [
        f"out of GPU memory fine-tuning {task} (seed {progress.get('seed')})"
        + (f" after step {step}" if step else " before its first logged step")
    ]
    try:
        shape = next(s for s in finetune_shapes(spec) if s.task == task)
        parts.append(f"batch {shape.batch}")
        if predict:
            found = finetune_step_memory(shape)
            if found.memory is not None:
                parts.append(
                    f"predicted peak {gib(found.memory.predicted)} GiB (longest batch, {found.length} tokens)"
                )
    except Exception:  # noqa: BLE001  (as above: a courtesy)
        pass
    return parts
