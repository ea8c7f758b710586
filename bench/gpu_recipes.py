"""What bench/gpu_check.py times: ablate's training step (as a run takes it, or as it ran before flash varlen
and the per-block compile: `todays_step`) and the transformers Trainer recipe, on one model config, batch and
random tokens; each returns its raw measurements, which gpu_check.py turns into rows. Also what both GPU checks
share: the warm-up that covers every timed batch, the first-time cost split from the steady step, and a row's
hard time limit.

A row's micro-batches are a pool of `warmup` distinct ones: the warm-up steps run each of them once, untimed,
and the timed steps cycle over the same pool, so no timed step meets a shape (a padded length, a document mix)
for the first time. What the warm-up cost beyond its steps at the steady step time is the row's first-time cost
(`first_time_s`: compiling where the path compiles, kernel plans, allocator growth), reported apart.

Documents: fixed ones of DOC_TOKENS, or drawn (seeded) from a corpus's document lengths
(bench/document_lengths.json, made by bench/document_lengths.py) and packed into rows as a prepared corpus is:
one stream of documents cut at the row length, a document that crosses a row's end continuing in the next.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

DOC_TOKENS = 512  # the fixed documents: 512 tokens each (a quarter of a row in tiny rows)
LENGTHS_TABLE = Path(__file__).resolve().parent / "document_lengths.json"  # bench/document_lengths.py made it


class RowTimeout(BaseException):
    """A row past its hard time limit (a BaseException: torch's compile code catches Exception)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """RowTimeout raised in the main thread once `seconds` have passed (a compile that would not end in a
    row's budget is stopped where it is); no limit off the main thread or without SIGALRM."""
    if (
        seconds == float("inf")
        or not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return

    def fire(_signum, _frame):
        raise RowTimeout(f"stopped at its hard limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Measured:
    """One recipe's warm-up and timed steps."""

    step_s: list[float] = field(default_factory=list)  # the timed steps' wall seconds (CUDA-synchronised)
    warmup_s: list[float] = field(default_factory=list)  # the warm-up steps' wall seconds
    order: list[tuple[str, int]] = field(default_factory=list)  # ("warm" or "timed", micro-batch) per step
    first_loss: float = float("nan")  # the first step's loss (seed 0)
    peak_bytes: int | None = None  # torch.cuda.max_memory_allocated over the timed steps
    labelled: int = 0  # positions the head runs at in one step (the executed FLOPs of the head)
    documents: list | None = None  # per micro-batch of the pool, each row's document lengths (documents only)
    graphs: int | None = None  # block graphs compiled (None: eager)
    fallbacks: list[str] = field(default_factory=list)  # blocks the compiler gave up on (they ran eager)
    compile_log: list[str] = field(default_factory=list)  # what the compiled encoder logged
    stopped: str | None = None  # why the row ended before timing (its warm-up ran past its budget)


def first_time_s(warmup_s: list[float], step_s: list[float]) -> float | None:
    """The warm-up's wall seconds beyond its steps at the steady (median timed) step time: what the row paid
    once (compiling, kernel plans, allocator growth)."""
    if not warmup_s or not step_s:
        return None
    return round(max(sum(warmup_s) - len(warmup_s) * statistics.median(step_s), 0.0), 3)


def warmed_before_timed(order) -> bool:
    """Whether every timed (path..., micro-batch) step was run untimed before the first timed step."""
    timed = [i for i, (phase, *_rest) in enumerate(order) if phase == "timed"]
    if not timed:
        return True
    warmed = {tuple(rest) for phase, *rest in order[: timed[0]] if phase == "warm"}
    return all(tuple(rest) in warmed for phase, *rest in order if phase == "timed")


def doc_tokens(seq_len: int) -> int:
    return min(DOC_TOKENS, max(seq_len // 4, 1))


def corpus_percentiles(corpus: str) -> list[int]:
    """The 0th..100th percentiles of a corpus's document lengths (bench/document_lengths.json)."""
    corpora = json.loads(LENGTHS_TABLE.read_text())["corpora"]
    if corpus not in corpora:
        raise ValueError(f"{LENGTHS_TABLE.name} has no corpus {corpus!r}; it has {sorted(corpora)}")
    return corpora[corpus]["percentiles"]


def draw_document_lengths(percentiles, n: int, rng):
    """n lengths from the percentiles' distribution (uniform within each percentile step), at least 1."""
    import numpy as np

    table = np.asarray(percentiles, dtype=float)
    steps = len(table) - 1
    at = rng.random(n) * steps
    low = np.minimum(at.astype(int), steps - 1)
    return np.maximum(np.rint(table[low] + (at - low) * (table[low + 1] - table[low])), 1).astype(np.int64)


def packed_documents(n_seq: int, seq_len: int, corpus: str, seed: int):
    """Document ids (n_seq, seq_len) of documents drawn (seed) from `corpus`'s lengths, packed as a prepared
    corpus is: one stream cut at the row length."""
    import numpy as np

    rng = np.random.default_rng(seed)
    percentiles, need, lengths = corpus_percentiles(corpus), n_seq * seq_len, []
    while sum(int(x.sum()) for x in lengths) < need:
        lengths.append(draw_document_lengths(percentiles, max(need // 100, 16), rng))
    drawn = np.concatenate(lengths)
    return np.repeat(np.arange(len(drawn)), drawn)[:need].reshape(n_seq, seq_len)


def row_document_lengths(docs) -> list[list[int]]:
    """Each row's document lengths (its runs of one id)."""
    import numpy as np

    out = []
    for row in docs:
        bounds = [0, *(np.flatnonzero(row[1:] != row[:-1]) + 1).tolist(), len(row)]
        out.append([b - a for a, b in zip(bounds[:-1], bounds[1:])])
    return out


def random_tokens(n_seq: int, seq_len: int, vocab: int, special: set[int], seed: int, corpus: str | None = None):
    """Token ids drawn away from special ids, and document ids per position: documents of doc_tokens, or
    packed from `corpus`'s document lengths."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(n_seq, seq_len), dtype=np.int64)
    for s in special:
        ids[ids == s] = 1000
    if corpus is not None:
        return ids, packed_documents(n_seq, seq_len, corpus, seed)
    docs = np.broadcast_to(np.arange(seq_len) // doc_tokens(seq_len), (n_seq, seq_len)).copy()
    return ids, docs


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

    from ablate.train import attention_masks, cpu, loop, vocab_loss

    def norms_then_clip(named, groups, trainable, max_norm):
        norms = _per_parameter_norms(named, groups)
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


def _per_parameter_norms(params, groups):
    """Today's gradient norms (ablate.analysis.probe.grad_norm_values at 5d638d2): per layer, each tensor's
    norm in its own dtype, combined in float64, one launch per parameter."""
    import torch

    layers, values = [], []
    for layer, names in groups.items():
        grads = [params[n].grad for n in names if params[n].grad is not None]
        if grads:
            layers.append(layer)
            values.append(
                torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g).double() for g in grads]))
            )
    return tuple(layers), torch.stack(values) if values else torch.zeros(0, dtype=torch.float64)


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
    spec, tokenizer, device, warmup: int, steps: int, budget_s: float, today: bool = False, profiler=None,
    corpus: str | None = None,
) -> Measured:  # fmt: skip
    """ablate.train.loop.train_step over random tokens (documents packed from `corpus`'s lengths, else of
    doc_tokens): a pool of `warmup` micro-batches, each run once untimed, then at most `steps` timed steps
    cycling over the pool (fewer past `budget_s`; none when the warm-up itself ran past it); the compiled
    encoder when the spec compiles (never for `today`), from a reset compiler (each row's graphs its own,
    counted against the recompile limit alone). A `profiler` (torch.profiler.profile, not started) records
    the timed steps."""
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
    compiling = uses_compile(spec, device) and not today
    if compiling:
        torch._dynamo.reset()
    model = load_masked_lm(spec.model, spec.attn_implementation, seed=0).to(device)
    model.train()
    family = family_of(model.config)
    plan = PhasePlan(0, spec.phases[0], warmup + steps, resolve_freeze(("none",), n_layers(model.config)))
    special = sorted(set(tokenizer.all_special_ids))
    batch, seq_len, pool = spec.batch_size, spec.data.seq_len, max(warmup, 1)
    vocab = min(model.config.vocab_size, len(tokenizer))
    seqs, docs = random_tokens(batch * pool, seq_len, vocab, set(special), seed=1, corpus=corpus)
    ctx = loop.Context(
        spec, model, family, device, seqs, docs, None, torch.tensor(special), tokenizer.mask_token_id,
        model.config.vocab_size, layer_params(model), autocast=uses_autocast(spec, device),
        pin_memory=device.type == "cuda",
    )  # fmt: skip
    out = Measured()
    if spec.document_masking:
        out.documents = [row_document_lengths(docs[b * batch : (b + 1) * batch]) for b in range(pool)]
    if compiling:
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
            index = step % pool
            rows = slice(index * batch, (index + 1) * batch)
            sync(device)
            t0 = time.perf_counter()
            loss, _ = loop.train_step(ctx, plan, seqs[rows], docs[rows], step, opt, 2e-4)
            sync(device)
            elapsed = time.perf_counter() - t0
            out.order.append(("warm" if step < warmup else "timed", index))
            if step == 0:
                out.first_loss = float(loss)
            if step == warmup - 1 and device.type == "cuda":  # the peak of the timed steps, not of compiling
                torch.cuda.reset_peak_memory_stats(device)
            over = time.monotonic() - started > budget_s
            if step < warmup:
                out.warmup_s.append(elapsed)
                if over:
                    out.stopped = f"its warm-up (first-time costs) ran past the row's {budget_s:.0f} s"
                    break
            else:
                out.step_s.append(elapsed)
                if over:
                    break
    out.peak_bytes = peak_bytes(device)
    if compiling:
        out.graphs = getattr(ctx.encoder, "graphs", None)
        out.fallbacks = list(getattr(ctx.encoder, "fallbacks", []))
    return out


def profile_ablate(spec, tokenizer, device, steps: int = 2, today: bool = False):
    """torch.profiler over `steps` steps after one untimed (the same micro-batch): the CPU ops with the device
    time their kernels took, for bench/gpu_check.py's kernel classes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities)
    measured = run_ablate(spec, tokenizer, device, 1, steps, float("inf"), today=today, profiler=prof)
    return prof, measured


def run_trainer(model_source: str, tokenizer, objective: str, seq_len: int, batch: int, device, warmup: int,
                steps: int, budget_s: float) -> Measured:  # fmt: skip
    """transformers' Trainer + DataCollatorForLanguageModeling (MLM 30%; CLM: the collator's mlm=False, a
    loss at every position of the MaskedLM head with bidirectional attention), bf16, AdamW as ablate's,
    clip 1.0, eager. Every batch has the one shape (rows of seq_len, no padding): its `warmup` steps warm
    every shape it times."""
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
    # the MaskedLM head runs at every position (ModernBERT's sparse_prediction is off): the loss reads 30%
    out = Measured(labelled=batch * seq_len)

    class Timer(TrainerCallback):
        def on_step_begin(self, *_a, **_k):
            sync(device)
            self.t0 = time.perf_counter()

        def on_step_end(self, _args, state, control, **_k):
            sync(device)
            elapsed = time.perf_counter() - self.t0
            timed = state.global_step > warmup
            (out.step_s if timed else out.warmup_s).append(elapsed)
            if state.global_step == warmup and cuda:  # the peak of the timed steps
                import torch

                torch.cuda.reset_peak_memory_stats(device)
            out.order.append(("timed" if timed else "warm", 0))  # one shape: "micro-batch" 0
            if time.monotonic() - started > budget_s:
                control.should_training_stop = True
                if not timed:
                    out.stopped = f"its warm-up (first-time costs) ran past the row's {budget_s:.0f} s"

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
