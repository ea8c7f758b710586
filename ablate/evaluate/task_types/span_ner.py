"""span_ner: entities as character spans, nested ones kept, predicted by the paper's span model
(ablate.evaluate.span_model: BiLSTM, BIOUL CRF tagger and biaffine span scorer). Decoding keeps the spans whose
combined logit is over 0 (sigmoid > 0.5), then drops, label by label, any span that overlaps a higher-scoring
one of the same label (spans of different labels may nest). Scored by exact-span micro F1 over (example,
start, end, label) at the character level. The model is kept at the best dev evaluation (every eval_every steps
with max_steps; else each epoch); its head has its own learning rate (head_lr).

May import: config, evaluate (metrics, encoded, spans, span_model, task_types.entry, task_types.hf).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ablate.config.base import Located
from ablate.evaluate import metrics as m
from ablate.evaluate.encoded import Encoded, pad_rows
from ablate.evaluate.spans import bioul_tags, char_span, drop_same_label_overlaps, token_span
from ablate.evaluate.span_model import SpanNER
from ablate.evaluate.task_types.entry import TaskType, register
from ablate.evaluate.task_types.hf import types_of

SPAN_SETTINGS = frozenset(
    {
        "max_steps",
        "eval_every",
        "head_lr",
        "head_dropout",
        "max_span_length",
        "lstm_hidden_size",
        "lstm_layers",
        "biaffine_hidden_size",
    }
)


class SpanTargets(NamedTuple):
    n_labels: int
    spans: tuple[tuple[int, int, int], ...]  # (first sub-token, last sub-token, label id)


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
    )


def encode(tokenizer, examples, labels: tuple[str, ...], max_length: int) -> list[Encoded]:
    """Sub-tokens with their character offsets; an entity's target is the sub-tokens covering it (an entity
    cut off by max_length has none, and its gold span still counts when scoring)."""
    label_id = {lab: i for i, lab in enumerate(labels)}
    enc = tokenizer(
        [ex.text for ex in examples], truncation=True, max_length=max_length, return_offsets_mapping=True
    )
    out = []
    for i, ex in enumerate(examples):
        offsets = [tuple(o) for o in enc["offset_mapping"][i]]
        spans = set()
        for start, end, lab in ex.label:
            tokens = token_span(offsets, start, end)
            if tokens is not None:
                spans.add((*tokens, label_id[lab]))
        out.append(
            Encoded(
                enc["input_ids"][i],
                types_of(enc, i),
                SpanTargets(len(labels), tuple(sorted(spans))),
                None,
                offsets,
            )
        )
    return out


def collate(items: list[Encoded]) -> dict[str, torch.Tensor]:
    n = max(len(it.input_ids) for it in items)
    n_labels = items[0].label.n_labels
    token_mask = pad_rows([[b > a for a, b in it.offsets] for it in items], False, n, torch.bool)
    span_labels = [(row, s, e - s, lab) for row, it in enumerate(items) for s, e, lab in it.label.spans]
    tags = [
        [bioul_tags([(s, e) for s, e, lab in it.label.spans if lab == k], n) for k in range(n_labels)]
        for it in items
    ]
    return {
        "token_mask": token_mask,
        "span_labels": torch.tensor(span_labels, dtype=torch.long).reshape(-1, 4),
        "tag_labels": torch.tensor(tags, dtype=torch.long),
    }


def decode(outputs, items: list[Encoded], labels: tuple[str, ...], examples) -> list[tuple]:
    logits, valid = outputs.logits.float().cpu(), outputs.valid.cpu()
    preds = []
    for row, item in enumerate(items):
        on = (logits[row] > 0) & valid[row].unsqueeze(-1)
        where, probs = on.nonzero().tolist(), torch.sigmoid(logits[row][on]).tolist()
        candidates = [(p, *char_span(item.offsets, s, s + w), labels[k]) for (s, w, k), p in zip(where, probs)]
        preds.append(tuple(drop_same_label_overlaps(candidates)))
    return preds


def _check(task) -> None:
    if task.columns.text_pair is not None:
        raise Located("a span_ner task reads no text_pair", "columns.text_pair", task.columns.text_pair)


SPAN_NER = register(
    TaskType(
        name="span_ner",
        description="entities as character spans, nested kept (BiLSTM, BIOUL CRF, biaffine spans)",
        protocol_kind="span_ner",
        metrics={"span_f1": m.span_f1, "span_precision": m.span_precision, "span_recall": m.span_recall},
        selects_by="span_f1",
        formats=("brat",),
        label_kind="spans",
        head=head,
        encode=encode,
        collate=collate,
        decode=decode,
        label_names=lambda label: tuple(lab for _, _, lab in label),
        reads=SPAN_SETTINGS,
        targets=("span_labels", "tag_labels"),
        check=_check,
    )
)
