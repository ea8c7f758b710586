"""Downstream fine-tuning of one checkpoint on one task with one seed.

`finetune` trains with a plain loop (AdamW, linear warmup then linear decay, optional early stopping on the
task's first metric) and returns score rows for dev and test, test taken at the best dev epoch. Sequence
tasks pool as the settings say (ablate.evaluate.pooling); multi-label tasks weigh each label's positives by
its negatives / positives in train; max_length is capped at the model's context. The resumable task x seed
loop over score files is ablate.evaluate.scores.

May import: config, store, models, evaluate (tasks, metrics, pooling).
"""

from __future__ import annotations

import inspect
import math
import random
import time
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
from transformers import (AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification,
                          AutoTokenizer)

from ablate.evaluate import metrics
from ablate.config.errors import SpecError
from ablate.evaluate.pooling import set_pooling
from ablate.evaluate.tasks import Example, FinetuneSettings, TaskSpec, load_task_data
from ablate.models.families import FAMILIES, family_of

__all__ = ["FinetuneSettings", "finetune", "encode", "align_word_labels", "pos_weight", "context_length"]

IGNORE = -100   # label of sub-tokens that carry no loss (special tokens, non-first pieces of a word, padding)

# LoRA adapters go on the attention projections named by the model's family entry (lora_targets); the modules
# in its lora_full, when the model has them, are trained in full because they may be freshly initialised
# (BERT's pooler is absent from *ForMaskedLM checkpoints; ModernBERT's head is absent from a bare
# ModernBertModel). A model of no family needs finetune.lora_target_modules, and gets _LORA_FULL.
_LORA_FULL = ("pooler", "head")


class Encoded(NamedTuple):
    input_ids: list[int]
    token_type_ids: list[int] | None
    label: Any                      # token cls: list of ids (IGNORE for unlabelled pieces); else id/vector/float
    word_ids: list[int | None] | None


def align_word_labels(word_ids: list[int | None], word_labels: list[int]) -> list[int]:
    """One label per sub-token: the word's label on its first piece, IGNORE elsewhere."""
    out, prev = [], None
    for w in word_ids:
        out.append(IGNORE if w is None or w == prev else word_labels[w])
        prev = w
    return out


def encode(tokenizer, task: TaskSpec, examples: list[Example], labels: tuple[str, ...], max_length: int) -> list[Encoded]:
    label_id = {lab: i for i, lab in enumerate(labels)}
    if task.type == "token_classification":
        enc = tokenizer([list(ex.text) for ex in examples], is_split_into_words=True, truncation=True,
                        max_length=max_length)
        out = []
        for i, ex in enumerate(examples):
            wids = enc.word_ids(i)
            out.append(Encoded(enc["input_ids"][i], _types(enc, i),
                               align_word_labels(wids, [label_id[t] for t in ex.label]), wids))
        return out
    pairs = [ex.text_pair for ex in examples] if examples and examples[0].text_pair is not None else None
    enc = tokenizer([ex.text for ex in examples], pairs, truncation=True, max_length=max_length)
    out = []
    for i, ex in enumerate(examples):
        if task.type == "multi_label_classification":
            y: Any = [1.0 if lab in ex.label else 0.0 for lab in labels]
        elif task.type == "regression":
            y = float(ex.label)
        else:
            y = label_id[ex.label]
        out.append(Encoded(enc["input_ids"][i], _types(enc, i), y, None))
    return out


def _types(enc, i: int) -> list[int] | None:
    return enc["token_type_ids"][i] if "token_type_ids" in enc else None


