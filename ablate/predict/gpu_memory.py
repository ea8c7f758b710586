"""The GPU memory of a run's training step, known before the run is submitted, on a CPU-only machine.

Each distinct step shape of a grid (model, attention implementation, objective's attention pattern, sequence
length, micro-batch, precision, vocabulary loss, document masking, the phase's freeze mask and which
parameters hold AdamW moments by then) runs ablate's own `train.loop.train_step` (forward, fused vocabulary
loss, backward, grad norms, clipping, AdamW) on the meta device under torch's MemTracker, with SDPA routed to
the kernel CUDA would pick and bf16 autocast done at the functions (ablate.predict.meta_cuda). Two micro-batches
are traced where the per-rank batch has two: the second's forward and backward run beside the first's
gradients, as every accumulation step after the first does. AdamW's moments of every parameter trained so far
exist before the step, as from a run's second step on. The peak is split as MemTracker attributes it:
weights, gradients, optimizer state, activations (forward) and temporaries (backward).

What meta cannot see is added as stated constants (docs/gpu-memory.md): the CUDA context, cuBLAS's workspace
and the caching allocator's rounding and fragmentation. FlexAttention (CUDA with documents or a prefix on
global layers) refuses meta: those steps are traced through the per-document SDPA path.

Results are cached per shape key in the process, and on disk across processes (ablate.predict.trace_cache):
a dry run over a grid traces each shape once, a second dry run, a requeued job and --retry-failed none.

May import: config, data, models, plan, analysis, train, predict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable
from unittest import mock

import numpy as np
import torch
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType

from ablate.analysis.probe import layer_params
from ablate.config.errors import SpecError
from ablate.config.spec import ObjectiveFields, RunSpec
from ablate.data.corpus import SequenceOrder
from ablate.predict import trace_cache
from ablate.models.families import family_of, n_layers
from ablate.plan.freezing import is_frozen
from ablate.plan.phases import plan_phases
from ablate.train import loop, vocab_loss
from ablate.predict.meta_cuda import CudaKernels
from ablate.train.optimizer import Optimizer
from ablate.train.freezing import start_phase

GiB = 2**30
CUDA_CONTEXT_BYTES = 600 * 2**20  # the CUDA context and torch's kernels: outside the allocator (300-800 MiB)
CUBLAS_WORKSPACE_BYTES = 32 * 2**20  # cuBLAS's workspace per handle on sm90 (":4096:8": 8 x 4 MiB)
ALLOCATOR_OVERHEAD = 0.05  # the caching allocator's rounding (512 B, 2 MiB blocks) and fragmentation
AUTO_MARGIN = 0.10  # `micro_batch_size: auto` keeps this fraction of the device free
META = torch.device("meta")
PARTS = ("weights", "gradients", "optimizer", "activations", "temporaries")
REFTYPES = {
    "weights": (_MemRefType.PARAM, _MemRefType.BUFFER),
    "gradients": (_MemRefType.GRAD,),
    "optimizer": (_MemRefType.OPT,),
    "activations": (_MemRefType.ACT, _MemRefType.OTH),
    "temporaries": (_MemRefType.TEMP,),
}


@dataclass(frozen=True)
class StepMemory:
    """The traced peak of one step, in bytes, split by what holds it (the parts add up to `traced`)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    temporaries: int
    kernels: tuple[str, ...] = ()  # the attention kernels the step ran (flash, efficient, math)

    @classmethod
    def from_tracker(cls, tracker: MemTracker, where: torch.device, kernels: CudaKernels) -> StepMemory:
        """The tracker's peak on `where`, split into PARTS, with the attention kernels the step ran."""
        peak = tracker.get_tracker_snapshot("peak").get(where, {})
        return cls(
            **{part: sum(int(peak.get(r, 0)) for r in refs) for part, refs in REFTYPES.items()},
            kernels=tuple(sorted(set(kernels.kernels))),
        )

    @property
    def traced(self) -> int:
        return sum(getattr(self, p) for p in PARTS)

    @property
    def predicted(self) -> int:
        """What the device needs: the traced peak with the allocator's overhead, the context and cuBLAS."""
        return math.ceil(self.traced * (1 + ALLOCATOR_OVERHEAD)) + CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES


@dataclass(frozen=True)
class StepShape:
    """What a step's memory depends on (the cache key)."""

    model: str
    attn_implementation: str
    objective: str
    mask_rate: float | None
    seq_len: int
    micro: int
    rows: int  # rows traced: one or two micro-batches
    bf16: bool
    vocab_loss: str
    document_masking: bool
    phase: int  # the phase's index in `phases`
    phases: tuple  # the run's phases up to this one as (objective, freeze): moments and freezing
    deterministic: bool = False  # SDPA's priority order: cuDNN last (ablate.models.attention.sdpa_priority)
    settings: str = "{}"  # JSON: the phase's other objective fields (mixtures, spans), whether grads are clipped


def bf16_on_gpu(spec: RunSpec) -> bool:
    """Whether the run trains under bf16 autocast on a GPU (precision auto is bf16 on CUDA)."""
    return spec.precision in ("auto", "bf16")


def step_shapes(spec: RunSpec, micro: int, ranks: int = 1) -> list[StepShape]:
    """One shape per phase of `spec` at micro-batch `micro` (a divisor of the per-rank batch)."""
    per_rank = spec.batch_size // ranks
    out = []
    for i, phase in enumerate(spec.phases):
        out.append(
            StepShape(
                spec.model,
                spec.attn_implementation,
                phase.objective,
                getattr(phase, "mask_rate", None),
                spec.phase_seq_len(i),
                micro,
                min(2 * micro, per_rank),
                bf16_on_gpu(spec),
                spec.vocab_loss,
                spec.document_masking,
                i,
                tuple((p.objective, tuple(p.freeze)) for p in spec.phases[: i + 1]),
                spec.deterministic,
                _step_settings(spec, phase),
            )
        )
    return out


def _step_settings(spec: RunSpec, phase) -> str:
    fields = set(ObjectiveFields.model_fields) - {"objective", "mask_rate"} | {"mixture", "granularity"}
    settings = phase.model_dump(mode="json", include=fields) | {"clipped": spec.optim.grad_clip is not None}
    return json.dumps(settings, sort_keys=True)


def phase_memory(spec: RunSpec, micro: int, ranks: int = 1) -> list[StepMemory]:
    """Each phase's step memory at micro-batch `micro`."""
    return [shape_memory(shape, spec) for shape in step_shapes(spec, micro, ranks)]


def shape_memory(shape: StepShape, spec: RunSpec) -> StepMemory:
    """The step memory of `shape`: traced once per process, and read from the trace cache where an earlier
    process traced it (ablate.predict.trace_cache)."""
    if shape not in _CACHE:
        _CACHE[shape] = trace_cache.read_or_trace(
            _cache_inputs(shape), lambda: trace_step(shape, spec), dataclasses.asdict, _stored_memory
        )
    return _CACHE[shape]


_CACHE: dict[StepShape, StepMemory] = {}


def _cache_inputs(shape: StepShape) -> dict:
    """The shape and the model's config as the trace builds it (a config edited in place traces anew)."""
    return {"shape": dataclasses.asdict(shape), "config": json.loads(_config_json(shape.model))}


@lru_cache(maxsize=8)
def _config_json(source: str) -> str:
    from ablate.models.loading import load_config

    return load_config(source).to_json_string(use_diff=False)


def _stored_memory(stored: dict) -> StepMemory:
    """A trace cache entry's result as a StepMemory; ValueError (the entry is traced again) where a part is not
    a byte count (an int >= 0: never a string or a float read as one) or the kernels are not a list of names."""
    parts = {part: stored[part] for part in PARTS}
    for part, value in parts.items():
        if type(value) is not int or value < 0:
            raise ValueError(f"{part} is {value!r}, not a byte count")
    kernels = stored["kernels"]
    if not isinstance(kernels, list) or not all(isinstance(k, str) for k in kernels):
        raise ValueError(f"kernels is {kernels!r}, not a list of names")
    return StepMemory(**parts, kernels=tuple(kernels))


@lru_cache(maxsize=8)
def _meta_model(source: str, attn_implementation: str, device: str = "meta"):
    """The model's architecture on the meta device (no weights, no memory), float32 as a run keeps it; on
    another device (the CPU check of the accounting, tests/test_gpu_memory.py) with real, random weights."""
    from transformers import AutoModelForMaskedLM

    from ablate.models.loading import check_attn, load_config

    config = load_config(source)
    check_attn(config, attn_implementation)
    config._attn_implementation = attn_implementation
    with torch.device(device):
        model = AutoModelForMaskedLM.from_config(config, attn_implementation=attn_implementation)
    return model


