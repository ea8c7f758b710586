"""Where a grid's (or a study's) runs go, as written under `launcher:`: this machine (`local`, or `debug` in this
process) or Slurm, with each executor's settings, and what a run holds under each: its data-parallel ranks,
its GPUs and the memory of one GPU (a GPU name from GPU_MEMORY_GB or GiB). Submitting is ablate.launch.

May import: config.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ablate.config.base import Located, Strict


GPU_MEMORY_GB = {"A100-40": 40, "A100-80": 80, "H100-80": 80, "H200-141": 141, "L40S-48": 48}  # GiB per device
GPU_MEMORY_FIELD = Field(
    default=None,
    description="GPU memory per device, in GiB, or a GPU name: "
    + ", ".join(GPU_MEMORY_GB)
    + "; set, the dry run and the sweep check every run's "
    "peak against it (docs/gpu-memory.md)",
)


def gpu_memory_value(value: Any) -> float | str | None:
    """A GPU name from GPU_MEMORY_GB or a positive number of GiB; anything else is refused naming both."""
    if value is None or (isinstance(value, str) and value in GPU_MEMORY_GB):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    raise Located(
        f"unknown GPU memory {value!r}",
        "gpu_memory_gb",
        value,
        f"a number of GiB > 0 or one of {', '.join(GPU_MEMORY_GB)}",
    )


class LocalLauncher(Strict):
    gpu_memory_gb: float | str | None = GPU_MEMORY_FIELD
    parallel: int = Field(default=1, gt=0, description="runs at once on this machine")
    timeout_min: int = Field(default=24 * 60, gt=0, description="minutes before a run's job is stopped")

    @model_validator(mode="before")
    @classmethod
    def _gpu_memory(cls, data):
        if isinstance(data, dict) and "gpu_memory_gb" in data:
            data = {**data, "gpu_memory_gb": gpu_memory_value(data["gpu_memory_gb"])}
        return data


class SlurmLauncher(Strict):
    partition: str | None = Field(default=None, description="sbatch --partition; null: the cluster's default")
    gpus_per_node: int = Field(default=0, ge=0, description="GPUs per node of a run (0: a CPU job)")
    nodes: int = Field(default=1, gt=0, description="nodes per run (data parallel across nodes)")
    tasks_per_node: int = Field(default=1, gt=0, description="data-parallel ranks per node (one per GPU)")
    cpus_per_task: int = Field(default=2, gt=0, description="CPU cores per rank (data loading, tokenization)")
    mem_gb: float = Field(default=8, gt=0, description="memory per node, in GB")
    timeout_min: int = Field(
        default=60,
        gt=0,
        description="the job's time limit in minutes (a run stopped by it "
        "is requeued and resumes from its checkpoint)",
    )
    account: str | None = Field(default=None, description="sbatch --account (the allocation the hours go to)")
    qos: str | None = Field(default=None, description="sbatch --qos")
    constraint: str | None = Field(
        default=None, description="sbatch --constraint (node features, e.g. a GPU type)"
    )
    additional_parameters: dict[str, Any] = Field(default_factory=dict, description="extra sbatch options")
    array_parallelism: int = Field(default=16, gt=0, description="jobs of one array running at once")
    max_array_size: int = Field(default=1000, gt=0, description="the cluster's MaxArraySize")
    max_requeues: int = Field(default=3, ge=0, description="timeouts/preemptions before giving up")
    setup: tuple[str, ...] = Field(default=(), description="shell lines run before the job (module load ...)")
    gpu_memory_gb: float | str | None = GPU_MEMORY_FIELD

    @model_validator(mode="before")
    @classmethod
    def _gpu_memory(cls, data):
        if isinstance(data, dict) and "gpu_memory_gb" in data:
            data = {**data, "gpu_memory_gb": gpu_memory_value(data["gpu_memory_gb"])}
        return data

    @model_validator(mode="after")
    def _one_rank_per_gpu(self) -> "SlurmLauncher":
        """With GPUs, each task (rank) trains on one GPU of its own. gpus_per_node: 0 (CPU ranks, gloo, or
        GPUs asked for through additional_parameters) takes any number of tasks."""
        gpus, tasks = self.gpus_per_node, self.tasks_per_node
        if gpus and tasks != gpus:
            why = (
                f"{gpus - tasks} GPU(s) per node would be held and never train"
                if tasks < gpus
                else f"{tasks - gpus} rank(s) per node would have no GPU of their own"
            )
            raise Located(
                f"one data-parallel rank per GPU: launcher.slurm.gpus_per_node is {gpus}, so "
                f"tasks_per_node must be {gpus} ({why})",
                "tasks_per_node",
                tasks,
                f"{gpus} (= gpus_per_node), or gpus_per_node: 0 for CPU ranks",
            )
        return self


class Launcher(Strict):
    executor: Literal["local", "slurm", "debug"] = Field(
        default="local",
        description="local: processes on this machine; slurm: jobs; debug: in this process, one by one",
    )
    local: LocalLauncher = Field(default=LocalLauncher(), description="settings of the local executor")
    slurm: SlurmLauncher = Field(default=SlurmLauncher(), description="settings of the Slurm executor")

    def ranks(self, executor: str | None = None) -> int:
        """Data-parallel processes per run under `executor` (default: this launcher's): Slurm's nodes x tasks
        per node; one elsewhere."""
        return self.slurm.nodes * self.slurm.tasks_per_node if (executor or self.executor) == "slurm" else 1

    def gpu_memory_bytes(self, executor: str | None = None) -> int | None:
        """Memory of one GPU of a run under `executor` (the local and debug executors read `local`), or None."""
        value = (self.slurm if (executor or self.executor) == "slurm" else self.local).gpu_memory_gb
        if value is None:
            return None
        return int(GPU_MEMORY_GB.get(value, value) * 2**30) if isinstance(value, str) else int(value * 2**30)

    def gpus(self, executor: str | None = None) -> int:
        """GPUs one run holds under `executor`: Slurm's nodes x GPUs per node; one on a local machine."""
        return self.slurm.nodes * self.slurm.gpus_per_node if (executor or self.executor) == "slurm" else 1