def _collate(items: list[Encoded], pad_id: int, task_type: str) -> dict[str, torch.Tensor]:
    n = max(len(it.input_ids) for it in items)
    ids = torch.full((len(items), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), n), dtype=torch.long)
    types = torch.zeros((len(items), n), dtype=torch.long)
    for r, it in enumerate(items):
        ids[r, :len(it.input_ids)] = torch.tensor(it.input_ids)
        mask[r, :len(it.input_ids)] = 1
        if it.token_type_ids is not None:
            types[r, :len(it.token_type_ids)] = torch.tensor(it.token_type_ids)
    batch = {"input_ids": ids, "attention_mask": mask}
    if items[0].token_type_ids is not None:
        batch["token_type_ids"] = types
    if task_type == "token_classification":
        labels = torch.full((len(items), n), IGNORE, dtype=torch.long)
        for r, it in enumerate(items):
            labels[r, :len(it.label)] = torch.tensor(it.label)
    elif task_type in ("multi_label_classification", "regression"):
        labels = torch.tensor([it.label for it in items], dtype=torch.float)
    else:
        labels = torch.tensor([it.label for it in items], dtype=torch.long)
    batch["labels"] = labels
    return batch


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _load_model(model_dir: str, task: TaskSpec, labels: tuple[str, ...], settings: FinetuneSettings):
    kwargs: dict[str, Any] = {"dtype": torch.float32}   # checkpoints may be bf16; train in fp32
    if task.type == "token_classification":
        cls = AutoModelForTokenClassification
    else:
        cls = AutoModelForSequenceClassification
        kwargs["problem_type"] = {"multi_label_classification": "multi_label_classification",
                                  "regression": "regression"}.get(task.type, "single_label_classification")
    if task.type == "regression":
        kwargs["num_labels"] = 1
    else:
        kwargs.update(num_labels=len(labels), id2label=dict(enumerate(labels)),
                      label2id={lab: i for i, lab in enumerate(labels)})
    model = cls.from_pretrained(model_dir, **kwargs)
    if task.type != "token_classification":
        set_pooling(model, settings.pooling)
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
        raise SpecError(f"no default LoRA target modules for model type {model_type!r} (no family entry)",
                        key="finetune.lora_target_modules",
                        allowed="set them explicitly, or use a model of a family: " + ", ".join(FAMILIES))
    full = family.lora_full if family else _LORA_FULL
    leaf = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in targets if t.rsplit(".", 1)[-1] not in leaf]
    if missing:
        raise SpecError(f"LoRA target modules not in this {model_type} model", key="finetune.lora_target_modules",
                        value=missing)
    config = LoraConfig(
        task_type=TaskType.TOKEN_CLS if task.type == "token_classification" else TaskType.SEQ_CLS,
        r=settings.lora_r, lora_alpha=settings.lora_alpha, lora_dropout=settings.lora_dropout,
        target_modules=list(targets), modules_to_save=[m for m in full if m in leaf])
    return get_peft_model(model, config)


def _takes_token_types(model) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model   # under a LoRA wrapper
    return "token_type_ids" in inspect.signature(base.forward).parameters


def _predict(model, task: TaskSpec, data: list[Encoded], labels: tuple[str, ...], examples: list[Example],
             settings: FinetuneSettings, pad_id: int, device: str) -> list:
    """Predictions in the form metrics take: tag lists per sentence, label strings, label tuples or floats."""
    model.eval()
    order = sorted(range(len(data)), key=lambda i: len(data[i].input_ids))   # less padding
    preds: list[Any] = [None] * len(data)
    with torch.no_grad():
        for start in range(0, len(order), settings.eval_batch_size):
            idx = order[start:start + settings.eval_batch_size]
            batch = _collate([data[i] for i in idx], pad_id, task.type)
            batch.pop("labels")
            logits = model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()
            for row, i in enumerate(idx):
                preds[i] = _decode(task.type, logits[row], data[i], labels, len(examples[i].text))
    return preds