def trace_step(shape: StepShape, spec: RunSpec, device: str = "meta") -> StepMemory:
    """One training step of `shape` on meta tensors under MemTracker (see the module docstring); on the CPU
    with real tensors when `device` is cpu (the check that meta accounts what real tensors hold)."""
    where = torch.device(device)
    traced = spec.model_copy(
        update={"batch_size": shape.rows, "micro_batch_size": shape.micro, "device": "cpu", "compile": False}
    )
    model = _meta_model(shape.model, shape.attn_implementation, device)
    model.train()
    model.zero_grad(set_to_none=True)
    family = family_of(model.config)
    plans = plan_phases(traced, n_layers(model.config))
    plan = plans[shape.phase]
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    sequences = rng.integers(8, vocab, (shape.rows, shape.seq_len))
    docs = np.zeros((shape.rows, shape.seq_len), dtype=np.int64)
    ctx = loop.Context(
        traced,
        model,
        family,
        where,
        sequences,
        docs,
        SequenceOrder(shape.rows, 0),
        torch.arange(4),
        4,
        vocab,
        layer_params(model),
        autocast=shape.bf16,
    )
    opt = Optimizer(model, traced, fused=False)  # torch's fused AdamW refuses meta parameters
    start_phase(model, family, plan, traced.phases, opt)
    trained = {
        n
        for n, _ in model.named_parameters()
        for p in plans[: shape.phase + 1]
        if not is_frozen(n, family, p.frozen)
    }
    named = dict(model.named_parameters())
    with_moments(opt.torch, [named[name] for name in trained])  # of every parameter trained so far
    tracker = _StepTracker()
    for p in model.parameters():  # MemTracker hooks every parameter, which a frozen one refuses
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
    tracker.track_external(model, opt.torch)
    kernels = CudaKernels(autocast=False)
    try:
        with kernels, _gpu_paths(kernels), tracker:
            loop.train_step(ctx, plan, sequences, docs, 0, opt, spec.optim.lr)
    finally:
        opt.torch.state.clear()
        model.zero_grad(set_to_none=True)
    return StepMemory.from_tracker(tracker, where, kernels)


def with_moments(optimizer: torch.optim.Optimizer, params) -> None:
    """AdamW's state for `params` as it stands from a run's second step on (what a traced step holds)."""
    for p in params:
        optimizer.state[p] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p),
        }


@contextlib.contextmanager
def _gpu_paths(kernels: CudaKernels):
    """The step's autocast and fused loss as on CUDA: the loop's autocast switches the router's bf16 casting,
    and the fused loss, which turns autocast off inside and computes in its dtype, gets bf16 features."""

    def autocast(_device, enabled):
        @contextlib.contextmanager
        def on():
            before, kernels.autocast_on = kernels.autocast_on, enabled
            try:
                yield
            finally:
                kernels.autocast_on = before

        return on()

    fused = vocab_loss.fused_cross_entropy

    def fused_as_under_autocast(features, weight, bias, labels, *args, **kwargs):
        kwargs["gpu"] = True  # CUDA's path, whatever the tracing device
        if not kernels.autocast_on:
            return fused(features, weight, bias, labels, *args, **kwargs)
        kernels.paused = True
        try:
            return fused(features.to(torch.bfloat16), weight, bias, labels, *args, **kwargs)
        finally:
            kernels.paused = False

    with (
        mock.patch.object(loop, "autocast", autocast),
        mock.patch.dict(vocab_loss.LOSSES, {"fused": fused_as_under_autocast}),
    ):
        yield


class _NoHook:
    def remove(self) -> None:
        pass


class PeakTracker(MemTracker):
    """MemTracker keeping, after each op, only the global peak (what StepMemory reads): its per-module peaks
    walk every module at every op, most of a trace's time on a 22-layer model."""

    def _update_peak_stats(self, peak_state) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                self._peak_mem[dev] = snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(snap)  # {reftype: bytes}: a flat copy is a deep one


