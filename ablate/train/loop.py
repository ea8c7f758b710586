"""Continued pretraining: one explicit loop over the phases of a RunSpec.

    load model + tokenizer -> token stream -> for each phase: freeze, RoPE thetas (train.rope), then steps of
    (batch by data position -> objective inputs -> forward on the encoder -> head transform at labelled
     positions -> vocabulary projection + cross-entropy, fused and chunked (vocab_loss) -> backward
     -> per-layer grad norms -> clip -> AdamW) ; checkpoint ; measure layers
    -> save_pretrained

Determinism: every random draw of a step is seeded from (seed, global step): the masking of the global batch,
and the dropout of each micro-batch (also by its index in the global batch), and the batch at a step
depends only on the data seed and the data position, so a run resumed from a checkpoint
computes exactly what the uninterrupted run would have. The token stream each phase consumed is hashed
(a chain of sha256 over the batches) so "identical data" between arms is checked, not assumed.

Data parallel (ablate.train.distributed): every rank builds the same global batch and masking, computes the label
count over the global batch, runs its own contiguous slice (its micro-batches draw the dropout that those
micro-batches draw in one process), and the gradients are summed over ranks after backward, which gives the
single-process gradient of the same micro_batch_size. Only rank 0 writes checkpoints, progress and the model;
a checkpoint is the same whatever the world size, so a run resumes under any number of ranks.

How it computes (ablate.train.precision; each path runs on the CPU too, so the tests run what a GPU runs):
bf16 autocast by `precision` (auto: on CUDA only), each encoder block under torch.compile by `compile` (auto: on
CUDA only; or ABLATE_COMPILE=1; ablate.train.compiled), deterministic algorithms with `deterministic: true`;
on CUDA the attention's flash kernels (ablate.models.attention), SDPA's cuDNN first; fused AdamW on both
devices; pinned host memory with non-blocking copies on CUDA. What only the CPU runs is ablate.train.cpu.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ablate.train.checkpoint import (
    TrainState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    save_final_model,
)
from ablate.train.distributed import Dist, init as init_distributed, rank_slice
from ablate.data.corpus import SequenceOrder, ensure_prepared
from ablate.data.mixture import readings
from ablate.config.device import pick_device
from ablate.config.errors import SpecError
from ablate.train.streams import Streams
from ablate.plan.freezing import is_frozen
from ablate.train.freezing import start_phase
from ablate.plan.phases import PhasePlan, frozen_rows, plan_phases
from ablate.models.families import Family, family_of, n_layers
from ablate.models.loading import load_masked_lm, load_tokenizer
from ablate.analysis.probe import layer_params, weight_rel_change
from ablate.train.grad_norms import step_norms
from ablate.train.optimizer import Optimizer, fused_adamw
from ablate.train.batches import batch_loss, objective_batch, seed_for, step_notes
from ablate.train.attention_masks import attention_for
from ablate.train.cpu import cpu_dropout
from ablate.train.precision import autocast, set_determinism, uses_autocast, uses_compile
from ablate.train import compiled
from ablate.models.attention import kernel_priority
from ablate.train.readback import Unread
from ablate.train.preflight import preflight_run
from ablate.train.schedule import lr_at
from ablate.train.vocab_loss import LOSSES
from ablate.config.objectives.base import pattern_of_rows
from ablate.config.spec import RunSpec
from ablate.store.rundir import branch_points

Log = Callable[[str], None]
PhaseEndHook = Callable[[str, torch.nn.Module], list[dict]]


def _dropout_seed(seed: int, global_step: int, micro_batch: int) -> int:
    """The dropout stream of one micro-batch, by its index in the global batch: a data-parallel run draws
    what one process with the same micro_batch_size draws. Micro-batch 0 keeps the seed the whole step
    used to have, so runs without gradient accumulation give the numbers they always gave."""
    return seed_for(seed, global_step, 1) if micro_batch == 0 else seed_for(seed, global_step, 1, micro_batch)


# ---------------------------------------------------------------- the loop


@dataclass
class Context:
    """What the loop needs that does not change during a run."""

    spec: RunSpec
    model: torch.nn.Module
    family: Family
    device: torch.device
    sequences: np.ndarray
    doc_ids: np.ndarray
    order: SequenceOrder
    special_ids: torch.Tensor
    mask_id: int
    vocab_size: int
    layer_params: dict[int, list[str]]  # layer (-1 = embeddings) -> parameter names
    autocast: bool
    dist: Dist = field(default_factory=Dist)
    encoder: compiled.CompiledEncoder | None = None  # the encoder to call, its blocks compiled (when asked);
    # None = the family's, eager
    pin_memory: bool = False
    streams: Streams | None = None  # every phase's corpora (train.streams)


def check_data_parallel(spec: RunSpec, world_size: int) -> None:
    """Each rank takes an equal slice of the global batch, itself a whole number of micro-batches."""
    if world_size <= 1:
        return
    micro = spec.micro_batch_size or spec.batch_size // world_size
    if spec.batch_size % (world_size * micro):
        raise SpecError(
            f"batch_size must be a multiple of world size x micro-batch ({world_size} x {micro})",
            key="batch_size",
            value=spec.batch_size,
            allowed=f"a multiple of {world_size * micro}",
        )


def train_step(
    ctx: Context,
    phase: PhasePlan,
    batch: np.ndarray,
    docs: np.ndarray,
    global_step: int,
    opt: Optimizer,
    lr: float,
    notes: dict | None = None,
) -> tuple[torch.Tensor, tuple[tuple[int, ...], torch.Tensor]]:
    """One optimizer step over `batch` (split into micro-batches); returns (mean loss, (layers, their grad
    norms)) as tensors on the device, unread: nothing in a step waits for the GPU (ablate.train.readback).
    `notes`, when given, receives the curves' columns beside the loss (ablate.train.batches.step_notes)."""
    spec, model, family, dist = ctx.spec, ctx.model, ctx.family, ctx.dist
    made = objective_batch(ctx, phase, batch, docs, global_step)
    inputs, labels, prefix, member = made.inputs, made.labels, made.prefix, made.member
    n_rows = len(inputs)  # of the global batch
    n_labels = int((labels != -100).sum())
    if n_labels == 0:
        raise RuntimeError(f"step {global_step}: the batch has no position with a loss")

    mask_dtype = torch.bfloat16 if ctx.autocast else torch.float32
    mixed = len(made.labels_of) > 1
    member_sums = torch.zeros(len(made.labels_of), dtype=torch.float64, device=ctx.device)
    if dist.enabled:  # masking and n_labels above are over the global batch
        mine = rank_slice(n_rows, dist)
        inputs, labels, prefix, member = inputs[mine], labels[mine], prefix[mine], member[mine]
    if ctx.pin_memory:
        inputs = inputs.pin_memory()
    encoder = ctx.encoder if ctx.encoder is not None else family.encoder(model)  # (a compiled one has no bool)
    head_loss = LOSSES[spec.vocab_loss]
    micro = spec.micro_batch_size or len(inputs)
    first = rank_slice(n_rows, dist).start // micro  # this rank's first micro-batch in the global batch
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for index, start in enumerate(range(0, len(inputs), micro), start=first):
        rows = slice(start, start + micro)
        x = inputs[rows].to(ctx.device, non_blocking=True)
        # the labelled positions found on the host: a boolean index on the device would wait for it
        flat = labels[rows].flatten()
        where = torch.nonzero(flat != -100).flatten()
        y = flat[where]
        members = member[rows][:, None].expand_as(labels[rows]).flatten()[where] if mixed else None
        where, y = (
            (t.pin_memory() if ctx.pin_memory else t).to(ctx.device, non_blocking=True) for t in (where, y)
        )
        with (
            autocast(ctx.device, ctx.autocast),
            kernel_priority(ctx.device, spec.deterministic),
            cpu_dropout(_dropout_seed(spec.seed, global_step, index), ctx.device, ctx.encoder is not None),
            attention_for(
                model,
                family,
                pattern_of_rows(prefix[rows], x.shape[1]),
                x.shape[1],
                mask_dtype,
                ctx.device,
                docs[rank_slice(n_rows, dist)][start : start + micro] if spec.document_masking else None,
                prefix=prefix[rows],
            ) as attn,
        ):
            hidden = encoder(input_ids=x, attention_mask=attn).last_hidden_state
            features = family.transform(model, hidden.flatten(0, 1)[where])
            loss = batch_loss(head_loss, family.decoder(model), features, y, members, member_sums) / n_labels
        del features, hidden  # backward keeps what it needs
        loss.backward()
        total += loss.detach().double()
    if dist.enabled:
        dist.sum_grads([p.grad for p in opt.trainable() if p.grad is not None])
        total = dist.sum_tensor(total)
        member_sums = dist.sum_tensor(member_sums)
    if notes is not None:
        notes.update(step_notes(made, member_sums, mixed))

    norms = step_norms(opt.named, ctx.layer_params, opt.trainable(), spec.optim.grad_clip)
    for group in opt.torch.param_groups:
        group["lr"] = lr
    opt.torch.step()
    opt.torch.zero_grad(set_to_none=True)
    return total, norms


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def setup(spec: RunSpec, dist: Dist | None = None, log: Log = print) -> tuple[Context, object, list[PhasePlan]]:
    """Model, tokenizer, packed data and phase plans: everything a run needs before its first step."""
    dist = dist or Dist()
    check_data_parallel(spec, dist.world_size)
    device = pick_device(spec.device, dist.local_rank)
    set_determinism(spec.deterministic)  # before the model touches the device (cuBLAS)
    tokenizer = load_tokenizer(spec.tokenizer or spec.model)
    for data in readings(spec):  # tokenized here, once, where `ablate prepare` has not prepared it
        ensure_prepared(data, tokenizer)
    streams = Streams(spec, tokenizer)  # memory-mapped, read only
    sequences, doc_ids = streams.first
    streams.check()
    model = load_masked_lm(spec.model, spec.attn_implementation, seed=spec.seed).to(device)
    family = family_of(model.config)
    plans = plan_phases(spec, n_layers(model.config))
    names = [n for n, _ in model.named_parameters()]
    for plan in plans:
        if all(is_frozen(n, family, plan.frozen) for n in names):
            raise SpecError(
                "the freeze mask leaves nothing to train",
                key=f"phases[{plan.index}].freeze",
                value=",".join(plan.spec.freeze),
            )
    special = sorted(set(tokenizer.all_special_ids))
    ctx = Context(
        spec,
        model,
        family,
        device,
        sequences,
        doc_ids,
        SequenceOrder(len(sequences), spec.data.data_seed),
        torch.tensor(special),
        tokenizer.mask_token_id,
        model.config.vocab_size,
        layer_params(model),
        autocast=uses_autocast(spec, device),
        dist=dist,
        pin_memory=device.type == "cuda",
        streams=streams,
    )
    if uses_compile(spec, device):
        encoder = family.encoder(model)
        phases = {(p.spec.objective, str(p.frozen.describe())) for p in plans}
        limit = compiled.recompile_limit(encoder, family, phases)
        ctx.encoder = compiled.CompiledEncoder(encoder, family, log, limit)
    return ctx, tokenizer, plans


