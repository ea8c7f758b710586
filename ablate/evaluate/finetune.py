"""Downstream fine-tuning of one checkpoint on one task with one seed.

`finetune` trains with a plain loop (AdamW, linear warmup (warmup_ratio) then linear decay, optional early stopping
on the task's first metric; batches padded to their own longest example, grouped by length unless the settings say
otherwise, optionally run on CPU as length-sorted pieces: ablate.evaluate.batching; forward passes under bf16
autocast on CUDA by `precision`, as pretraining's: ablate.train.precision) and returns score rows for dev and test,
test taken at the best dev epoch. Sequence tasks pool as the settings say (ablate.evaluate.pooling); multi-label
tasks weigh each label's positives by its negatives / positives in train (multi_label_pos_weight); max_length is
capped at the model's context; data_seed, when set, seeds batch order and dropout after the head is initialised
with the fine-tuning seed.
The resumable task x seed loop over score files is ablate.evaluate.score_files.

The task type's entry (ablate.evaluate.task_types) builds the model, encodes, collates the labels, gives the
loss and decodes; with max_steps (span_ner) training runs that many steps and evaluates dev every eval_every,
an "epoch" of the score rows then being one such evaluation. The best dev epoch is the task's first metric's,
unless the entry's `selection` names another (span_ner's sampled_span_f1, tabib's checkpoint score).

May import: config, models, train (precision, attention_masks), evaluate (tasks, task_types, batching,
finetune_progress).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import math
import random
import time
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np
import torch
from transformers import AutoConfig, AutoTokenizer

from ablate.evaluate.batching import Encoded, collate, epoch_batches, length_pieces, piece_overhead
from ablate.evaluate.finetune_progress import FinetuneProgress
from ablate.config.errors import SpecError
from ablate.evaluate.task_types import compute, task_type
from ablate.evaluate.task_types.classification import pos_weight
from ablate.evaluate.task_types.token_ner import align_word_labels
from ablate.evaluate.tasks import Example, FinetuneSettings, TaskSpec, capped, load_task_data
from ablate.models.families import FAMILIES, family_of
from ablate.train.attention_masks import padded_attention
from ablate.train.precision import autocast_on

__all__ = [
    "FinetuneSettings",
    "finetune",
    "encode",
    "align_word_labels",
    "pos_weight",
    "context_length",
    "resolve_precision",
]

# LoRA adapters go on the attention projections named by the model's family entry (lora_targets); the modules
# in its lora_full, when the model has them, are trained in full because they may be freshly initialised
# (BERT's pooler is absent from *ForMaskedLM checkpoints; ModernBERT's head is absent from a bare
# ModernBertModel). A model of no family needs finetune.lora_target_modules, and gets _LORA_FULL.
_LORA_FULL = ("pooler", "head")


def encode(
    tokenizer, task: TaskSpec, examples: list[Example], labels: tuple[str, ...], max_length: int
) -> list[Encoded]:
    return task.entry.encode(tokenizer, examples, labels, max_length)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _load_model(model_dir: str, task: TaskSpec, labels: tuple[str, ...], settings: FinetuneSettings):
    model = task.entry.head(model_dir, labels, settings)
    if settings.method == "lora":
        model = _wrap_lora(model, task, settings)
    return model


def _wrap_lora(model, task: TaskSpec, settings: FinetuneSettings):
    from peft import LoraConfig, TaskType, get_peft_model

    model_type = model.config.model_type
    try:
        family = family_of(model.config)
    except SpecError:
        family = None
    targets = settings.lora_target_modules or (family.lora_targets if family else None)
    if not targets:
        raise SpecError(
            f"no default LoRA target modules for model type {model_type!r} (no family entry)",
            key="finetune.lora_target_modules",
            allowed="set them explicitly, or use a model of a family: " + ", ".join(FAMILIES),
        )
    full = family.lora_full if family else _LORA_FULL
    leaf = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in targets if t.rsplit(".", 1)[-1] not in leaf]
    if missing:
        raise SpecError(
            f"LoRA target modules not in this {model_type} model",
            key="finetune.lora_target_modules",
            value=missing,
        )
    config = LoraConfig(
        task_type=getattr(TaskType, task.entry.lora_task),
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=list(targets),
        modules_to_save=[m for m in full if m in leaf],
    )
    return get_peft_model(model, config)


def _takes_token_types(model) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a LoRA wrapper
    return "token_type_ids" in inspect.signature(base.forward).parameters


def resolve_precision(settings: FinetuneSettings, device: str) -> FinetuneSettings:
    """The settings with `precision` as it computes on `device` (auto: bf16 on CUDA, fp32 elsewhere), so that a
    score's identity and record say what it was computed in."""
    return settings.model_copy(update={"precision": "bf16" if autocast_on(settings.precision, device) else "fp32"})