def _decode(task_type: str, logits: torch.Tensor, item: Encoded, labels: tuple[str, ...], n_words: int):
    if task_type == "token_classification":
        # A word cut off by max_length, or one the tokenizer drops (e.g. a zero-width space), is tagged O.
        tags, best = ["O"] * n_words, logits.argmax(-1).tolist()
        seen = set()
        for pos, w in enumerate(item.word_ids):
            if w is not None and w not in seen:
                seen.add(w)
                tags[w] = labels[best[pos]]
        return tags
    if task_type == "multi_label_classification":
        return tuple(lab for lab, on in zip(labels, (logits > 0).tolist()) if on)   # sigmoid > 0.5
    if task_type == "regression":
        return float(logits[0])
    return labels[int(logits.argmax())]


def _gold(task: TaskSpec, examples: list[Example]) -> list:
    if task.type == "token_classification":
        return [list(ex.label) for ex in examples]
    return [ex.label for ex in examples]


def _lr_factor(warmup: int, total: int):
    def factor(step: int) -> float:   # step = updates done so far
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))
    return factor


def _better(value: float, best: float | None) -> bool:
    return best is None or (not math.isnan(value) and (math.isnan(best) or value > best))


def pos_weight(labels: list[list[float]], n_labels: int) -> torch.Tensor:
    """BCE pos_weight per label: negatives / positives among the training examples. A label that is positive
    in none or in all of them gets 1 (there is nothing to balance)."""
    y = torch.tensor(labels, dtype=torch.float64).reshape(-1, n_labels)
    pos = y.sum(0)
    neg = len(y) - pos
    usable = (pos > 0) & (neg > 0)
    return torch.where(usable, neg / pos.clamp(min=1), torch.ones_like(pos)).float()


def context_length(model_dir: str, tokenizer=None) -> int | None:
    """The longest input the model takes: its max_position_embeddings, or the tokenizer's model_max_length
    when that is smaller (RoBERTa-style models reserve positions for padding); None when neither says."""
    n = getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", None)
    told = getattr(tokenizer, "model_max_length", None)
    if isinstance(told, int) and told < 10**9:
        n = told if n is None else min(n, told)
    return n


def _max_length(model_dir: str, tokenizer, task: TaskSpec, settings: FinetuneSettings,
                log: Callable[[str], None] | None) -> int:
    wanted = settings.max_length or task.max_length
    context = context_length(model_dir, tokenizer)
    if context is None or wanted <= context:
        return wanted
    if log is not None:
        log(f"{task.name}: max_length {wanted} is more than the model's context ({context} positions); "
            f"inputs are cut at {context}")
    return context


