"""The two recipes bench/gpu_step.py times, one row each: ablate's training step and the transformers
Trainer's, on the same model config, batch and random tokens; the model FLOPs per token behind its MFU.
See bench/gpu_step.py for what each recipe does and how a row is measured.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    recipe: str
    objective: str
    seq_len: int
    documents: bool | None  # document masking (ablate rows); None: the Trainer recipe has none

    def fields(self) -> dict:
        return {
            "recipe": self.recipe,
            "objective": self.objective,
            "seq_len": self.seq_len,
            "documents": self.documents,
        }


# ---------------------------------------------------------------- FLOPs


def model_flops_per_token(model, seq_len: int) -> float:
    config = model.config
    embedding = model.get_input_embeddings().weight
    n = sum(p.numel() for p in model.parameters()) - embedding.numel()
    out = model.get_output_embeddings()
    if out is not None and out.weight is embedding:  # tied: the decoder matmul still happens
        n += embedding.numel()
    window = int(getattr(config, "local_attention", seq_len))
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    context = sum(seq_len if t == "full_attention" else min(seq_len, window + 1) for t in types)
    return 6.0 * n + 12.0 * context * config.hidden_size


# ---------------------------------------------------------------- data


def random_tokens(n_seq: int, seq_len: int, vocab: int, special: set[int], seed: int):
    """Token ids drawn away from special ids, and document ids (documents of 512 tokens) per position."""
    import numpy as np

    rng = np.random.default_rng(seed)
    high = vocab
    ids = rng.integers(1000, high, size=(n_seq, seq_len), dtype=np.int64)
    for s in special:
        ids[ids == s] = 1000
    docs = np.broadcast_to(np.arange(seq_len) // 512, (n_seq, seq_len)).copy()
    return ids, docs


# ---------------------------------------------------------------- the two recipes


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


def peak_gb(device) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def _spec_attn(args) -> str:
    """The RunSpec's attn_implementation: ablate_sdpa and flash_attention_2 are not spec values (the model is
    loaded with flash_attention_2 directly; ablate_sdpa is what the family runs under sdpa)."""
    return args.attn if args.attn in ("sdpa", "eager") else "sdpa"


def _model_attn(args) -> str:
    return "sdpa" if args.attn == "ablate_sdpa" else args.attn


def _over_budget(row_started: float, args, step: int) -> bool:
    """Stop timing steps: the row has spent its budget (after at least one timed step)."""
    return step >= args.warmup and time.monotonic() - row_started > args.row_budget_s


def run_ablate(args, row: Row, batch: int, tokenizer, device) -> dict:
    import torch

    from ablate.plan.freezing import resolve_freeze
    from ablate.models.families import family_of, n_layers
    from ablate.models.sources import load_masked_lm
    from ablate.plan.phases import PhasePlan
    from ablate.train.loop import Context, Optimizer, train_step
    from ablate.train.optimizer import fused_adamw
    from ablate.train.precision import compiled_encoder, uses_autocast
    from ablate.analysis.probe import layer_params
    from ablate.config.spec import parse_run_spec

    row_started = time.monotonic()
    objective, seq_len = row.objective, row.seq_len
    phase = {"name": objective, "objective": objective, "steps": args.warmup + args.steps}
    if objective == "mlm":
        phase["mask_rate"] = args.mask_rate
    spec = parse_run_spec(
        {
            "model": args.model,
            "tokenizer": args.tokenizer,
            "attn_implementation": _spec_attn(args),
            "data": {"corpus": "random", "seq_len": seq_len},
            "batch_size": batch,
            "device": device.type,
            "precision": args.precision,
            "compile": args.compile,
            "deterministic": args.deterministic,
            "document_masking": row.documents,
            "optim": {"lr": args.lr, "grad_clip": 1.0},
            "phases": [phase],
        }
    )
    model = load_masked_lm(args.model, _model_attn(args), seed=0).to(device)
    model.train()
    flops = model_flops_per_token(model, seq_len)
    family = family_of(model.config)
    mask = family.mask_kind(model.config._attn_implementation)
    if args.attn == "ablate_sdpa" and mask != "banded":
        return status_row(
            row,
            batch,
            f"skipped: {family.name} does not run ablate.models.attention under sdpa (mask kind {mask})",
        )
    plan = PhasePlan(
        0, spec.phases[0], args.warmup + args.steps, resolve_freeze(("none",), n_layers(model.config))
    )
    special = sorted(set(tokenizer.all_special_ids))
    n_seq = batch * (args.warmup + args.steps)
    seqs, docs = random_tokens(n_seq, seq_len, min(model.config.vocab_size, len(tokenizer)), set(special), seed=1)
    cuda = device.type == "cuda"
    ctx = Context(
        spec,
        model,
        family,
        device,
        seqs,
        docs,
        None,
        torch.tensor(special),
        tokenizer.mask_token_id,
        model.config.vocab_size,
        layer_params(model),
        autocast=uses_autocast(spec, device),
        pin_memory=cuda,
    )
    if args.compile:
        ctx.encoder = compiled_encoder(family.encoder(model))
    opt = Optimizer(model, spec, fused=fused_adamw(device))
    opt.set_trainable()
    reset_memory(device)
    times = []
    for step in range(args.warmup + args.steps):
        rows = slice(step * batch, (step + 1) * batch)
        sync(device)
        t0 = time.perf_counter()
        loss, _ = train_step(ctx, plan, seqs[rows], docs[rows], step, opt, args.lr)
        sync(device)
        times.append(time.perf_counter() - t0)
        if _over_budget(row_started, args, step):
            break
    peak = peak_gb(device)
    del ctx, opt, model
    out = {**_row(row, batch, times[args.warmup :], flops, peak, args, loss), "mask": mask}
    if getattr(args, "predict_memory", False):  # the dry run's prediction beside max_memory_allocated
        out["predicted_mem_gb"] = predicted_gb(spec, batch)
    return out


def predicted_gb(spec, batch: int) -> float:
    """What ablate.launch.gpu_memory traces on the meta device for this step (allocated bytes, as
    torch.cuda.max_memory_allocated counts them: no context, no cuBLAS workspace, no allocator slack)."""
    from ablate.launch import gpu_memory

    return round(gpu_memory.phase_memory(spec, batch)[0].traced / 2**30, 2)


def run_trainer(args, row: Row, batch: int, tokenizer, device) -> dict:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

    from ablate.models.sources import load_masked_lm

    row_started = time.monotonic()
    objective, seq_len = row.objective, row.seq_len
    model = load_masked_lm(args.model, _model_attn(args), seed=0)
    if args.attn == "ablate_sdpa":
        from ablate.models import attention

        model.set_attn_implementation(attention.IMPLEMENTATION)
    flops = model_flops_per_token(model, seq_len)
    special = set(tokenizer.all_special_ids)
    n_seq = batch * (args.warmup + args.steps)
    seqs, _ = random_tokens(n_seq, seq_len, min(model.config.vocab_size, len(tokenizer)), special, seed=1)
    dataset = [{"input_ids": row.tolist()} for row in seqs]
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=objective == "mlm", mlm_probability=args.mask_rate)
    cuda = device.type == "cuda"
    times: list[float] = []
    losses: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            sync(device)
            self.t0 = time.perf_counter()

        def on_step_end(self, _args, state, control, **k):
            sync(device)
            times.append(time.perf_counter() - self.t0)
            if _over_budget(row_started, args, state.global_step - 1):
                control.should_training_stop = True

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    targs = TrainingArguments(
        output_dir=str(Path(os.environ.get("TMPDIR", "/tmp")) / "ablate-gpu-step-trainer"),
        per_device_train_batch_size=batch,
        max_steps=args.warmup + args.steps,
        learning_rate=args.lr,
        weight_decay=1e-5,
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        bf16=args.precision == "bf16",
        use_cpu=not cuda,
        torch_compile=args.compile,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_pin_memory=cuda,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
        remove_unused_columns=False,
    )
    reset_memory(device)
    trainer = Trainer(model=model, args=targs, train_dataset=dataset, data_collator=collator, callbacks=[Timer()])
    trainer.train()
    peak = peak_gb(device)
    del trainer, model
    return _row(row, batch, times[args.warmup :], flops, peak, args, losses[-1] if losses else float("nan"))


def _row(row: Row, batch, times, flops_per_token, peak_gb, args, loss) -> dict:
    tokens = batch * row.seq_len * len(times)
    seconds = sum(times)
    tps = tokens / seconds if seconds else 0.0
    return {
        **row.fields(),
        "batch": batch,
        "timed_steps": len(times),
        "tokens_per_s": round(tps, 1),
        "vs_reference": round(tps / args.reference_tokens_per_s, 3),
        "step_s": round(seconds / max(len(times), 1), 4),
        "mfu": round(tps * flops_per_token / (args.peak_tflops * 1e12), 4),
        "peak_mem_gb": peak_gb,
        "last_loss": round(float(loss), 4),
        "status": "ok",
    }


def status_row(row: Row, batch, status: str, **more) -> dict:
    return {**row.fields(), "batch": batch, "status": status, **more}
