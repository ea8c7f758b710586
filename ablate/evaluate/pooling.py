"""The pooling of a sequence-classification model, set from the task's settings (`pooling: cls | mean`),
never inherited from whatever the checkpoint's config says.

Hugging Face heads pool in one of two ways. Some read a `classifier_pooling` config value (ModernBERT,
EuroBERT): it is set here. The others read the first token's state ([CLS] / <s>) in one known module (BERT's
pooler, RoBERTa's classification head, ...): `cls` is what they do, and `mean` puts the mean of the last
hidden states over the attention mask where that module reads the first token. A model type in neither
table is refused rather than pooled in an unknown way.

May import: config.
"""

from __future__ import annotations

import torch

from ablate.config.errors import SpecError

# model type -> our pooling name -> the value of its config's classifier_pooling
CONFIG_POOLING = {
    "modernbert": {"cls": "cls", "mean": "mean"},
    "eurobert": {"cls": "bos", "mean": "mean"},
}
# model type -> the module (dotted, from the *ForSequenceClassification root) whose first input is the last
# hidden states and which reads position 0 of it
FIRST_TOKEN_READER = {
    "bert": "bert.pooler",
    "roberta": "classifier",
    "xlm-roberta": "classifier",
    "camembert": "classifier",
    "electra": "classifier",
    "deberta-v2": "pooler",
}
# model types whose head reads position 0 of the base model's output inside its own forward (no module to hook)
FIRST_TOKEN_OF_OUTPUT = {"distilbert"}


def masked_mean(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, length, dim) states -> (batch, dim): the mean over the positions the mask keeps."""
    keep = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0)


def set_pooling(model: torch.nn.Module, pooling: str) -> torch.nn.Module:
    """Make `model` (a *ForSequenceClassification) pool as `pooling` says; returns it."""
    model_type = model.config.model_type
    if model_type in CONFIG_POOLING:
        model.config.classifier_pooling = CONFIG_POOLING[model_type][pooling]
        return model
    if model_type in FIRST_TOKEN_OF_OUTPUT:
        if pooling == "mean":
            _mean_in_base_output(model)
        return model
    reader = FIRST_TOKEN_READER.get(model_type)
    if reader is None:
        raise SpecError(
            f"no known pooling for sequence classification with model type {model_type!r}",
            key="finetune.pooling",
            value=pooling,
            allowed="model types "
            + ", ".join(sorted({*CONFIG_POOLING, *FIRST_TOKEN_READER, *FIRST_TOKEN_OF_OUTPUT}))
            + " (add the new type to ablate/evaluate/pooling.py)",
        )
    if pooling == "mean":
        _mean_at_first_position(model, model.get_submodule(reader))
    return model


def _mean_at_first_position(model: torch.nn.Module, reader: torch.nn.Module) -> None:
    """Hooks: the encoder's call leaves its attention mask here; the reader then gets the masked mean in
    position 0 of its input. (The encoder is called with attention_mask as a keyword by every family in
    FIRST_TOKEN_READER; LoRA wrappers call the encoder the same way.)"""
    seen: dict[str, torch.Tensor | None] = {}

    def keep_mask(_module, args, kwargs):
        seen["mask"] = kwargs.get("attention_mask")

    def mean_first(_module, args):
        hidden, *rest = args
        mask = seen.get("mask")
        if mask is None:
            mask = torch.ones(hidden.shape[:2], device=hidden.device)
        pooled = masked_mean(hidden, mask).unsqueeze(1)
        return (torch.cat([pooled, hidden[:, 1:]], dim=1), *rest)

    model.base_model.register_forward_pre_hook(keep_mask, with_kwargs=True)
    reader.register_forward_pre_hook(mean_first)


def _mean_in_base_output(model: torch.nn.Module) -> None:
    """Hooks for heads that take position 0 of the base model's output themselves (DistilBERT): the masked
    mean is written into position 0 of that output."""
    seen: dict[str, torch.Tensor | None] = {}

    def keep_mask(_module, args, kwargs):
        seen["mask"] = kwargs.get("attention_mask")

    def mean_first(_module, args, output):
        hidden = output[0]
        mask = seen.get("mask")
        if mask is None:
            mask = torch.ones(hidden.shape[:2], device=hidden.device)
        output["last_hidden_state"] = torch.cat([masked_mean(hidden, mask).unsqueeze(1), hidden[:, 1:]], dim=1)
        return output

    model.base_model.register_forward_pre_hook(keep_mask, with_kwargs=True)
    model.base_model.register_forward_hook(mean_first)
