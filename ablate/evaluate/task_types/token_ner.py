"""token_classification: one IOB2 tag per word, a linear head on each word's first sub-token (the others carry
no loss), as BioClinical-ModernBERT's harness trains it (src/tasks/token_classification.py:56-70). Scored two
ways: seqeval_* as that harness scores (seqeval's default mode, over the words kept after truncation) and
entity_* strict IOB2 (a word cut off by max_length counted as O). A word cut off by max_length, or one the
tokenizer drops (e.g. a zero-width space), gets no prediction (None): the harness's labels skip it.

May import: config, evaluate (metrics, encoded, task_readers, task_types.entry, task_types.hf).
"""

from __future__ import annotations

import torch

from ablate.config.base import Located
from ablate.evaluate import metrics as m
from ablate.evaluate.encoded import IGNORE, Encoded, pad_rows
from ablate.evaluate.task_readers import IOB2_TAG
from ablate.evaluate.task_types.entry import TaskType
from ablate.evaluate.task_types.hf import per_row, token_head, types_of


def align_word_labels(word_ids: list[int | None], word_labels: list[int]) -> list[int]:
    """One label per sub-token: the word's label on its first piece, IGNORE elsewhere."""
    out, prev = [], None
    for w in word_ids:
        out.append(IGNORE if w is None or w == prev else word_labels[w])
        prev = w
    return out


def encode(tokenizer, examples, labels: tuple[str, ...], max_length: int) -> list[Encoded]:
    label_id = {lab: i for i, lab in enumerate(labels)}
    enc = tokenizer(
        [list(ex.text) for ex in examples], is_split_into_words=True, truncation=True, max_length=max_length
    )
    out = []
    for i, ex in enumerate(examples):
        wids = enc.word_ids(i)
        out.append(
            Encoded(
                enc["input_ids"][i],
                types_of(enc, i),
                align_word_labels(wids, [label_id[t] for t in ex.label]),
                wids,
            )
        )
    return out


def decode_tags(logits: torch.Tensor, item: Encoded, labels: tuple[str, ...], n_words: int) -> list[str | None]:
    """The tag of each word's first sub-token; None for a word with none in the input (cut or dropped)."""
    tags, best = [None] * n_words, logits.argmax(-1).tolist()
    seen = set()
    for pos, w in enumerate(item.word_ids):
        if w is not None and w not in seen:
            seen.add(w)
            tags[w] = labels[best[pos]]
    return tags


def _check(task) -> None:
    if task.data.format == "hf" and not isinstance(task.columns.text, str):
        raise Located("a hf token task's text is one field holding the tokens", "columns.text", task.columns.text)
    bad = [v for v in task.labels.values or () if not IOB2_TAG.match(v)]
    if bad:
        raise Located("not an IOB2 tag", "labels.values", bad[0], "O, B-<type>, I-<type>")


TOKEN_CLASSIFICATION = TaskType(
    name="token_classification",
    description="one IOB2 tag per word (a linear head on the sub-tokens)",
    protocol_kind="ner",
    metrics={
        "seqeval_f1": m.seqeval_f1,
        "seqeval_precision": m.seqeval_precision,
        "seqeval_recall": m.seqeval_recall,
        "entity_f1": m.entity_f1,
        "entity_precision": m.entity_precision,
        "entity_recall": m.entity_recall,
    },
    selects_by="seqeval_f1",
    formats=("conll", "hf"),
    label_kind="tags",
    head=token_head,
    encode=encode,
    collate=lambda items: {"labels": pad_rows([it.label for it in items], IGNORE)},
    decode=per_row(lambda logits, item, labels, ex: decode_tags(logits, item, labels, len(ex.text))),
    gold=lambda example: list(example.label),
    label_names=tuple,
    lora_task="TOKEN_CLS",
    hub_pipeline="token-classification",
    loss_terms=lambda item: sum(lab != IGNORE for lab in item.label),
    check=_check,
)

ENTRIES = (TOKEN_CLASSIFICATION,)
