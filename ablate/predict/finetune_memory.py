"""The GPU memory of a run's fine-tuning steps, known before the run is submitted, on a CPU-only machine.

A run fine-tunes its checkpoint on each eval task on the GPU it pretrained on. For each distinct (model,
tokenizer, task, fine-tuning settings) of a grid, one training step of ablate's own fine-tuning loop
(`evaluate.finetune`: the task type's head, LoRA or a probe where the settings say, the task's loss, backward,
clipping, AdamW with its moments already there) runs on the meta device under torch's MemTracker, as the
pretraining step does (predict.gpu_memory: SDPA routed to the kernel CUDA would pick, bf16 autocast at the
functions where the task's precision is auto or bf16). The batch is the task's longest one: its
`batch_size` longest training examples, encoded by the run's tokenizer and cut at the task's max_length (the
model's context at most), padded together, with their real labels; the padding mask is kept, as CUDA keeps it
for a padded batch. Fine-tuning has no gradient accumulation: a task that does not fit is refused with the
largest batch that would (a smaller batch changes the task's protocol, so nothing picks one by itself). How
many units of a task share a GPU follows from the same peak (`units_at_once`: the dry run's `at_once`, and
launch.shares in the job).

Not traced: span_ner, whose model reads its batch on the host (the BiLSTM's packing lengths, boolean-mask
indexing), which meta tensors cannot do; its rows say so.

May import: config, models.loading, evaluate, predict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import warnings
from dataclasses import dataclass
from unittest import mock

import torch

from ablate.config.errors import SpecError
from ablate.evaluate import finetune as ft
from ablate.evaluate.batching import collate
from ablate.evaluate.suites import spec_items
from ablate.evaluate.tasks import TaskSpec, load_task, load_task_data, resolve_settings
from ablate.predict.gpu_memory import AUTO_MARGIN, PeakTracker, StepMemory, gib, gpu_limit, with_moments
from ablate.predict.meta_cuda import CudaKernels


@dataclass(frozen=True)
class FinetuneShape:
    """What a fine-tuning step's memory depends on (the cache key)."""

    model: str
    tokenizer: str
    attn_implementation: str
    task: str
    settings: str  # the resolved fine-tuning settings, as JSON
    batch: int
    data_root: str | None


@dataclass(frozen=True)
class FinetuneMemory:
    task: str
    type: str
    batch: int
    length: int  # the longest batch's padded length
    memory: StepMemory | None  # None: not traced (the task type's host_reads)


_CACHE: dict[FinetuneShape, FinetuneMemory] = {}


def _from_config_on(device: torch.device):
    """PreTrainedModel.from_pretrained as the trace runs it: the architecture on `device` (meta: no weights;
    the CPU check: random ones), float32; the Auto classes hand over the config, with the head's labels."""

    def from_pretrained(cls, model_dir, *_args, config=None, dtype=None, **kwargs):
        from transformers import AutoConfig

        config = config if config is not None else AutoConfig.from_pretrained(model_dir, **kwargs)
        with torch.device(device):
            return cls._from_config(config, dtype=torch.float32)

    return classmethod(from_pretrained)


@contextlib.contextmanager
def _config_folder(source: str, attn_implementation: str):
    """A temporary folder holding the model's config.json (what the heads read through from_pretrained)."""
    from ablate.models.loading import load_config

    with tempfile.TemporaryDirectory(prefix="ablate-finetune-memory-") as folder:
        config = load_config(source)
        config._attn_implementation = attn_implementation
        config.save_pretrained(folder)
        yield folder


def finetune_step_memory(shape: FinetuneShape) -> FinetuneMemory:
    """One fine-tuning step of `shape` traced on meta (cached per shape in the process)."""
    if shape not in _CACHE:
        _CACHE[shape] = _trace(shape)
    return _CACHE[shape]