def pretrain(
    spec: RunSpec,
    run_dir: Path,
    log: Log = print,
    phase_end_hooks: tuple[PhaseEndHook, ...] = (),
    progress: Callable[[dict], None] | None = None,
    stop_after_steps: int | None = None,
    on_log: Callable[[TrainState], None] | None = None,
    after_checkpoint: Callable[[int], None] | None = None,
) -> TrainState:
    """Run (or resume) the phases of `spec` in `run_dir`; the final model lands in run_dir/model.

    stop_after_steps ends the call after that many optimizer steps of this call (a checkpoint is written
    first): how tests and the launcher simulate a preemption at a known point.

    Under torch.distributed (RANK/WORLD_SIZE in the environment, or several submitit tasks) every rank calls
    this; the process group is joined here (and left at the end if created here). Ranks other than 0 do not
    log, report progress, run phase-end hooks or write anything; every rank returns the same state, except
    layer_rows from hooks, which only rank 0 holds.

    on_log(state) is called on rank 0 at each log step, after the phase-end measures when the step ends a
    phase: what feeds the trackers (state.curves, grad_norms, layer_rows so far).

    after_checkpoint(global step) is called after each checkpoint written during the steps (the launcher's
    test hook, ablate.launch.pause, holds a run there)."""
    run_dir = Path(run_dir)
    dist = init_distributed(pick_device(spec.device).type)
    try:
        return _pretrain(
            spec, run_dir, dist, log, phase_end_hooks, progress, stop_after_steps, on_log, after_checkpoint
        )
    finally:
        dist.close()