def _autocast(settings: FinetuneSettings, device: str):
    """bf16 autocast where the precision setting asks for it on `device` (a disabled context elsewhere)."""
    return torch.autocast(
        torch.device(device).type, dtype=torch.bfloat16, enabled=autocast_on(settings.precision, device)
    )


def _predict(
    model,
    task: TaskSpec,
    data: list[Encoded],
    labels: tuple[str, ...],
    examples: list[Example],
    batch_size: int,
    to_batch: Callable[[list[Encoded]], dict],
    device: str,
    autocast=None,
    bf16: bool = False,
) -> list:
    """Predictions in the form metrics take (the task type's decode). autocast: a context each forward runs
    in (None: none); bf16: the forward computes in bf16 (padding then left out of attention on CUDA)."""
    model.eval()
    order = sorted(range(len(data)), key=lambda i: len(data[i].input_ids))  # less padding
    preds: list[Any] = [None] * len(data)
    with torch.inference_mode(), autocast or contextlib.nullcontext():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = to_batch([data[i] for i in idx])
            for key in task.entry.targets:
                batch.pop(key)
            with _unpadded(model, batch, device, bf16):
                outputs = model(**{k: v.to(device) for k, v in batch.items()})
            decoded = task.entry.decode(outputs, [data[i] for i in idx], labels, [examples[i] for i in idx])
            for i, p in zip(idx, decoded):
                preds[i] = p
    return preds


def _decode(type_name: str, logits: torch.Tensor, item: Encoded, labels: tuple[str, ...], n_words: int):
    """One row of a Hugging Face head's logits decoded by the type's entry (n_words: a token task's words)."""
    outputs = type("Outputs", (), {"logits": logits.unsqueeze(0)})
    return task_type(type_name).decode(outputs, [item], labels, [Example(("",) * n_words, ())])[0]


def _gold(task: TaskSpec, examples: list[Example]) -> list:
    return [task.entry.gold(ex) for ex in examples]


def _lr_factor(warmup: int, total: int):
    def factor(step: int) -> float:  # step = updates done so far
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def _better(value: float, best: float | None) -> bool:
    return best is None or (not math.isnan(value) and (math.isnan(best) or value > best))


def context_length(model_dir: str, tokenizer=None) -> int | None:
    """The longest input the model takes: its max_position_embeddings, or the tokenizer's model_max_length
    when that is smaller (RoBERTa-style models reserve positions for padding); None when neither says."""
    n = getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", None)
    told = getattr(tokenizer, "model_max_length", None)
    if isinstance(told, int) and told < 10**9:
        n = told if n is None else min(n, told)
    return n


def _max_length(
    model_dir: str, tokenizer, task: TaskSpec, settings: FinetuneSettings, log: Callable[[str], None] | None
) -> int:
    wanted = settings.max_length or task.max_length
    context = context_length(model_dir, tokenizer)
    if context is None or wanted <= context:
        return wanted
    if log is not None:
        log(
            f"{task.name}: max_length {wanted} is more than the model's context ({context} positions); "
            f"inputs are cut at {context}"
        )
    return context


class _Optim(NamedTuple):
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    params: list[torch.nn.Parameter]  # the trainable ones