class _StepTracker(PeakTracker):
    """MemTracker across a step's micro-batches: the encoder is called once per micro-batch, which MemTracker
    takes for a second iteration; its per-module statistics (unused here) are reset instead."""

    def _pre_fw_hook(self, module, inputs):
        name = self._mod_tracker.get_known_fqn(module)
        if (
            module in self.memory_tracking
            and not self._mod_tracker.is_bw
            and set(self._mod_tracker.parents) - {name} == {"Global"}
        ):
            self.reset_mod_stats()
        super()._pre_fw_hook(module, inputs)


def micro_batches(per_rank: int) -> list[int]:
    """The micro-batches a per-rank batch allows: its divisors, largest first."""
    return [d for d in range(per_rank, 0, -1) if per_rank % d == 0]


def largest_fitting(
    spec: RunSpec, limit_bytes: int, ranks: int = 1, margin: float = 0.0, below: int | None = None
) -> int | None:
    """The largest divisor of the per-rank batch whose every phase fits `limit_bytes` less `margin` of it
    (None: not even one sequence fits), those from `below` up left out (a micro-batch known not to fit).
    The whole per-rank batch is one micro-batch, with no gradients beside its forward: on a small model its
    peak can be below two half-size micro-batches', so it is tried first. Every smaller divisor traces two
    micro-batches, whose peak grows with the micro-batch: those are bisected (a handful of traces, not one
    per divisor)."""
    usable = limit_bytes * (1 - margin)
    per_rank = spec.batch_size // ranks
    candidates = [m for m in micro_batches(per_rank) if below is None or m < below]
    if candidates and candidates[0] == per_rank:
        if _fits(spec, per_rank, ranks, usable):
            return per_rank
        candidates = candidates[1:]
    low, high = 0, len(candidates)  # candidates[:low] do not fit, candidates[high:] do
    while low < high:
        middle = (low + high) // 2
        if _fits(spec, candidates[middle], ranks, usable):
            high = middle
        else:
            low = middle + 1
    return candidates[low] if low < len(candidates) else None


def _fits(spec: RunSpec, micro: int, ranks: int, usable: float) -> bool:
    """Whether every phase at `micro` fits `usable` bytes (the phases after the first that does not are not
    traced)."""
    return all(shape_memory(shape, spec).predicted <= usable for shape in step_shapes(spec, micro, ranks))


def gib(n: int) -> str:
    return f"{n / GiB:.1f}"


def gpu_limit(launcher, executor: str) -> tuple[int | None, str]:
    where = "slurm" if executor == "slurm" else "local"
    return launcher.gpu_memory_bytes(executor), f"launcher.{where}.gpu_memory_gb"


def resolve_auto(
    runs: list,
    groups: list,
    launcher,
    executor: str,
    file: str | None,
    ran_out: Callable[[str], bool] | None = None,
) -> tuple[list, list[str], list[str]]:
    """Runs whose micro_batch_size is `auto` get the largest divisor of their per-rank batch at which every
    phase fits the GPU with AUTO_MARGIN to spare, the smallest such value of the runs they are compared with
    (twins train the same micro-batches: plan.parity); the value lands in the spec (spec.json, the run id) and
    `labels.micro_batch_size: auto` says where it came from. `ran_out` (a sweep's --retry-failed: whether the
    run of that id ran out of GPU memory) steps past every micro-batch whose run did, to the next smaller
    divisor. Returns (runs, notes for the dry run, what --retry-failed changed: said by every sweep)."""
    from ablate.plan.grid import PlannedRun

    if not any(r.spec.micro_batch_size == "auto" for r in runs):
        return runs, [], []
    limit, key = gpu_limit(launcher, executor)
    if limit is None:
        raise SpecError(
            f"micro_batch_size: auto needs the GPU's memory ({key})",
            file=file,
            key=key,
            value=None,
            allowed="a number of GiB or a GPU name",
        )
    ranks = launcher.ranks(executor)
    chosen: dict[str, int] = {}
    stepped: list[str] = []
    for run in runs:
        if run.spec.micro_batch_size != "auto":
            continue
        fits = largest_fitting(run.spec.model_copy(update={"micro_batch_size": None}), limit, ranks, AUTO_MARGIN)
        found = fits if fits is None or ran_out is None else _below_out_of_memory(run.spec, fits, ranks, ran_out)
        if found is None:
            why = (
                "ran out of GPU memory at every micro-batch down to 1 (status.json's out_of_gpu_memory)"
                if fits
                else f"not even one sequence per micro-batch fits {gib(limit)} GiB with {AUTO_MARGIN:.0%} kept free"
            )
            raise SpecError(
                f"run {run.run_id} ({run.axes}): {why}",
                file=file,
                key=key,
                value=launcher_value(launcher, executor),
                allowed="a GPU with more memory",
            )
        if found != fits:
            stepped.append(f"{run.run_id} ({run.axes}): ran out of GPU memory at {fits}, now {found}")
        chosen[run.run_id] = found
    for group in groups:
        ids = [i for arm in group.runs.values() for i in arm if i in chosen]
        if ids:
            low = min(chosen[i] for i in ids)
            chosen.update({i: low for i in ids})
    out, notes = [], []
    for run in runs:
        if run.run_id not in chosen:
            out.append(run)
            continue
        spec = run.spec.model_copy(
            update={
                "micro_batch_size": chosen[run.run_id],
                "labels": {**run.spec.labels, "micro_batch_size": "auto"},
            }
        )
        out.append(PlannedRun(spec, run.axes, run.origins))
    values = sorted(set(chosen.values()))
    notes.append(
        f"micro_batch_size auto: {', '.join(map(str, values))} (largest divisor of the per-rank batch "
        f"fitting {gib(limit)} GiB with {AUTO_MARGIN:.0%} free; compared runs share one); a micro-batch "
        "changes a run's numbers through its dropout draws (one stream per micro-batch) and the "
        "float rounding of accumulation"
    )
    retried = [
        "--retry-failed: micro_batch_size auto below what ran out of GPU memory (the runs compared with "
        "these follow: new run ids, the failed runs' folders kept): " + "; ".join(stepped)
    ]
    return out, notes, retried if stepped else []