def _pretrain(
    spec: RunSpec,
    run_dir: Path,
    dist: Dist,
    log: Log,
    phase_end_hooks: tuple[PhaseEndHook, ...],
    progress: Callable[[dict], None] | None,
    stop_after_steps: int | None,
    on_log: Callable[[TrainState], None] | None = None,
    after_checkpoint: Callable[[int], None] | None = None,
) -> TrainState:
    main = dist.is_main
    if not main:
        log, progress, phase_end_hooks, on_log = _silent, None, (), None
    ckpt_root = run_dir / "checkpoints"
    ctx, tokenizer, plans = setup(spec, dist, log)
    compile_cache = _CompileCache(ctx.encoder, compiled.cache_dir(run_dir) if main else None, log)
    preflight_run(ctx.model, ctx.family, plans, ctx.sequences, ctx.device, ctx.autocast, log)
    _log_plan(log, spec, dist, plans)
    model, family, groups = ctx.model, ctx.family, ctx.layer_params
    params = dict(model.named_parameters())
    base = {n: params[n].detach().float().cpu().clone() for names in groups.values() for n in names}
    opt = Optimizer(model, spec, fused=fused_adamw(ctx.device))
    keep = set(branch_points(run_dir))  # steps whose checkpoints children of a sweep's tree start from
    unread = Unread()  # each step's loss and norms, read back at log lines, phase ends and checkpoints

    def checkpoint() -> None:
        unread.settle(state)
        if main:
            save_checkpoint(ckpt_root, model, opt, state, keep=state.global_step in keep)
        dist.barrier()

    state = _resume(ckpt_root, model, opt, log)
    state.frozen = frozen_rows(plans)  # the plan as resolved for this run, recorded by the worker
    dist.barrier()  # every rank has read the checkpoint before rank 0 may replace it
    total_steps = sum(p.steps for p in plans)
    model.train()
    steps_this_call = 0
    started = time.perf_counter() - state.elapsed_s
    while state.phase_index < len(plans) and not state.done:
        plan = plans[state.phase_index]
        start_phase(model, family, plan, spec.phases, opt)
        peak = plan.spec.lr.peak_lr or spec.optim.lr
        window_start, window_tokens = time.perf_counter(), 0
        if state.step_in_phase == plan.steps:  # started from a parent's checkpoint at this phase's end
            _finish_phase(state, plan, model, base, groups, phase_end_hooks)
            if on_log:
                on_log(state)
            checkpoint()
            continue

        while state.step_in_phase < plan.steps:
            lr = lr_at(plan.spec.lr, peak, state.step_in_phase, plan.steps)
            batch, docs, members = ctx.streams.read(state.phase_index, state.step_in_phase)
            notes: dict = {}
            loss, norms = train_step(ctx, plan, batch, docs, state.global_step, opt, lr, notes)
            compile_cache.save_if_compiled()
            state.advance(plan.name, batch)
            read = state.advance_sources(ctx.streams.labels(plan.index), members, batch)  # a parent's count too
            notes.update(read if ctx.streams.by_members else {})
            unread.add(state, plan.name, lr, loss, norms, notes)
            steps_this_call += 1
            window_tokens += batch.size
            last_of_phase = state.step_in_phase == plan.steps
            logging = state.global_step % spec.log_every == 0 or last_of_phase
            if logging:
                unread.settle(state)
                tps = window_tokens / max(time.perf_counter() - window_start, 1e-9)
                _log_step(
                    log,
                    progress,
                    plan,
                    state,
                    state.curves[-1]["loss"],
                    lr,
                    total_steps,
                    tps,
                    spec.tokens_per_step,
                )
                window_start, window_tokens = time.perf_counter(), 0
            if last_of_phase:
                _finish_phase(state, plan, model, base, groups, phase_end_hooks)
            if logging and on_log:
                on_log(state)
            state.elapsed_s = time.perf_counter() - started
            stopping = stop_after_steps is not None and steps_this_call >= stop_after_steps
            if (
                last_of_phase
                or state.global_step % spec.checkpoint_every == 0
                or stopping
                or state.global_step in keep
            ):
                checkpoint()
                if after_checkpoint:
                    after_checkpoint(state.global_step)
            if stopping:
                log(f"stopping after {steps_this_call} steps (checkpoint at step {state.global_step})")
                return state
            if last_of_phase:
                break

    _finish_run(state, started, main, model, tokenizer, run_dir, checkpoint)
    dist.barrier()
    return state


