"""span_ner: entities as character spans, nested ones kept, predicted by the paper's span model as its harness
runs it (ablate.evaluate.span_model; github Rian-T/tabib, src/tabib/models/bert_span_ner.py at 16649393).

An entity trains as the sub-tokens tabib gives it (ablate.evaluate.spans.entity_tokens); an example trains on
its entities and its first 500 non-entity spans. Decoding, as tabib's `predict`: each span of up to
max_span_length sub-tokens between [CLS] and [SEP] gets its best label column; it is kept when that column's
sigmoid is over 0.5, as the characters its sub-tokens' offsets cover with whitespace stripped; then, label by
label, a span overlapping a higher-scoring (then longer) one of the same label is dropped (spans of different
labels may nest). Scored by exact-span micro F1 over (example, start, end, label) at the character level.

The model is kept at the best dev evaluation (every eval_every steps with max_steps; else each epoch), by
`span_selection`: `sampled` (tabib's) scores the dev examples' training spans (each one's argmax over the
columns against its label, padding slots of tabib's dev batches included: sampled_span_f1, no threshold, no
decoding); `decoded` scores the decoded dev predictions by the task's first metric. Its head has its own
learning rate (head_lr).

May import: config, evaluate (metrics, encoded, spans, span_model, task_types.entry, task_types.hf).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ablate.config.base import Located
from ablate.evaluate import metrics as m
from ablate.evaluate.encoded import Encoded
from ablate.evaluate.spans import MAX_SPANS, NEGATIVES, drop_same_label_overlaps, entity_tokens, real_tokens
from ablate.evaluate.spans import stripped
from ablate.evaluate.span_model import PAD_LABEL, SpanNER
from ablate.evaluate.task_types.entry import TaskType
from ablate.evaluate.task_types.hf import types_of

SPAN_SETTINGS = frozenset(
    {
        "max_steps",
        "eval_every",
        "head_lr",
        "head_dropout",
        "crf_precision",
        "max_span_length",
        "lstm_hidden_size",
        "lstm_layers",
        "biaffine_hidden_size",
        "span_selection",
    }
)


class SpanTargets(NamedTuple):
    positives: tuple[tuple[int, int, int], ...]  # (first, last, column) of each entity, duplicates kept
    stop: int  # the end of the example's real sub-tokens (spans.real_tokens)


TABIB_EVAL_BATCH = 16  # tabib's per_device_eval_batch_size (configs/base/ner_span_bert.yaml)


class SampledCounts(NamedTuple):
    """An example's training spans scored by their argmax column against their labels (column 0: none)."""

    tp: int
    fp: int
    fn: int
    spans: int  # how many
    cls_taken: bool  # the span ([CLS], [CLS]) takes an entity column: each padding slot tabib scores is then a fp


class SpanPrediction(tuple):
    """One example's predicted (start, end, label) character spans, with `sampled`: its SampledCounts (what
    tabib's dev score reads)."""

    def __new__(cls, spans=(), sampled: SampledCounts = SampledCounts(0, 0, 0, 0, False)):
        prediction = super().__new__(cls, spans)
        prediction.sampled = sampled
        return prediction


def sampled_span_f1(gold, pred) -> float:
    """tabib's dev score (its compute_metrics "f1"): micro F1 of the training spans' argmax column against their
    labels, column 0 counting as no prediction; read from the predictions, not from `gold`. As in tabib, the
    examples are taken 16 by 16 in order and each one's spans padded to its batch's most with the span ([CLS],
    [CLS]) labelled 0, which counts as a false positive wherever that span takes an entity column."""
    tp = fp = fn = 0
    for at in range(0, len(pred), TABIB_EVAL_BATCH):
        batch = [p.sampled for p in pred[at : at + TABIB_EVAL_BATCH]]
        most = max(c.spans for c in batch)
        tp += sum(c.tp for c in batch)
        fn += sum(c.fn for c in batch)
        fp += sum(c.fp + (most - c.spans) * c.cls_taken for c in batch)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def head(model_dir: str, labels: tuple[str, ...], settings) -> torch.nn.Module:
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(model_dir, dtype=torch.float32)
    return SpanNER(
        encoder,
        len(labels),
        settings.lstm_hidden_size,
        settings.lstm_layers,
        settings.biaffine_hidden_size,
        settings.max_span_length,
        settings.head_dropout,
        settings.crf_precision,
    )


