"""Attention that scores only the keys a layer may see: no L x L mask, for training at long sequences.

Registered with transformers as the attention implementation IMPLEMENTATION ("ablate_sdpa"); the training
loop switches a model to it for the duration of a step (ablate.train.objectives.attention_for, mask kind
"banded"), so a saved model's config and fine-tuning keep transformers' own "sdpa". Its mask function
(padding_only) builds no 4D mask: the attention function gets the model's 2D padding mask (None in
training: packed sequences) and reads from the attention module

- `is_causal` (set by attention_for for CLM, as the "flag" kind does);
- `sliding_window` (ModernBERT's local layers: config.sliding_window + 1, flash attention's inclusive bound;
  a query sees keys with |q - k| <= config.sliding_window, causal: 0 <= q - k <= config.sliding_window,
  exactly transformers' masks);
- DOCUMENTS_ATTR: the batch's `Documents` when attention stays inside each packed document
  (`document_masking`), set by attention_for too, once per micro-batch: the doc ids (B, L) on the model's
  device (local layers' masks) and each row's document spans, found on the host before the ids went to the
  device (global layers). No layer reads anything back to the host: on CUDA that would wait for the GPU in
  every layer. Documents are contiguous runs of one id, as packing makes them;
- PREFIX_ATTR: the batch's `Prefix` under a prefix pattern (prefix-LM rows, or a mixture's causal rows
  (prefix 0) and bidirectional rows (prefix L) in one micro-batch): a query sees every key k < prefix of
  its row besides the causal ones, within the window on local layers and within its document. Set by
  attention_for as the documents are: lengths on the device (local layers) and as host ints (global layers).

With documents on CUDA, attention_for also attaches FLEX_ATTR: the micro-batch's FlexAttention block mask
for global layers (ablate.models.flex), built once; a global layer runs FlexAttention under it, compiled,
scoring only the tiles inside documents (without attention dropout; with it, the SDPA path below). Otherwise
each layer is computed through torch's scaled_dot_product_attention (on CUDA its fused kernels):

- global layers: SDPA with is_causal for CLM and no mask for MLM (the fused kernels); with documents, one
  SDPA call per document (what unpadded varlen training computes: sum of len^2, not L^2); with a prefix,
  per row (or document) the fused causal call, its first `prefix` queries replaced by one fused call over
  the prefix alone (bidirectional): no mask, L^2 / 2 + prefix^2 scored;
- local layers: queries in blocks of `block` positions, each block against the keys of its own block and
  `window` positions either side (causal: before only), with a (block, block + 2 window) boolean mask;
  documents, padding and a prefix (the MLM layout, causal or k < prefix) add to that small mask.

Why (measured on this project's 2-core CPU, torch 2.13, 12 heads x 64, fp32, forward + backward of one
layer at 8192 tokens; bench/attention_8192.py measures the whole step): a dense additive CLM mask 9.6 s,
the causal flag 2.7 s; a local layer under today's dense masks 9.6 s (CLM) / 10.6 s (MLM bool), banded
0.3-0.7 s. FlexAttention has no backward on CPU in torch 2.13 ("FlexAttention does not support backward on
CPU"), and FlashAttention is not installed (nor built for CPU): blocked SDPA is what runs on both devices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from ablate.models import flex

IMPLEMENTATION = "ablate_sdpa"
DOCUMENTS_ATTR = "ablate_documents"  # attention-module attribute: Documents, or absent
FLEX_ATTR = "ablate_block_mask"  # attention-module attribute: global layers' BlockMask (CUDA), or absent
PREFIX_ATTR = "ablate_prefix"  # attention-module attribute: Prefix, or absent
MIN_BLOCK = 16  # query block of a local layer: its window, at least this


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    **_kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface: (B, H, L, D) query/key/value -> ((B, L, H, D), None).
    A 4D attention_mask (prepared by hand) goes to transformers' own SDPA function unchanged."""
    if attention_mask is not None and attention_mask.dim() == 4:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal
        )
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    causal = bool(getattr(module, "is_causal", False) if is_causal is None else is_causal)
    documents = getattr(module, DOCUMENTS_ATTR, None)
    prefix = getattr(module, PREFIX_ATTR, None) if causal else None
    keep = None if attention_mask is None else attention_mask.to(torch.bool)  # (B, L): False = padding
    if documents is not None and keep is not None:
        raise ValueError("document masking takes packed sequences without padding; got a padding mask too")
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    local = sliding_window is not None and sliding_window - 1 < query.shape[2] - 1
    block_mask = None if local or keep is not None or dropout else getattr(module, FLEX_ATTR, None)
    if block_mask is not None:
        out = flex.attend(query, key, value, block_mask, scale)
    elif local:
        out = banded(query, key, value, sliding_window - 1, causal, keep, documents, dropout, scale, prefix)
    elif prefix is not None and keep is None:
        out = prefixed(query, key, value, prefix, documents, dropout, scale)
    elif documents is not None:
        out = per_document(query, key, value, causal, documents, dropout, scale)
    else:
        out = full(query, key, value, causal, keep, dropout, scale, prefix)
    return out.transpose(1, 2).contiguous(), None