def _finish_run(
    state: TrainState, started: float, main: bool, model, tokenizer, run_dir: Path, checkpoint: Callable[[], None]
) -> None:
    """The final model, and the last checkpoint marked done (a rerun of a done run only restores the model)."""
    if not state.done:
        state.done = True
        state.elapsed_s = time.perf_counter() - started
        if main:
            save_final_model(model, tokenizer, run_dir / "model")
        checkpoint()
    elif main and not (run_dir / "model" / "config.json").is_file():
        save_final_model(model, tokenizer, run_dir / "model")


@dataclass
class _CompileCache:
    """The compiled encoder's cache across processes: loaded before the first step, saved after a step that
    compiled (ablate.train.compiled)."""

    encoder: compiled.CompiledEncoder | None
    folder: Path | None
    log: Log
    saved_at: int = 0  # graphs compiled when last saved
    last: Path | None = None

    def __post_init__(self) -> None:
        if self.encoder is None or self.folder is None:
            return
        loaded = compiled.load_cache(self.folder, self.log)
        if loaded:
            self.log(f"torch.compile cache: {loaded} file(s) loaded from {self.folder}")

    def save_if_compiled(self) -> None:
        if self.encoder is None or self.folder is None or self.encoder.graphs == self.saved_at:
            return
        self.saved_at = self.encoder.graphs
        self.last = compiled.save_cache(self.folder, self.last)


