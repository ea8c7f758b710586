"""What the Hugging Face heads share: the *ForTokenClassification / *ForSequenceClassification models
(checkpoints may be bf16: trained in float32), the pooling a sequence head is set to, and the encoding of
texts (and pairs) with one label each.

A probe (settings.probe linear | mlp) replaces the Hugging Face head by ablate.evaluate.task_types.probe's.

May import: evaluate (encoded, pooling, task_types.probe).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ablate.evaluate.encoded import Encoded
from ablate.evaluate.pooling import set_pooling
from ablate.evaluate.task_types.probe import probed_encoder


def label_kwargs(labels: tuple[str, ...]) -> dict[str, Any]:
    return {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {lab: i for i, lab in enumerate(labels)},
    }


def token_head(model_dir: str, labels: tuple[str, ...], settings) -> torch.nn.Module:
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(model_dir, dtype=torch.float32, **label_kwargs(labels))


def sequence_head(problem_type: str, one_output: bool = False) -> Callable[..., torch.nn.Module]:
    """A head builder: a *ForSequenceClassification of this problem type, pooled as the settings say; with a
    probe, the frozen encoder under the probe's head."""

    def build(model_dir: str, labels: tuple[str, ...], settings) -> torch.nn.Module:
        from transformers import AutoModelForSequenceClassification

        if getattr(settings, "probe", "none") != "none":
            return probed_encoder(model_dir, 1 if one_output else len(labels), problem_type, settings)

        sizes = {"num_labels": 1} if one_output else label_kwargs(labels)
        model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, dtype=torch.float32, problem_type=problem_type, **sizes
        )
        return set_pooling(model, settings.pooling)

    return build


def types_of(enc, i: int) -> list[int] | None:
    return enc["token_type_ids"][i] if "token_type_ids" in enc else None


def text_encoder(target: Callable[[Any, tuple[str, ...], dict[str, int]], Any]):
    """An encode function for texts (and pairs): `target(label, labels, label_id)` is the label's encoding."""

    def encode(tokenizer, examples, labels: tuple[str, ...], max_length: int) -> list[Encoded]:
        label_id = {lab: i for i, lab in enumerate(labels)}
        pairs = [ex.text_pair for ex in examples] if examples and examples[0].text_pair is not None else None
        enc = tokenizer([ex.text for ex in examples], pairs, truncation=True, max_length=max_length)
        return [
            Encoded(enc["input_ids"][i], types_of(enc, i), target(ex.label, labels, label_id), None)
            for i, ex in enumerate(examples)
        ]

    return encode


def per_row(decode_row: Callable[[torch.Tensor, Encoded, tuple[str, ...], Any], Any]):
    """A decode function over a batch of a Hugging Face head's outputs: decode_row(logits, item, labels,
    example) for each row."""

    def decode(outputs, items: list[Encoded], labels: tuple[str, ...], examples: list) -> list:
        logits = outputs.logits.float().cpu()
        return [decode_row(logits[r], item, labels, ex) for r, (item, ex) in enumerate(zip(items, examples))]

    return decode


def dense_labels(dtype: torch.dtype):
    def collate(items: list[Encoded]) -> dict[str, torch.Tensor]:
        return {"labels": torch.tensor([it.label for it in items], dtype=dtype)}

    return collate
