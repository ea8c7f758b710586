"""The pooling of a sequence-classification model, set from the task's settings (`pooling: cls | mean | model`):
cls and mean are set here whatever the checkpoint's config says; `model` leaves the head as transformers builds
it from the checkpoint (BioClinical-ModernBERT's harness, src/tasks/sequence_classification.py:21-25: for
ModernBERT the config's classifier_pooling, "mean" in answerdotai/ModernBERT-base's config, then its prediction
head, dropout and classifier; for the first-token families what `cls` does).

Hugging Face heads pool in one of two ways, which each family entry declares (ablate.models.families). Some
read a `classifier_pooling` config value (ModernBERT, EuroBERT): it is set here. The others read the first
token's state ([CLS] / <s>) in one known module (BERT's pooler, RoBERTa's classification head, ...): `cls` is
what they do, and `mean` puts the mean of the last hidden states over the attention mask where that module
reads the first token. A family whose entry declares neither is refused rather than pooled in an unknown way.

May import: config, models.
"""

from __future__ import annotations

import torch

from ablate.config.errors import SpecError
from ablate.models.families import FAMILIES, family_of


def masked_mean(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, length, dim) states -> (batch, dim): the mean over the positions the mask keeps."""
    keep = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0)


def set_pooling(model: torch.nn.Module, pooling: str) -> torch.nn.Module:
    """Make `model` (a *ForSequenceClassification) pool as `pooling` says, the way its family entry declares
    (ablate.models.families.Family: classifier_pooling, first_token_reader, first_token_of_output); returns it.
    `model`: as transformers built it (nothing set)."""
    if pooling == "model":
        return model
    model_type = model.config.model_type
    try:
        family = family_of(model.config)
    except SpecError:  # an architecture without a family entry: refused below, as one that declares no pooling
        family = None
    if family is not None and family.classifier_pooling is not None:
        model.config.classifier_pooling = family.classifier_pooling[pooling]
        return model
    if family is not None and family.first_token_of_output:
        if pooling == "mean":
            _mean_in_base_output(model)
        return model
    if family is None or family.first_token_reader is None:
        raise SpecError(
            f"no known pooling for sequence classification with model type {model_type!r}",
            key="finetune.pooling",
            value=pooling,
            allowed="model types of families whose entry declares how their classification head pools: "
            + ", ".join(t for f in FAMILIES.values() if _pools(f) for t in f.model_types)
            + " (ablate/models/families.py, docs/models.md)",
        )
    if pooling == "mean":
        _mean_at_first_position(model, model.get_submodule(family.first_token_reader))
    return model


def _pools(family) -> bool:
    return family.classifier_pooling is not None or family.first_token_of_output or bool(family.first_token_reader)


def _mean_at_first_position(model: torch.nn.Module, reader: torch.nn.Module) -> None:
    """Hooks: the encoder's call leaves its attention mask here; the reader then gets the masked mean in
    position 0 of its input. (The encoder is called with attention_mask as a keyword by every family in
    with a first_token_reader; LoRA wrappers call the encoder the same way.)"""
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