def _silent(_message: str) -> None:
    pass


def _log_plan(log: Log, spec: RunSpec, dist: Dist, plans: list[PhasePlan]) -> None:
    """What the run is about to do: the ranks, and each phase's objective, length and frozen groups."""
    if dist.enabled:
        log(
            f"data parallel: {dist.world_size} ranks, {spec.batch_size // dist.world_size} sequences per rank "
            f"per step"
        )
    for p in plans:
        log(f"phase {p.name}: {p.spec.objective}, {p.steps} steps, frozen: {p.frozen.describe() or 'nothing'}")


def _resume(ckpt_root: Path, model, opt: Optimizer, log: Log) -> TrainState:
    """The state of the last complete checkpoint (weights and moments loaded), or a fresh one."""
    found = latest_checkpoint(ckpt_root)
    if found is None:
        return TrainState()
    state = load_checkpoint(found, model, opt)
    log(
        f"resumed from {found.name}: phase {state.phase_index}, step {state.global_step}, "
        f"{state.tokens_seen} tokens seen"
    )
    return state


def _log_step(
    log: Log,
    progress,
    plan: PhasePlan,
    state: TrainState,
    loss: float,
    lr: float,
    total_steps: int,
    tokens_per_s: float,
    tokens_per_step: int,
) -> None:
    """The progress line in the log, and what `ablate status` shows."""
    remaining = (total_steps - state.global_step) * tokens_per_step / tokens_per_s if tokens_per_s else 0.0
    log(
        f"{plan.name} {state.step_in_phase}/{plan.steps} | step {state.global_step}/{total_steps} "
        f"| loss {loss:.4f} | lr {lr:.2e} | {tokens_per_s:,.0f} tok/s | ETA {_fmt_time(remaining)}"
    )
    if progress:
        progress(
            {
                "phase": plan.name,
                "step": state.global_step,
                "total_steps": total_steps,
                "loss": loss,
                "tokens_per_s": tokens_per_s,
                "eta_s": remaining,
            }
        )


def _finish_phase(state: TrainState, plan: PhasePlan, model, base, groups, hooks) -> None:
    """Measures at the end of a phase, then move the state to the next phase."""
    for layer, value in weight_rel_change(dict(model.named_parameters()), base, groups).items():
        state.layer_rows.append(
            {"phase": plan.name, "layer": layer, "measure": "weight_rel_change", "value": value}
        )
    for layer in groups:
        total = state.grad_norm_sums.get(f"{plan.name}/{layer}")
        if total is not None:
            state.layer_rows.append(
                {"phase": plan.name, "layer": layer, "measure": "grad_norm", "value": total / plan.steps}
            )
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for hook in hooks:
            state.layer_rows += [{"phase": plan.name, **row} for row in hook(plan.name, model)]
    model.train(was_training)
    state.phase_index += 1
    state.step_in_phase = 0