def _below_out_of_memory(spec: RunSpec, micro: int, ranks: int, ran_out: Callable[[str], bool]) -> int | None:
    """`micro`, or the largest smaller divisor of the per-rank batch, whose run (the spec at that micro-batch)
    has not run out of GPU memory; None when every one down to 1 has."""
    for candidate in micro_batches(spec.batch_size // ranks):
        if candidate <= micro and not ran_out(spec.model_copy(update={"micro_batch_size": candidate}).run_id):
            return candidate
    return None


def launcher_value(launcher, executor: str):
    return (launcher.slurm if executor == "slurm" else launcher.local).gpu_memory_gb


def memory_plan(runs: list, launcher, executor: str, file: str | None) -> list[dict] | None:
    """Each run's predicted peak per phase against the GPU's memory (None when the launcher states none).
    A phase that does not fit is a SpecError naming the run, phase, predicted GiB, the limit and the largest
    micro-batch that fits."""
    limit, key = gpu_limit(launcher, executor)
    if limit is None:
        return None
    ranks = launcher.ranks(executor)
    rows, misfit = [], None
    for run in runs:
        spec = run.spec
        micro = spec.micro_batch_size or spec.batch_size // ranks
        for phase, m in zip(spec.phases, phase_memory(spec, micro, ranks)):
            rows.append(
                {
                    "run": run.run_id,
                    "phase": phase.name,
                    "micro": micro,
                    "weights": gib(m.weights),
                    "grads": gib(m.gradients),
                    "adamw": gib(m.optimizer),
                    "activations": gib(m.activations),
                    "temp": gib(m.temporaries),
                    "peak_GiB": gib(m.predicted),
                    "limit_GiB": gib(limit),
                    "fits": "yes" if m.predicted <= limit else "NO",
                }
            )
            if m.predicted > limit and misfit is None:
                misfit = (run, phase.name, micro, m)
        if misfit is not None:  # the error names the first; the other runs' rows are not printed
            break
    if misfit is not None:
        run, phase, micro, m = misfit
        best = largest_fitting(run.spec.model_copy(update={"micro_batch_size": None}), limit, ranks, below=micro)
        fix = (
            f"micro_batch_size: {best} (the largest divisor of the per-rank batch that fits)"
            if best
            else "a GPU with more memory: not even one sequence per micro-batch fits"
        )
        raise SpecError(
            f"run {run.run_id} ({run.axes}), phase {phase}: predicted peak {gib(m.predicted)} GiB at "
            f"micro-batch {micro} does not fit the {gib(limit)} GiB of {key}; largest micro-batch "
            f"that fits: {best or 'none'}",
            file=file,
            key="micro_batch_size",
            value=micro,
            allowed=fix,
        )
    return rows