def _adamw(trainable: list[tuple[str, torch.nn.Parameter]], settings: FinetuneSettings, device: str):
    """AdamW with no weight decay on biases and normalisation weights (the 1-d parameters)."""
    groups = [{"params": [p for _, p in trainable if p.ndim >= 2], "weight_decay": settings.weight_decay},
              {"params": [p for _, p in trainable if p.ndim < 2], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=settings.lr, fused=torch.device(device).type in ("cpu", "cuda"))


def _train_step(model, batch: dict, loss_fn, trainable, grad_clip: float | None, optimizer, scheduler
                ) -> torch.Tensor:
    """One optimizer step on `batch`: the model's own loss, or `loss_fn` on its logits; returns the loss."""
    if loss_fn is None:
        loss = model(**batch).loss
    else:
        labels = batch.pop("labels")
        loss = loss_fn(model(**batch).logits.float(), labels)
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_([p for _, p in trainable], grad_clip)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def finetune(model_dir: str, task: TaskSpec, seed: int, settings: FinetuneSettings, data_root=None,
             device: str = "cpu", log: Callable[[str], None] | None = None,
             progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Fine-tune `model_dir` on `task` with `seed`; rows {task, language, finetune_seed, split, metric, value,
    epoch, wall_time_s} for every metric on dev and test, both at the best dev epoch (1-based).

    progress (optional) gets the stage's own progress about 20 times an epoch and after each dev evaluation:
    stage "finetune", task, seed, epoch / epochs, step / total_steps, loss, the best dev metric so far, ETA."""
    t0 = time.perf_counter()
    data = load_task_data(task, data_root)
    train_ex = data.splits["train"][:settings.max_train_examples]
    eval_ex = {s: data.splits[s][:settings.max_eval_examples] for s in ("dev", "test")}

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if task.type == "token_classification" and not tokenizer.is_fast:
        raise SpecError("token classification needs a fast tokenizer (word_ids)", file=str(model_dir))
    max_length = _max_length(str(model_dir), tokenizer, task, settings, log)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    train = encode(tokenizer, task, train_ex, data.labels, max_length)
    evals = {s: encode(tokenizer, task, ex, data.labels, max_length) for s, ex in eval_ex.items()}
    loss_fn = None   # None: the model's own loss
    if task.type == "multi_label_classification" and settings.multi_label_pos_weight:
        weights = pos_weight([it.label for it in train], len(data.labels)).to(device)
        loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=weights)

    _seed_everything(seed)
    model = _load_model(str(model_dir), task, data.labels, settings).to(device)
    if not _takes_token_types(model):   # e.g. DistilBERT or EuroBERT saved with a BERT tokenizer
        train = [it._replace(token_type_ids=None) for it in train]
        evals = {s: [it._replace(token_type_ids=None) for it in items] for s, items in evals.items()}
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = _adamw(trainable, settings, device)
    steps_per_epoch = math.ceil(len(train) / settings.batch_size)
    total = steps_per_epoch * settings.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _lr_factor(round(total * settings.warmup_ratio), total))
    order_gen = torch.Generator().manual_seed(seed)
    dev_gold = _gold(task, eval_ex["dev"])

    best, best_epoch, best_dev, best_state, stale = None, 0, {}, None, 0
    step, every, started = 0, max(1, steps_per_epoch // 20), time.perf_counter()

    def report(epoch: int, loss: float) -> None:
        if progress:
            eta = (time.perf_counter() - started) / step * (total - step) if step else 0.0
            progress({"stage": "finetune", "phase": f"fine-tuning {task.name}", "task": task.name, "seed": seed,
                      "epoch": epoch, "epochs": settings.epochs, "step": step, "total_steps": total, "loss": loss,
                      "dev_metric": task.primary_metric, "dev": best, "eta_s": eta})

    for epoch in range(1, settings.epochs + 1):
        model.train()
        order = torch.randperm(len(train), generator=order_gen).tolist()
        for start in range(0, len(order), settings.batch_size):
            batch = {k: v.to(device) for k, v in
                     _collate([train[i] for i in order[start:start + settings.batch_size]], pad_id, task.type).items()}
            loss = _train_step(model, batch, loss_fn, trainable, settings.grad_clip, optimizer, scheduler)
            step += 1
            if step % every == 0:
                report(epoch, loss.item())
        preds = _predict(model, task, evals["dev"], data.labels, eval_ex["dev"], settings, pad_id, device)
        dev = metrics.compute(task.type, task.metrics, dev_gold, preds)
        if _better(dev[task.primary_metric], best):
            best, best_epoch, best_dev, stale = dev[task.primary_metric], epoch, dev, 0
            best_state = {n: p.detach().to("cpu", copy=True) for n, p in trainable}
        else:
            stale += 1
            if settings.patience is not None and stale >= settings.patience:
                break
        report(epoch, loss.item())

    if best_epoch != epoch:
        with torch.no_grad():
            for n, p in trainable:
                p.copy_(best_state[n])
    preds = _predict(model, task, evals["test"], data.labels, eval_ex["test"], settings, pad_id, device)
    test = metrics.compute(task.type, task.metrics, _gold(task, eval_ex["test"]), preds)
    wall = round(time.perf_counter() - t0, 3)
    return [{"task": task.name, "language": task.language, "finetune_seed": seed, "split": split, "metric": m,
             "value": v, "epoch": best_epoch, "wall_time_s": wall}
            for split, scores in (("dev", best_dev), ("test", test)) for m, v in scores.items()]