def full(
    q, k, v, causal: bool, keep: torch.Tensor | None, dropout: float, scale: float, prefix: Prefix | None = None
) -> torch.Tensor:
    """Every key (causal: every earlier one, and a row's prefix): the fused kernels when there is no padding."""
    if keep is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal, scale=scale)
    allowed = keep[:, None, None, :]  # (B, 1, 1, L): padding keys out
    if causal:  # only outside training (padding and CLM): the one place a (B, 1, L, L) mask is built
        length = q.shape[2]
        seen = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()[None]
        if prefix is not None:
            seen = seen | (torch.arange(length, device=q.device) < prefix.lengths[:, None, None])
        allowed = allowed & seen[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout, scale=scale)


@dataclass(frozen=True)
class Documents:
    """The packed documents of a micro-batch, as the attention reads them."""

    ids: torch.Tensor  # (B, L) doc ids on the model's device
    spans: tuple[tuple[tuple[int, int], ...], ...]  # per row, [start, end) of each document (host ints)


def documents_of(doc_ids, device: torch.device | str) -> Documents:
    """Documents from host doc ids (B, L) (numpy or a CPU tensor): the spans found here, once, on the host."""
    host = np.asarray(doc_ids.cpu() if isinstance(doc_ids, torch.Tensor) else doc_ids)
    return Documents(torch.as_tensor(host, dtype=torch.long).to(device, non_blocking=True), document_spans(host))


def document_spans(documents: np.ndarray) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per row, the [start, end) of each contiguous run of one doc id."""
    rows = []
    for row in documents:
        change = (np.flatnonzero(row[1:] != row[:-1]) + 1).tolist()
        bounds = [0, *change, len(row)]
        rows.append(tuple(zip(bounds[:-1], bounds[1:])))
    return tuple(rows)


@dataclass(frozen=True)
class Prefix:
    """Per-row prefix lengths of a micro-batch, as the attention reads them: keys k < prefix are seen from
    every query of the row (0: causal, L: bidirectional)."""

    lengths: torch.Tensor  # (B,) on the model's device
    host: tuple[int, ...]  # the same, host ints


def prefix_of(lengths, device: torch.device | str) -> Prefix:
    """Prefix from host lengths (B,) (a CPU tensor, numpy or a sequence): read here, once, on the host."""
    host = tuple(int(n) for n in np.asarray(lengths.cpu() if isinstance(lengths, torch.Tensor) else lengths))
    return Prefix(torch.tensor(host, dtype=torch.long).to(device, non_blocking=True), host)


def prefixed(q, k, v, prefix: Prefix, documents: Documents | None, dropout: float, scale: float) -> torch.Tensor:
    """Each row (each document of it) with its first `prefix` positions bidirectional, the rest causal."""
    length = q.shape[2]
    rows = []
    for b, p in enumerate(prefix.host):
        spans = documents.spans[b] if documents is not None else ((0, length),)
        rows.append(
            torch.cat(
                [
                    _prefix_piece(
                        q[b : b + 1, :, s:e],
                        k[b : b + 1, :, s:e],
                        v[b : b + 1, :, s:e],
                        min(max(p - s, 0), e - s),
                        dropout,
                        scale,
                    )
                    for s, e in spans
                ],
                dim=2,
            )
        )
    return torch.cat(rows, dim=0)


def _prefix_piece(q, k, v, prefix: int, dropout: float, scale: float) -> torch.Tensor:
    """(1, H, n, D) positions whose first `prefix` see each other and the rest every position before them:
    the fused causal call, its first `prefix` queries replaced by a fused call over the prefix alone."""
    if prefix >= q.shape[2]:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scale)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale)
    if prefix <= 1:  # a one-token prefix sees itself alone, as the causal call has it
        return out
    head = F.scaled_dot_product_attention(
        q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix], dropout_p=dropout, scale=scale
    )
    return torch.cat([head, out[:, :, prefix:]], dim=2)


def per_document(q, k, v, causal: bool, documents: Documents, dropout: float, scale: float) -> torch.Tensor:
    """Each document of each row on its own: SDPA (fused, causal flag) per document."""
    rows = []
    for b, spans in enumerate(documents.spans):
        parts = [
            F.scaled_dot_product_attention(
                q[b : b + 1, :, s:e],
                k[b : b + 1, :, s:e],
                v[b : b + 1, :, s:e],
                dropout_p=dropout,
                is_causal=causal,
                scale=scale,
            )
            for s, e in spans
        ]
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows, dim=0)


def _band_allowed(
    length: int, window: int, block: int, n_blocks: int, causal: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(allowed (n, block, span) bool, key positions (n, span)) of the blocked layout: block i's queries are
    positions i*block + [0, block), its keys i*block - window + [0, span)."""
    span = block + window + (0 if causal else window)
    q_pos = torch.arange(n_blocks * block, device=device).view(n_blocks, block, 1)
    k_pos = (
        torch.arange(n_blocks, device=device)[:, None] * block - window + torch.arange(span, device=device)
    ).view(n_blocks, 1, span)
    distance = q_pos - k_pos
    allowed = (distance <= window) & ((distance >= 0) if causal else (distance >= -window))
    allowed &= (k_pos >= 0) & (k_pos < length)
    # queries past the end (the last block's padding) see everything: their rows are dropped, never NaN
    allowed |= q_pos >= length
    return allowed, k_pos.view(n_blocks, span)