def _trace(shape: FinetuneShape, device: str = "meta") -> FinetuneMemory:
    """The step on meta; on the CPU with real tensors and random weights (`device` cpu, with a float32
    precision: the check that meta accounts what real tensors hold, tests/test_gpu_memory.py)."""
    from ablate.models.loading import load_tokenizer

    task = load_task(shape.task)
    settings = resolve_settings(task, json.loads(shape.settings)).model_copy(update={"batch_size": shape.batch})
    data = load_task_data(task, shape.data_root)
    tokenizer = load_tokenizer(shape.tokenizer)
    where = torch.device(device)
    with _config_folder(shape.model, shape.attn_implementation) as folder:
        max_length = ft._max_length(folder, tokenizer, task, settings, None)
        if task.entry.host_reads:
            return FinetuneMemory(task.name, task.type, shape.batch, max_length, None)
        with mock.patch("transformers.PreTrainedModel.from_pretrained", _from_config_on(where)):
            model = ft._load_model(folder, task, data.labels, settings)
    train = ft.encode(tokenizer, task, data.splits["train"], data.labels, max_length)
    longest = sorted(train, key=lambda item: len(item.input_ids))[-shape.batch :]
    batch = collate(longest, tokenizer.pad_token_id or 0, task.type, ft._takes_token_types(model))
    memory = _traced_step(model, task, settings, train, len(data.labels), batch, where)
    return FinetuneMemory(task.name, task.type, shape.batch, batch["input_ids"].shape[1], memory)


def _traced_step(
    model, task: TaskSpec, settings, train: list, n_labels: int, batch: dict, where: torch.device
) -> StepMemory:
    """One step of evaluate.finetune's loop on `where` (meta) under MemTracker, AdamW's moments there (a step
    after the first), bf16 autocast at the functions when the settings' precision is auto or bf16."""
    from transformers import masking_utils

    loss_fn = ft._loss_fn(task, settings, train, n_labels, where.type)
    opt = ft._optimizer(model, settings, "meta", 2)  # not fused: torch's fused AdamW refuses meta
    with_moments(opt.optimizer, opt.params)
    bf16 = settings.precision in ("auto", "bf16")
    kernels = CudaKernels(autocast=bf16)
    tracker = PeakTracker()  # the global peak only: what the plan reads
    tracker.track_external(model, opt.optimizer)
    # transformers drops an all-ones padding mask after reading it on the host; the longest batch is padded
    with (
        kernels,
        tracker,
        mock.patch.object(masking_utils, "_ignore_bidirectional_mask_sdpa", lambda *_a, **_k: False),
        warnings.catch_warnings(),
    ):
        # the head's loss runs outside the model's modules, which ModTracker takes for a misplaced backward
        warnings.filterwarnings("ignore", "The module hierarchy tracking maybe be messed up")
        # the host batch, as the loop has it: it reads the rows' lengths, then copies the tensors to the device
        # (the CPU check's copies are clones, made where the step makes them, so both devices count them)
        steps = ([(_on_host(batch, where), 1.0)] for _ in range(1))
        ft._train_epoch(model, steps, opt, loss_fn, settings.grad_clip, where.type, _ignore, None, bf16)
    return StepMemory.from_tracker(tracker, where, kernels)


def _ignore(_loss) -> None:
    pass


def _on_host(batch: dict, where: torch.device) -> dict:
    """The batch the loop gets: on the host (cloned when the step runs on the CPU, where copying it to the
    device would be no copy at all)."""
    return {k: v.clone() for k, v in batch.items()} if where.type == "cpu" else batch


