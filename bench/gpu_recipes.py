"""What bench/gpu_check.py times: ablate's training step (as a run takes it, or as it ran before flash varlen
and the per-block compile: `todays_step`) and the transformers Trainer recipe, on one model config, batch and
random tokens; each returns its raw measurements, which gpu_check.py turns into rows.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

DOC_TOKENS = 512  # the random batches' documents: 512 tokens each (a quarter of a row in tiny rows)


@dataclass
class Measured:
    """One recipe's timed steps."""

    step_s: list[float] = field(default_factory=list)  # the timed steps' wall seconds (CUDA-synchronised)
    first_loss: float = float("nan")  # the first step's loss (seed 0)
    peak_bytes: int | None = None  # torch.cuda.max_memory_allocated over the steps
    labelled: int = 0  # positions with a loss in one step (the executed FLOPs of the head)
    compile_log: list[str] = field(default_factory=list)  # what the compiled encoder logged


def doc_tokens(seq_len: int) -> int:
    return min(DOC_TOKENS, max(seq_len // 4, 1))


def random_tokens(n_seq: int, seq_len: int, vocab: int, special: set[int], seed: int):
    """Token ids drawn away from special ids, and document ids (documents of doc_tokens) per position."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(n_seq, seq_len), dtype=np.int64)
    for s in special:
        ids[ids == s] = 1000
    docs = np.broadcast_to(np.arange(seq_len) // doc_tokens(seq_len), (n_seq, seq_len)).copy()
    return ids, docs


def document_lengths(seq_len: int) -> list[int]:
    """A row's document lengths under random_tokens."""
    size = doc_tokens(seq_len)
    return [min(size, seq_len - start) for start in range(0, seq_len, size)]


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_memory(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device) -> int | None:
    import torch

    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


@contextlib.contextmanager
def todays_step():
    """The step as it ran before flash varlen (ablate at 5d638d2): eager, the CPU's attention paths on CUDA
    (local layers blocked SDPA, global layers SDPA in torch's own order, FlexAttention with documents), the
    vocabulary head in chunks of 512 positions through the CPU's loop, each parameter's gradient norm then
    clip_grad_norm_'s second pass."""
    from unittest import mock

    import torch

    from ablate.analysis.probe import grad_norm_values
    from ablate.train import attention_masks, cpu, loop, vocab_loss

    def norms_then_clip(named, groups, trainable, max_norm):
        norms = grad_norm_values(named, groups)
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(trainable, max_norm)
        return norms

    with (
        mock.patch.object(loop, "attention_for", functools.partial(attention_masks.attention_for, kernels="cpu")),
        mock.patch.object(loop, "kernel_priority", lambda *_a, **_k: contextlib.nullcontext()),
        mock.patch.object(loop, "step_norms", norms_then_clip),
        mock.patch.dict(
            vocab_loss.LOSSES,
            {"fused": functools.partial(vocab_loss.fused_cross_entropy, chunk=cpu.CHUNK, gpu=False)},
        ),
    ):
        yield


def ablate_spec(model: str, tokenizer: str, objective: str, seq_len: int, batch: int, steps: int, **more):
    """The RunSpec of a timed row: one phase of `steps`, bf16, MLM at the grids' 30%."""
    from ablate.config.spec import parse_run_spec

    phase = {"name": objective, "objective": objective, "steps": steps}
    if objective == "mlm":
        phase["mask_rate"] = 0.3
    return parse_run_spec(
        {
            "model": model,
            "tokenizer": tokenizer,
            "data": {"corpus": "random", "seq_len": seq_len},
            "batch_size": batch,
            "optim": {"lr": 2e-4, "grad_clip": 1.0},
            "phases": [phase],
            **more,
        }
    )


def run_ablate(
    spec, tokenizer, device, warmup: int, steps: int, budget_s: float, today: bool = False, profiler=None
) -> Measured:
    """ablate.train.loop.train_step over random tokens: `warmup` untimed steps then at most `steps` timed
    ones (fewer past `budget_s`); the compiled encoder when the spec compiles (never for `today`). A
    `profiler` (torch.profiler.profile, not started) records the timed steps."""
    import torch

    from ablate.analysis.probe import layer_params
    from ablate.models.families import family_of, n_layers
    from ablate.models.loading import load_masked_lm
    from ablate.plan.freezing import resolve_freeze
    from ablate.plan.phases import PhasePlan
    from ablate.train import compiled, loop
    from ablate.train.optimizer import Optimizer, fused_adamw
    from ablate.train.precision import uses_autocast, uses_compile

    started = time.monotonic()
    model = load_masked_lm(spec.model, spec.attn_implementation, seed=0).to(device)
    model.train()
    family = family_of(model.config)
    plan = PhasePlan(0, spec.phases[0], warmup + steps, resolve_freeze(("none",), n_layers(model.config)))
    special = sorted(set(tokenizer.all_special_ids))
    batch, seq_len = spec.batch_size, spec.data.seq_len
    vocab = min(model.config.vocab_size, len(tokenizer))
    seqs, docs = random_tokens(batch * (warmup + steps), seq_len, vocab, set(special), seed=1)
    ctx = loop.Context(
        spec, model, family, device, seqs, docs, None, torch.tensor(special), tokenizer.mask_token_id,
        model.config.vocab_size, layer_params(model), autocast=uses_autocast(spec, device),
        pin_memory=device.type == "cuda",
    )  # fmt: skip
    out = Measured()
    if uses_compile(spec, device) and not today:
        limit = compiled.recompile_limit(family.encoder(model), family, {spec.phases[0].objective})
        ctx.encoder = compiled.CompiledEncoder(family.encoder(model), family, out.compile_log.append, limit)
    opt = Optimizer(model, spec, fused=fused_adamw(device))
    opt.set_trainable()
    out.labelled = int((loop.objective_batch(ctx, plan, seqs[:batch], docs[:batch], 0).labels != -100).sum())
    reset_memory(device)
    with todays_step() if today else contextlib.nullcontext(), contextlib.ExitStack() as recording:
        for step in range(warmup + steps):
            if step == warmup and profiler is not None:
                recording.enter_context(profiler)
            rows = slice(step * batch, (step + 1) * batch)
            sync(device)
            t0 = time.perf_counter()
            loss, _ = loop.train_step(ctx, plan, seqs[rows], docs[rows], step, opt, 2e-4)
            sync(device)
            if step == 0:
                out.first_loss = float(loss)
            if step == warmup - 1 and device.type == "cuda":  # the peak of the timed steps, not of compiling
                torch.cuda.reset_peak_memory_stats(device)
            if step >= warmup:
                out.step_s.append(time.perf_counter() - t0)
                if time.monotonic() - started > budget_s:
                    break
    out.peak_bytes = peak_bytes(device)
    return out


def profile_ablate(spec, tokenizer, device, steps: int = 2, today: bool = False):
    """torch.profiler over `steps` steps after one untimed: the CPU ops with the device time their kernels
    took, for bench/gpu_check.py's kernel classes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities)
    measured = run_ablate(spec, tokenizer, device, 1, steps, float("inf"), today=today, profiler=prof)
    return prof, measured


def run_trainer(model_source: str, tokenizer, objective: str, seq_len: int, batch: int, device, warmup: int,
                steps: int, budget_s: float) -> Measured:  # fmt: skip
    """transformers' Trainer + DataCollatorForLanguageModeling (MLM 30%; CLM: the collator's mlm=False, a
    loss at every position of the MaskedLM head with bidirectional attention), bf16, AdamW as ablate's,
    clip 1.0, eager."""
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    from ablate.models.loading import load_masked_lm

    started = time.monotonic()
    model = load_masked_lm(model_source, "sdpa", seed=0)
    special = set(tokenizer.all_special_ids)
    seqs, _ = random_tokens(
        batch * (warmup + steps), seq_len, min(model.config.vocab_size, len(tokenizer)), special, 1
    )
    dataset = [{"input_ids": row.tolist()} for row in seqs]
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=objective == "mlm", mlm_probability=0.3)
    cuda = device.type == "cuda"
    out = Measured(labelled=int(0.3 * batch * seq_len) if objective == "mlm" else batch * seq_len)

    class Timer(TrainerCallback):
        def on_step_begin(self, *_a, **_k):
            sync(device)
            self.t0 = time.perf_counter()

        def on_step_end(self, _args, state, control, **_k):
            sync(device)
            if state.global_step > warmup:
                out.step_s.append(time.perf_counter() - self.t0)
                if time.monotonic() - started > budget_s:
                    control.should_training_stop = True

        def on_log(self, _args, _state, _control, logs=None, **_k):
            if logs and "loss" in logs and out.first_loss != out.first_loss:  # nan: the first logged loss
                out.first_loss = float(logs["loss"])

    targs = TrainingArguments(
        output_dir=str(Path(os.environ.get("TMPDIR", "/tmp")) / "ablate-gpu-check-trainer"),
        per_device_train_batch_size=batch, max_steps=warmup + steps, learning_rate=2e-4, weight_decay=1e-5,
        adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="constant",
        warmup_steps=0, bf16=True, use_cpu=not cuda, logging_steps=1, save_strategy="no", report_to=[],
        dataloader_pin_memory=cuda, dataloader_num_workers=0, disable_tqdm=True, seed=0,
        remove_unused_columns=False,
    )  # fmt: skip
    reset_memory(device)
    trainer = Trainer(model=model, args=targs, train_dataset=dataset, data_collator=collator, callbacks=[Timer()])
    trainer.remove_callback(PrinterCallback)  # its log lines would interleave with the check's JSON lines
    trainer.train()
    out.peak_bytes = peak_bytes(device)
    return out