def _blocks(x: torch.Tensor, before: int, after: int, block: int, span: int) -> torch.Tensor:
    """(B, H, L, D) -> (B, H, n, span, D): overlapping windows of `span` keys, `block` apart."""
    padded = F.pad(x, (0, 0, before, after))
    return padded.unfold(2, span, block).transpose(-1, -2)


def banded(
    q,
    k,
    v,
    window: int,
    causal: bool,
    keep: torch.Tensor | None,
    documents: Documents | None,
    dropout: float,
    scale: float,
    prefix: Prefix | None = None,
) -> torch.Tensor:
    """Sliding-window attention (|q - k| <= window; causal: 0 <= q - k <= window; with a prefix: causal or
    k < the row's prefix, within the window) scoring only the keys of each query block's neighbourhood:
    work and memory linear in L."""
    batch, heads, length, dim = q.shape
    block = max(window, MIN_BLOCK)
    n = -(-length // block)
    tail = n * block - length
    one_sided = causal and prefix is None
    span = block + window + (0 if one_sided else window)
    allowed, k_pos = _band_allowed(length, window, block, n, one_sided, q.device)
    kb = _blocks(k, window, tail + span - block - window, block, span)
    vb = _blocks(v, window, tail + span - block - window, block, span)
    qb = F.pad(q, (0, 0, 0, tail)).view(batch, heads, n, block, dim)
    mask = allowed[None]  # (1, n, block, span)
    if keep is not None or documents is not None or prefix is not None:
        index = k_pos.clamp(0, length - 1).flatten()
        per_row = torch.ones(batch, n, block, span, dtype=torch.bool, device=q.device)
        if prefix is not None:
            q_pos = torch.arange(n * block, device=q.device).view(1, n, block, 1)
            keys = k_pos.view(1, n, 1, span)
            per_row &= (keys <= q_pos) | (keys < prefix.lengths.view(batch, 1, 1, 1))
        if keep is not None:
            per_row &= keep[:, index].view(batch, n, 1, span)
        if documents is not None:
            q_docs = F.pad(documents.ids, (0, tail), value=-1).view(batch, n, block, 1)
            per_row &= (q_docs == documents.ids[:, index].view(batch, n, 1, span)) | (q_docs == -1)
        mask = (
            (allowed & per_row)[:, None]
            .expand(batch, heads, n, block, span)
            .reshape(batch * heads, n, block, span)
        )
    # 4D (B*H, n, block, D): the layout SDPA's fused CPU kernel takes (measured faster than 5D)
    out = F.scaled_dot_product_attention(
        qb.reshape(batch * heads, n, block, dim),
        kb.reshape(batch * heads, n, span, dim),
        vb.reshape(batch * heads, n, span, dim),
        attn_mask=mask,
        dropout_p=dropout,
        scale=scale,
    )
    # reshape, not view: CUDA's memory-efficient kernel returns a transposed view ((B*H, n, block, D) over
    # (B*H, block, n, D) memory) that no view can merge n and block of; on CPU the output is contiguous and
    # this is a view
    return out.reshape(batch, heads, n * block, dim)[:, :, :length]


def padding_only(attention_mask: torch.Tensor | None = None, **_kwargs) -> torch.Tensor | None:
    """transformers' mask-function interface: the 2D padding mask as it came (bool; None without padding),
    no 4D mask. Without a mask function of its own, an implementation gets no mask at all: padding lost."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask


AttentionInterface.register(IMPLEMENTATION, attention)
AttentionMaskInterface.register(IMPLEMENTATION, padding_only)