def finetune_shapes(spec, file: str | None = None) -> list[FinetuneShape]:
    """The distinct fine-tuning steps of a run: one per eval task (its seeds train the same shapes), the
    suites' and the run's fine-tuning overrides and protocol applied."""
    out = []
    for item in spec_items(spec, file=file, present_only=True):
        task = load_task(item.task)
        settings = resolve_settings(task, item.finetune, spec.eval.protocol)
        shape = FinetuneShape(
            spec.model,
            spec.tokenizer or spec.model,
            spec.attn_implementation,
            item.task,
            json.dumps(settings.model_dump(mode="json"), sort_keys=True),
            settings.batch_size,
            spec.data.data_root,
        )
        if shape not in out:
            out.append(shape)
    return out


def largest_fitting_batch(shape: FinetuneShape, limit: int) -> int | None:
    """The largest batch below the task's whose step fits `limit` (halving; None: not even one example)."""
    batch = shape.batch // 2
    while batch >= 1:
        memory = finetune_step_memory(dataclasses.replace(shape, batch=batch)).memory
        if memory is not None and memory.predicted <= limit:
            return batch
        batch //= 2
    return None


def finetune_memory_plan(runs: list, launcher, executor: str, file: str | None) -> list[dict] | None:
    """Each distinct fine-tuning step of the runs, its predicted peak against the GPU's memory (None when the
    launcher states none). A task that does not fit is a SpecError naming the task, its batch and length, the
    predicted GiB, the limit and the largest batch that fits."""
    limit, key = gpu_limit(launcher, executor)
    if limit is None:
        return None
    rows, seen = [], set()
    for run in runs:
        for shape in finetune_shapes(run.spec, file):
            if shape in seen:
                continue
            seen.add(shape)
            found = finetune_step_memory(shape)
            m = found.memory
            rows.append(
                {
                    "model": shape.model,
                    "task": found.task,
                    "batch": found.batch,
                    "length": found.length,
                    "weights": gib(m.weights) if m else "-",
                    "grads": gib(m.gradients) if m else "-",
                    "adamw": gib(m.optimizer) if m else "-",
                    "activations": gib(m.activations) if m else "-",
                    "temp": gib(m.temporaries) if m else "-",
                    "peak_GiB": gib(m.predicted) if m else "-",
                    "limit_GiB": gib(limit),
                    "fits": ("yes" if m.predicted <= limit else "NO") if m else f"not traced ({found.type})",
                    "at_once": _at_once(run.spec.eval.units_per_gpu, limit, m),
                }
            )
            if m is not None and m.predicted > limit:
                best = largest_fitting_batch(shape, limit)
                raise SpecError(
                    f"run {run.run_id}: fine-tuning {found.task} (batch {found.batch}, longest batch "
                    f"{found.length} tokens) has a predicted peak of {gib(m.predicted)} GiB, more than the "
                    f"{gib(limit)} GiB of {key}; largest batch that fits: {best or 'none'}",
                    file=file,
                    key="base.eval.finetune.batch_size",
                    value=found.batch,
                    allowed=(
                        f"a GPU with more memory, or eval.finetune batch_size: {best} (the task's protocol "
                        "then differs from its file's)"
                        if best
                        else "a GPU with more memory, or a shorter finetune max_length"
                    ),
                )
    return rows


def units_at_once(
    device_bytes: int, unit_bytes: int, units: int | None = None, margin: float = AUTO_MARGIN, in_use: int = 0
) -> int:
    """How many fine-tunings of a predicted peak of `unit_bytes` each (a process each: its CUDA context is in
    the prediction) fit one device of `device_bytes` together, `margin` of it kept free and `in_use` already
    taken (the parent's context, another job): at least 1 (alone, as a unit always could), at most `units`."""
    fit = max(1, int((device_bytes * (1 - margin) - in_use) // unit_bytes))
    return fit if units is None else max(1, min(fit, units))


def _at_once(units_per_gpu: int | str, limit: int, memory: StepMemory | None) -> int:
    """The dry run's units of a task at once on one GPU: eval.units_per_gpu, or what auto makes of it."""
    if units_per_gpu != "auto":
        return units_per_gpu
    return 1 if memory is None else units_at_once(limit, memory.predicted)
