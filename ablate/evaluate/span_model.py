"""The paper's span model for nested NER as its harness runs it (github Rian-T/tabib,
src/tabib/models/bert_span_ner.py `BERTSpanNER` at 16649393, after nlstruct; ablate's own code):

- the encoder, then a BiLSTM block (BiLSTMBlock): a projection to lstm_hidden_size with a GELU, then
  lstm_layers single-layer BiLSTMs, each followed by dropout and a sigmoid-gated residual under a LayerNorm;
- an "O" column and one column per label (11 for QUAERO's 10 groups);
- a tagger: one BIOUL tag chain of 1 + 4 x columns tags under a CRF (ablate.evaluate.crf), whose marginals
  give each span a boundary log-probability per column: min(log P(B or U at its start), log P(L or U at its
  end), sum of log P(not O) over its positions);
- a biaffine scorer: per column, begin and end projections of biaffine_hidden_size, their dot product over
  sqrt(biaffine_hidden_size), plus one bias;
- a span's logit per column is the sum of the two scores (tabib's 1:1 tagger and biaffine weights);
- the loss is the spans' BCE alone, against a one-hot target over the columns (one label per span, column 0
  for a non-entity), averaged over the columns and then over the batch's training spans: every entity, then
  the first 500 non-entity spans of each example left to right, 512 at most (ablate.evaluate.spans). The CRF
  gets no loss of its own.

Dropout `dropout` after each BiLSTM and on the tagger's and the biaffine scorer's inputs (each its own).
Given an example's entities (`span_positives`), forward computes the loss over its training spans and returns
their logits (the dev score tabib keeps a checkpoint by reads them); in eval mode it also scores every span of
up to max_span_length sub-tokens for decoding.

May import: evaluate (crf, spans).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from ablate.evaluate.crf import BIOULChainCRF
from ablate.evaluate.spans import training_spans

PAD_LABEL = -1  # a padded training span


class SpanOutput(NamedTuple):
    loss: torch.Tensor | None  # over the training spans, when the batch has span_positives
    logits: torch.Tensor | None  # eval mode: (batch, length, width, columns), the span (start, start + width)
    valid: torch.Tensor | None  # eval mode: (batch, length, width), a span tabib would decode
    sampled: torch.Tensor | None  # (batch, spans, columns): the training spans' logits
    sampled_labels: torch.Tensor | None  # (batch, spans): their labels (column), PAD_LABEL for padding
    cls_span: torch.Tensor | None  # (batch, columns): the span ([CLS], [CLS]), what tabib's padding spans score


class BiLSTMBlock(nn.Module):
    """tabib's BiLSTMContextualizer: Linear + GELU to `size` (when the input differs), then `layers` BiLSTMs
    of size // 2 a direction, each output dropped out and mixed in by a sigmoid gate under a LayerNorm."""

    def __init__(self, input_size: int, size: int, layers: int, dropout: float):
        super().__init__()
        self.project = nn.Linear(input_size, size) if input_size != size else None
        self.lstms = nn.ModuleList(
            nn.LSTM(size, size // 2, batch_first=True, bidirectional=True) for _ in range(layers)
        )
        self.gates = nn.ModuleList(nn.Linear(size, 1) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(size) for _ in range(layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.project is not None:
            x = nn.functional.gelu(self.project(x))
        lengths = mask.sum(1).cpu()
        for lstm, gate, norm in zip(self.lstms, self.gates, self.norms):
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, _ = nn.utils.rnn.pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=x.shape[1])
            out = self.dropout(out)
            g = torch.sigmoid(gate(out))
            x = norm(x * (1 - g) + out * g)
        return x


class _Parts(NamedTuple):
    """What a span's score is made of, per position and column."""

    log_begin: torch.Tensor  # (n, length, columns): log P(B or U)
    log_end: torch.Tensor  # (n, length, columns): log P(L or U)
    inside: torch.Tensor  # (n, length + 1, columns): cumulated log P(not O), 0 first
    begins: torch.Tensor  # (n, length, columns, hidden): the biaffine begin vectors
    ends: torch.Tensor  # (n, length, columns, hidden)


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
        crf_precision: str = "float32",
    ):
        super().__init__()
        self.encoder, self.width = encoder, max_span_length
        self.config = encoder.config
        self.columns = n_labels + 1  # column 0: no entity
        self.block = BiLSTMBlock(encoder.config.hidden_size, lstm_hidden_size, lstm_layers, dropout)
        self.tagger_dropout = nn.Dropout(dropout)
        self.tags = nn.Linear(lstm_hidden_size, 1 + 4 * self.columns)
        self.crf = BIOULChainCRF(self.columns, crf_precision)
        self.biaffine_dropout = nn.Dropout(dropout)
        self.hidden = biaffine_hidden_size
        self.begins = nn.Linear(lstm_hidden_size, biaffine_hidden_size * self.columns)
        self.ends = nn.Linear(lstm_hidden_size, biaffine_hidden_size * self.columns)
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(
        self, input_ids, attention_mask, token_type_ids=None, span_positives=None, span_stops=None
    ) -> SpanOutput:
        """span_positives: (batch, entities, 3) of (first, last, column), rows padded with PAD_LABEL; span_stops:
        (batch,) the end of each row's real sub-tokens (spans.real_tokens)."""
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        context = self.block(states.float(), attention_mask)
        parts = self._parts(context, attention_mask)
        loss = sampled = labels = cls_span = None
        if span_positives is not None:
            spans, labels, keep = self._training_spans(span_positives, span_stops)
            sampled = self._scores_at(parts, spans)
            cls_span = self._scores_at(parts, spans.new_zeros(len(spans), 1, 2))[:, 0]
            target = nn.functional.one_hot(labels.clamp(min=0), self.columns).to(sampled.dtype)
            bce = nn.functional.binary_cross_entropy_with_logits(sampled, target, reduction="none").mean(-1)
            loss = (bce * keep).sum() / keep.sum().clamp(min=1)
        if self.training:
            return SpanOutput(loss, None, None, sampled, labels, cls_span)
        logits, valid = self._grid(parts, attention_mask)
        return SpanOutput(loss, logits, valid, sampled, labels, cls_span)

    def _training_spans(self, positives: torch.Tensor, stops: torch.Tensor):
        """(spans (n, S, 2), labels (n, S), keep (n, S) float) of each row's training spans, padded."""
        rows = [
            training_spans([tuple(p) for p in row if p[2] != PAD_LABEL], 1, stop, self.width)
            for row, stop in zip(positives.tolist(), stops.tolist())
        ]
        most = max(len(r) for r in rows)
        table = torch.tensor([r + [(0, 0, PAD_LABEL)] * (most - len(r)) for r in rows], device=positives.device)
        labels = table[..., 2]
        return table[..., :2], labels, (labels != PAD_LABEL).float()

    def _parts(self, context: torch.Tensor, attention_mask: torch.Tensor) -> _Parts:
        n, length, _ = context.shape
        emissions = self.tags(self.tagger_dropout(context))
        marginals = self.crf.marginals(emissions, attention_mask.bool())
        kinds = marginals[..., 1:].view(n, length, self.columns, 4)  # I, B, L, U
        log_begin = torch.logaddexp(kinds[..., 1], kinds[..., 3])
        log_end = torch.logaddexp(kinds[..., 2], kinds[..., 3])
        log_in = torch.logsumexp(kinds, -1)
        inside = torch.cat([log_in.new_zeros(n, 1, self.columns), log_in.cumsum(1)], 1)
        x = self.biaffine_dropout(context)
        begins = self.begins(x).view(n, length, self.columns, self.hidden)
        ends = self.ends(x).view(n, length, self.columns, self.hidden)
        return _Parts(log_begin, log_end, inside, begins, ends)

    def _score(self, parts: _Parts, starts: torch.Tensor, lasts: torch.Tensor, at) -> torch.Tensor:
        """The logits of the spans (starts, lasts) (n, k each, positions) per column: (n, k, columns); `at`
        picks (n, positions, ...) tensors' rows at those positions."""
        tagger = torch.minimum(
            torch.minimum(
                (at(parts.inside, lasts + 1) - at(parts.inside, starts)).clamp(max=-1e-8),
                at(parts.log_begin, starts),
            ),
            at(parts.log_end, lasts),
        )
        biaffine = (at(parts.begins, starts) * at(parts.ends, lasts)).sum(-1) / math.sqrt(self.hidden) + self.bias
        return tagger + biaffine

    def _scores_at(self, parts: _Parts, spans: torch.Tensor) -> torch.Tensor:
        def at(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
            rows = torch.arange(t.shape[0], device=t.device).unsqueeze(1)
            return t[rows, index]

        return self._score(parts, spans[..., 0], spans[..., 1], at)

    def _grid(self, parts: _Parts, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every span of up to `width` sub-tokens, by (start, width), and whether tabib decodes it: it starts
        after position 0 and ends before the last position ([SEP])."""
        n, length = attention_mask.shape
        starts = torch.arange(length, device=attention_mask.device)
        lengths = attention_mask.sum(1)
        out, valid = [], []

        def at(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
            return t[:, index]

        for w in range(min(self.width, length)):
            s = starts[: length - w]
            scores = self._score(parts, s, s + w, at)
            out.append(torch.cat([scores, scores.new_full((n, w, self.columns), -1e4)], 1))
            valid.append((starts >= 1).unsqueeze(0) & (starts + w <= lengths.unsqueeze(1) - 2))
        return torch.stack(out, 2), torch.stack(valid, 2)