def encode(tokenizer, examples, labels: tuple[str, ...], max_length: int) -> list[Encoded]:
    """Sub-tokens with their character offsets; an entity's target is the sub-tokens tabib gives it (an entity
    cut off by max_length has none, and its gold span still counts when scoring)."""
    column = {lab: i + 1 for i, lab in enumerate(labels)}
    enc = tokenizer(
        [ex.text for ex in examples], truncation=True, max_length=max_length, return_offsets_mapping=True
    )
    out = []
    for i, ex in enumerate(examples):
        offsets = [tuple(o) for o in enc["offset_mapping"][i]]
        first, stop = real_tokens(offsets)
        positives = []
        for start, end, lab in ex.label:
            tokens = entity_tokens(offsets, ex.text, start, end, first, stop)
            if tokens is not None:
                positives.append((*tokens, column[lab]))
        out.append(
            Encoded(enc["input_ids"][i], types_of(enc, i), SpanTargets(tuple(positives), stop), None, offsets)
        )
    return out


def training_span_count(item: Encoded) -> int:
    """How many spans the example trains on, counting the non-entity ones of any width: its exact count at
    max_span_length 40 or more (an example longer than 40 sub-tokens then has over 500 of them). The shares of
    a batch's pieces (finetune.length_pieces) weigh by it, as the loss averages over a batch's spans."""
    n = item.label.stop - 1
    negatives = n * (n + 1) // 2 - len({(s, e) for s, e, _ in item.label.positives})
    return max(1, min(MAX_SPANS, len(item.label.positives) + min(NEGATIVES, negatives)))


def collate(items: list[Encoded]) -> dict[str, torch.Tensor]:
    most = max(1, max(len(it.label.positives) for it in items))
    rows = [list(it.label.positives) + [(0, 0, PAD_LABEL)] * (most - len(it.label.positives)) for it in items]
    return {
        "span_positives": torch.tensor(rows, dtype=torch.long).reshape(len(items), most, 3),
        "span_stops": torch.tensor([it.label.stop for it in items], dtype=torch.long),
    }


def _sampled_counts(logits: torch.Tensor, labels: torch.Tensor, cls_span: torch.Tensor) -> SampledCounts:
    keep = labels != PAD_LABEL
    pred, gold = logits[keep].argmax(-1), labels[keep]
    hit = pred == gold
    return SampledCounts(
        int(((pred > 0) & hit).sum()),
        int(((pred > 0) & ~hit).sum()),
        int(((gold > 0) & ~hit).sum()),
        int(keep.sum()),
        bool(cls_span.argmax() > 0),
    )


def decode(outputs, items: list[Encoded], labels: tuple[str, ...], examples) -> list[SpanPrediction]:
    probs = torch.sigmoid(outputs.logits.float()[..., 1:]).cpu()
    valid = outputs.valid.cpu()
    sampled, sampled_labels = outputs.sampled.float().cpu(), outputs.sampled_labels.cpu()
    cls_span = outputs.cls_span.float().cpu()
    preds = []
    for row, (item, ex) in enumerate(zip(items, examples)):
        best, column = probs[row].max(-1)
        on = (best > 0.5) & valid[row]
        candidates = []
        for (s, w), p, k in zip(on.nonzero().tolist(), best[on].tolist(), column[on].tolist()):
            start, end = stripped(ex.text, item.offsets[s][0], item.offsets[s + w][1])
            if start < end:
                candidates.append((p, start, end, labels[k]))
        counts = _sampled_counts(sampled[row], sampled_labels[row], cls_span[row])
        preds.append(SpanPrediction(drop_same_label_overlaps(candidates), counts))
    return preds


def _check(task) -> None:
    if task.columns.text_pair is not None:
        raise Located("a span_ner task reads no text_pair", "columns.text_pair", task.columns.text_pair)


SPAN_NER = TaskType(
    name="span_ner",
    description="entities as character spans, nested kept (tabib's span model: BiLSTM, BIOUL CRF, biaffine)",
    protocol_kind="span_ner",
    metrics={
        "span_f1": m.span_f1,
        "span_precision": m.span_precision,
        "span_recall": m.span_recall,
        "sampled_span_f1": sampled_span_f1,
    },
    selects_by="span_f1",
    formats=("brat",),
    label_kind="spans",
    head=head,
    encode=encode,
    collate=collate,
    decode=decode,
    label_names=lambda label: tuple(lab for _, _, lab in label),
    reads=SPAN_SETTINGS,
    targets=(),  # the dev examples' training spans are scored too (sampled_span_f1)
    check=_check,
    loss_terms=training_span_count,
    selection=lambda settings: "sampled_span_f1" if settings.span_selection == "sampled" else None,
    revision="tabib 16649393",  # the span model was ablate's own before: its older scores recompute
    host_reads="its BiLSTM packs by lengths read on the host; its loss draws each example's training spans "
    "on the host",
)

ENTRIES = (SPAN_NER,)
