"""Probing a frozen encoder (finetune.probe: linear | mlp): the encoder's weights frozen (requires_grad False),
kept in eval mode (no dropout inside it) and run under torch.no_grad(), so no encoder gradient is ever
computed; only the head on the pooled sequence learns. `linear`: dropout, then one linear layer to the
type's outputs (linear probing, as the paper's transplants on DiaMED). `mlp`: the paper's needle probe,
dropout, linear, GELU, dropout, linear, with a hidden size of `probe_hidden` (null: the encoder's).
The pooled vector is the first token's state (`pooling: cls`) or the masked mean (`mean`). A frozen encoder in
eval mode is a fixed function of its input, so each distinct input's pooled vector is computed once and kept
(epochs after the first, and each dev evaluation, run the head alone; kept apart under inference mode, whose
tensors autograd cannot take). The loss is the
type's: cross-entropy (single label), BCE (multi-label, unless the type gives its own weighted one), MSE
(regression).

May import: evaluate (pooling).
"""

from __future__ import annotations

import inspect

import torch
from transformers.modeling_outputs import SequenceClassifierOutput

from ablate.evaluate.pooling import masked_mean

PROBES = ("none", "linear", "mlp")


def probe_layers(kind: str, width: int, n_out: int, hidden: int | None, dropout: float) -> torch.nn.Sequential:
    """The head of a probe: linear (dropout, linear) or mlp (dropout, linear, GELU, dropout, linear)."""
    if kind == "linear":
        return torch.nn.Sequential(torch.nn.Dropout(dropout), torch.nn.Linear(width, n_out))
    if kind == "mlp":
        inner = hidden or width
        return torch.nn.Sequential(
            torch.nn.Dropout(dropout),
            torch.nn.Linear(width, inner),
            torch.nn.GELU(),
            torch.nn.Dropout(dropout),
            torch.nn.Linear(inner, n_out),
        )
    raise ValueError(f"no probe head {kind!r}")


class ProbedEncoder(torch.nn.Module):
    """A frozen encoder and a trainable head on its pooled output; forward(**batch) returns `loss` (with
    labels) and `logits`, as a *ForSequenceClassification does."""

    def __init__(self, encoder: torch.nn.Module, head: torch.nn.Module, problem_type: str, pooling: str):
        super().__init__()
        self.encoder, self.head = encoder, head
        self.config = encoder.config
        self.problem_type, self.pooling = problem_type, pooling
        self.encoder.requires_grad_(False)
        self.encoder.eval()
        self._token_types = "token_type_ids" in inspect.signature(encoder.forward).parameters
        self._pooled: dict[bool, dict[bytes, torch.Tensor]] = {False: {}, True: {}}  # by inference mode

    def train(self, mode: bool = True):
        super().train(mode)
        self.encoder.eval()  # a frozen encoder never drops out
        return self

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        extra = {"token_type_ids": token_type_ids} if self._token_types and token_type_ids is not None else {}
        kept = self._pooled[torch.is_inference_mode_enabled()]
        keys = [
            _key(input_ids[i], attention_mask[i], token_type_ids[i] if extra else None)
            for i in range(len(input_ids))
        ]
        missing = [i for i, k in enumerate(keys) if k not in kept]
        if missing:
            rows = torch.tensor(missing, device=input_ids.device)
            pooled = self._pool(input_ids[rows], attention_mask[rows], {k: v[rows] for k, v in extra.items()})
            kept.update((keys[i], p) for i, p in zip(missing, pooled))
        logits = self.head(torch.stack([kept[k] for k in keys]))
        return SequenceClassifierOutput(loss=None if labels is None else self._loss(logits, labels), logits=logits)

    def _pool(self, input_ids, attention_mask, extra: dict) -> torch.Tensor:
        with torch.no_grad():
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
            pooled = masked_mean(hidden, attention_mask) if self.pooling == "mean" else hidden[:, 0]
        return pooled.float()

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.problem_type == "regression":
            return torch.nn.functional.mse_loss(logits.squeeze(-1), labels.float())
        if self.problem_type == "multi_label_classification":
            return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.float())
        return torch.nn.functional.cross_entropy(logits, labels)


def _key(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None) -> bytes:
    """One input as bytes, padding left out (the same example padded to another length is the same key)."""
    keep = mask.bool()
    parts = [ids[keep].cpu().numpy().tobytes()]
    if types is not None:
        parts.append(types[keep].cpu().numpy().tobytes())
    return b"|".join(parts)


def probed_encoder(model_dir: str, n_out: int, problem_type: str, settings) -> ProbedEncoder:
    """The checkpoint's encoder (no task head; float32) under the probe head the settings name."""
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(model_dir, dtype=torch.float32)
    head = probe_layers(
        settings.probe, encoder.config.hidden_size, n_out, settings.probe_hidden, settings.probe_dropout
    )
    return ProbedEncoder(encoder, head, problem_type, settings.pooling)
