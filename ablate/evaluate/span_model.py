"""The paper's span model for nested NER (tabib's bert_span_ner, after nlstruct; ablate's own code): the
encoder, a BiLSTM (lstm_layers, lstm_hidden_size over both directions), then two heads over its states:
(a) a tagger, one BIOUL tag sequence per label under a CRF (ablate.evaluate.crf), whose marginals give each
span a boundary log-probability (min of begins there, ends there, and no position between outside); (b) a
biaffine scorer (biaffine_hidden_size per label) of every span up to max_span_length sub-tokens. A span's logit
is the sum of the two; the loss is the CRF's negative log-likelihood (per token) plus the spans' BCE (per span),
weighted 1:1. Dropout `head_dropout` on the encoder's and the BiLSTM's outputs.

May import: evaluate (crf).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from ablate.evaluate.crf import BIOULCRF


class SpanOutput(NamedTuple):
    loss: torch.Tensor | None
    logits: torch.Tensor  # (batch, length, width, labels): the span (start, start + width)
    valid: torch.Tensor  # (batch, length, width): both ends are real sub-tokens of the example


class SpanNER(nn.Module):
    def __init__(
        self,
        encoder: nn.Module,
        n_labels: int,
        lstm_hidden_size: int = 400,
        lstm_layers: int = 3,
        biaffine_hidden_size: int = 64,
        max_span_length: int = 40,
        dropout: float = 0.4,
    ):
        super().__init__()
        self.encoder, self.n_labels, self.width = encoder, n_labels, max_span_length
        self.config = encoder.config
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(
            encoder.config.hidden_size,
            lstm_hidden_size // 2,
            num_layers=lstm_layers,
            bidirectional=True,
            batch_first=True,
            dropout=dropout if lstm_layers > 1 else 0.0,
        )
        size = 2 * (lstm_hidden_size // 2)
        self.tags = nn.Linear(size, 5 * n_labels)
        self.crf = BIOULCRF()
        self.hidden = biaffine_hidden_size
        self.begins = nn.Linear(size, biaffine_hidden_size * n_labels)
        self.ends = nn.Linear(size, biaffine_hidden_size * n_labels)
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(
        self, input_ids, attention_mask, token_mask, token_type_ids=None, span_labels=None, tag_labels=None
    ) -> SpanOutput:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        n, length = attention_mask.shape
        lengths = attention_mask.sum(1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(
            self.dropout(states.float()), lengths, batch_first=True, enforce_sorted=False
        )
        context, _ = nn.utils.rnn.pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=length)
        context = self.dropout(context)
        labels = self.n_labels
        emissions = self.tags(context).view(n, length, labels, 5).transpose(1, 2).reshape(n * labels, length, 5)
        seq_mask = attention_mask.bool()[:, None, :].expand(n, labels, length).reshape(n * labels, length)
        log_marginals, log_z = self.crf.marginals_and_partition(emissions, seq_mask)
        logits = self._span_logits(context, log_marginals.view(n, labels, length, 5))
        width = logits.shape[2]
        tm = token_mask.bool()
        valid = torch.stack(
            [torch.cat([tm[:, : length - w] & tm[:, w:], tm.new_zeros(n, w)], 1) for w in range(width)], 2
        )
        loss = None
        if span_labels is not None:
            target = torch.zeros_like(logits)
            keep = span_labels[:, 2] < width
            b, s, w, lab = span_labels[keep].unbind(1)
            target[b, s, w, lab] = 1.0
            bce = nn.functional.binary_cross_entropy_with_logits(logits[valid], target[valid], reduction="sum")
            tagger = (log_z - self.crf.score(emissions, tag_labels.reshape(n * labels, length), seq_mask)).sum()
            loss = bce / valid.sum().clamp(min=1) + tagger / attention_mask.sum()
        return SpanOutput(loss, logits, valid)

    def _span_logits(self, context: torch.Tensor, log_marginals: torch.Tensor) -> torch.Tensor:
        n, length, _ = context.shape
        labels, h = self.n_labels, self.hidden
        begins = self.begins(context).view(n, length, labels, h)
        ends = self.ends(context).view(n, length, labels, h)
        lm = log_marginals
        log_begin = torch.logaddexp(lm[..., 1], lm[..., 4]).transpose(1, 2)  # B or U; (n, length, labels)
        log_end = torch.logaddexp(lm[..., 3], lm[..., 4]).transpose(1, 2)  # L or U
        log_in = torch.logsumexp(lm[..., 1:], -1).transpose(1, 2)  # not O
        cum = torch.cat([log_in.new_zeros(n, 1, labels), log_in.cumsum(1)], 1)
        out = []
        for w in range(min(self.width, length)):
            biaffine = (begins[:, : length - w] * ends[:, w:]).sum(-1) / math.sqrt(h) + self.bias
            inside = (cum[:, w + 1 :] - cum[:, : length - w]).clamp(max=-1e-8)
            tagger = torch.minimum(torch.minimum(log_begin[:, : length - w], log_end[:, w:]), inside)
            out.append(torch.cat([biaffine + tagger, biaffine.new_full((n, w, labels), -1e4)], 1))
        return torch.stack(out, 2)