def _optimizer(model, settings: FinetuneSettings, device: str, total_steps: int) -> _Optim:
    """AdamW (fused on CPU and CUDA), linear warmup then linear decay over total_steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    # No weight decay on biases and normalisation weights (the 1-d parameters). head_lr: everything outside
    # the model's `encoder` (the span model's BiLSTM and heads) learns at its own rate.
    encoder = {id(p) for p in model.encoder.parameters()} if settings.head_lr is not None else None
    groups = []
    for rate, part in (
        (settings.lr, [p for p in params if encoder is None or id(p) in encoder]),
        (settings.head_lr, [p for p in params if encoder is not None and id(p) not in encoder]),
    ):
        groups += [
            {"params": [p for p in part if p.ndim >= 2], "weight_decay": settings.weight_decay, "lr": rate},
            {"params": [p for p in part if p.ndim < 2], "weight_decay": 0.0, "lr": rate},
        ]
    optimizer = torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=settings.lr, fused=torch.device(device).type in ("cpu", "cuda")
    )
    warmup = round(total_steps * settings.warmup_ratio)
    return _Optim(optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(warmup, total_steps)), params)


def _loss_fn(task: TaskSpec, settings: FinetuneSettings, train: list[Encoded], n_labels: int, device: str):
    """None (the model's own loss), or the type's loss of (logits, labels)."""
    return task.entry.loss(settings, train, n_labels, device)


def _pieces(
    items: list[Encoded], type_name: str, to_batch: Callable[[list[Encoded]], dict], overhead: int | None
) -> list[tuple[dict, float]]:
    """One batch as the length-sorted pieces it is run in (batching.length_pieces), each with its share of the
    batch's loss terms (labelled tokens for token classification, else examples). A piece's mean loss times its
    share adds up to the whole batch's mean loss, so the step is the batch's, as if it were padded together."""
    terms = [task_type(type_name).loss_terms(it) for it in items]
    total = sum(terms)
    shares = (
        [
            (idx, sum(terms[i] for i in idx) / total)
            for idx in length_pieces([len(it.input_ids) for it in items], overhead)
        ]
        if total
        else []
    )
    return [(to_batch([items[i] for i in idx]), share) for idx, share in shares if share]


def _unpadded(model, batch: dict, device: str, bf16: bool):
    """On the CUDA kernels in bf16, the encoder's attention over each row's tokens alone (flash variable
    length, the rows' lengths read from the host batch; ablate.train.attention_masks.padded_attention); elsewhere
    nothing."""
    mask = batch["attention_mask"]
    return padded_attention(model, mask.sum(1).tolist(), mask.shape[1], device, flash_dtype=bf16)


def _train_epoch(
    model,
    steps: Iterable[list[tuple[dict, float]]],
    opt: _Optim,
    loss_fn,
    grad_clip: float | None,
    device: str,
    on_step: Callable[[torch.Tensor], None],
    autocast=None,
    bf16: bool = False,
) -> torch.Tensor:
    """An optimizer step for each element of `steps`, the pieces of one batch (_pieces); the last step's loss.
    autocast: a context each forward runs in (None: none; the backward runs outside it, as torch advises);
    bf16: the forward computes in bf16 (padding then left out of attention on CUDA: _unpadded)."""
    model.train()
    for pieces in steps:
        parts = []
        for inputs, share in pieces:
            batch = {k: v.to(device) for k, v in inputs.items()}
            with autocast or contextlib.nullcontext(), _unpadded(model, inputs, device, bf16):
                if loss_fn is None:
                    loss = model(**batch).loss.float()
                else:
                    labels = batch.pop("labels")
                    loss = loss_fn(model(**batch).logits.float(), labels)
            (loss * share).backward()
            parts.append(loss.detach() * share)
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(opt.params, grad_clip)
        opt.optimizer.step()
        opt.scheduler.step()
        opt.optimizer.zero_grad(set_to_none=True)
        loss = torch.stack(parts).sum() if parts else torch.zeros(())
        on_step(loss)
    return loss


def finetune(
    model_dir: str,
    task: TaskSpec,
    seed: int,
    settings: FinetuneSettings,
    data_root=None,
    device: str = "cpu",
    log: Callable[[str], None] | None = None,
    progress: Callable[[dict], None] | None = None,
    on_predictions: Callable[[str, list, list], None] | None = None,
) -> list[dict]:
    """Fine-tune `model_dir` on `task` with `seed`; rows {task, language, finetune_seed, split, metric, value,
    epoch, wall_time_s} for every metric on dev and test, both at the best dev epoch (1-based).

    progress (optional) gets the stage's own progress about 20 times an epoch and after each dev evaluation:
    stage "finetune", task, seed, epoch / epochs, step / total_steps, loss, the best dev metric so far, ETA.
    on_predictions (optional) gets (split, gold, predictions) for dev and for test, both at the best dev
    epoch, in the form the metrics take (the scores are those metrics of them)."""
    t0 = time.perf_counter()
    data = load_task_data(task, data_root)
    examples = {
        "train": capped(data.splits["train"], settings.max_train_examples, settings.subset),
        **{s: capped(data.splits[s], settings.max_eval_examples, settings.subset) for s in ("dev", "test")},
    }
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if task.entry.label_kind in ("tags", "spans") and not tokenizer.is_fast:
        raise SpecError(f"a {task.type} task needs a fast tokenizer (word ids, offsets)", file=str(model_dir))
    max_length = _max_length(str(model_dir), tokenizer, task, settings, log)
    enc = {split: encode(tokenizer, task, ex, data.labels, max_length) for split, ex in examples.items()}
    train, lengths = enc["train"], [len(it.input_ids) for it in enc["train"]]
    loss_fn = _loss_fn(task, settings, train, len(data.labels), device)

    _seed_everything(seed)
    model = _load_model(str(model_dir), task, data.labels, settings).to(device)
    # data_seed: the head was initialised with `seed`; batch order and dropout follow data_seed (the HF Trainer
    # reseeds with its own args.seed once the model is built: BioClinical-ModernBERT's harness, docs/differences.md)
    train_seed = seed if settings.data_seed is None else settings.data_seed
    if train_seed != seed:
        _seed_everything(train_seed)
    to_batch = functools.partial(
        collate, pad_id=tokenizer.pad_token_id or 0, task_type=task.type, token_types=_takes_token_types(model)
    )
    order_gen = torch.Generator().manual_seed(train_seed)
    rounds, round_steps, batches_of = _rounds(settings, lengths, order_gen)
    opt = _optimizer(model, settings, device, settings.max_steps or round_steps * rounds)
    overhead = piece_overhead(device, settings.length_pieces)
    reporter = FinetuneProgress(progress, task, seed, rounds, round_steps)

    # the dev metric that keeps a checkpoint (the task's first unless its type says otherwise); scored, not reported
    selection = task.entry.selection(settings) or task.primary_metric
    dev_metrics = [*task.metrics, *([selection] if selection not in task.metrics else [])]

    def evaluate(split: str, names: list[str] = task.metrics) -> tuple[dict[str, float], list, list]:
        preds = _predict(
            model,
            task,
            enc[split],
            data.labels,
            examples[split],
            settings.eval_batch_size,
            to_batch,
            device,
            _autocast(settings, device),
            autocast_on(settings.precision, device),
        )
        gold = _gold(task, examples[split])
        return (compute(task.type, names, gold, preds, task.metric_options.negative_label), gold, preds)

    best_epoch, best_dev, best_state, stale, best_dev_out, best_score = 0, {}, None, 0, ([], []), None
    for epoch in range(1, rounds + 1):
        reporter.epoch = epoch
        batches = batches_of(epoch)
        steps = (_pieces([train[i] for i in b], task.type, to_batch, overhead) for b in batches)
        loss = _train_epoch(
            model,
            steps,
            opt,
            loss_fn,
            settings.grad_clip,
            device,
            reporter.step_done,
            _autocast(settings, device),
            autocast_on(settings.precision, device),
        )
        dev, *dev_out = evaluate("dev", dev_metrics)
        if _better(dev[selection], best_score):
            best_score, reporter.best, best_epoch, stale = dev[selection], dev[task.primary_metric], epoch, 0
            best_dev = {m: dev[m] for m in task.metrics}
            best_dev_out = dev_out
            # the last epoch's weights are tested as they are, so they need no copy
            best_state = _snapshot(opt.params) if epoch < rounds else None
        else:
            stale += 1
            if settings.patience is not None and stale >= settings.patience:
                break
        reporter.report(loss)

    if best_epoch != epoch:
        _restore(opt.params, best_state)
    test, *test_out = evaluate("test")
    if on_predictions is not None:
        on_predictions("dev", *best_dev_out)
        on_predictions("test", *test_out)
    wall = round(time.perf_counter() - t0, 3)
    return [
        {
            "task": task.name,
            "language": task.language,
            "finetune_seed": seed,
            "split": split,
            "metric": m,
            "value": v,
            "epoch": best_epoch,
            "wall_time_s": wall,
        }
        for split, scores in (("dev", best_dev), ("test", test))
        for m, v in scores.items()
    ]


def _rounds(settings: FinetuneSettings, lengths: list[int], generator: torch.Generator):
    """(evaluations, steps between them, round -> its batches). Epochs: one round per epoch. max_steps: rounds
    of eval_every steps (the last one shorter) cut from a stream of epochs' batches."""

    def epoch():
        return epoch_batches(lengths, settings.batch_size, generator, settings.group_by_length)

    if settings.max_steps is None:
        return settings.epochs, math.ceil(len(lengths) / settings.batch_size), lambda _round: epoch()
    every = settings.eval_every or math.ceil(len(lengths) / settings.batch_size)
    every = min(every, settings.max_steps)
    stream = itertools.chain.from_iterable(epoch() for _ in itertools.count())
    rounds = math.ceil(settings.max_steps / every)

    def batches_of(n: int) -> list[list[int]]:
        return list(itertools.islice(stream, min(every, settings.max_steps - (n - 1) * every)))

    return rounds, every, batches_of


def _snapshot(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [p.detach().to("cpu", copy=True) for p in params]


def _restore(params: list[torch.nn.Parameter], state: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, saved in zip(params, state):
            p.copy_(saved)
