"""Where each encoder family keeps its embeddings, transformer blocks and MLM head.

Owns: the Family description and the parameter-name -> layer map every per-layer feature uses (freezing,
gradient norms, weight change, CKA). Imports: config only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from ablate.config.errors import SpecError


@dataclass(frozen=True)
class Family:
    """Where an architecture keeps its embeddings, blocks and MLM head."""

    model_type: str
    encoder_attr: str          # the bare encoder inside the *ForMaskedLM; also its parameter-name prefix
    layer_pattern: re.Pattern  # parameter name inside the encoder -> block index
    encoder_tail: tuple[str, ...]  # encoder parameters after the last block (final norm)

    def encoder(self, model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, self.encoder_attr)

    def head_logits(self, model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if self.model_type == "bert":
            return model.cls(hidden)
        return model.decoder(model.head(hidden))


FAMILIES = {
    "bert": Family("bert", "bert", re.compile(r"^encoder\.layer\.(\d+)\."), ()),
    "modernbert": Family("modernbert", "model", re.compile(r"^layers\.(\d+)\."), ("final_norm.",)),
}


def family_of(config: PretrainedConfig) -> Family:
    try:
        return FAMILIES[config.model_type]
    except KeyError:
        raise SpecError("unsupported architecture", key="model", value=config.model_type,
                        allowed=", ".join(FAMILIES)) from None


def layer_of(param_name: str, family: Family) -> str:
    """'emb', a block index as a string, 'tail' (final norm) or 'head' (anything else: MLM head, pooler)
    for a parameter name of the *ForMaskedLM or of its bare encoder."""
    name = param_name.removeprefix(family.encoder_attr + ".")
    if name.startswith("embeddings."):
        return "emb"
    m = family.layer_pattern.match(name)
    if m:
        return m.group(1)
    return "tail" if name.startswith(family.encoder_tail) else "head"


def layer_index(param_name: str, family: Family) -> int | None:
    """The `layers` table's index of a parameter: -1 embeddings, 0..n-1 blocks, None otherwise."""
    where = layer_of(param_name, family)
    return -1 if where == "emb" else int(where) if where.isdigit() else None


def n_layers(config: PretrainedConfig) -> int:
    return int(config.num_hidden_layers)
