"""Attention that scores only the keys a layer may see: no L x L mask, for training at long sequences.

Registered with transformers as the attention implementation IMPLEMENTATION ("ablate_sdpa"); the training
loop switches a model to it for the duration of a step (ablate.train.attention_masks.attention_for, mask kind
"banded"), so a saved model's config and fine-tuning keep transformers' own "sdpa". Its mask function
(padding_only) builds no 4D mask: the attention function gets the model's 2D padding mask (None in
training: packed sequences) and reads from the attention module

- `is_causal` (set by attention_for for CLM, as the "flag" kind does);
- `sliding_window` (ModernBERT's local layers: config.sliding_window + 1, flash attention's inclusive bound;
  a query sees keys with |q - k| <= config.sliding_window, causal: 0 <= q - k <= config.sliding_window,
  exactly transformers' masks);
- INPUTS_ATTR: the micro-batch's `LayerInputs`, set by attention_for once per micro-batch, found on the host
  before the ids went to the device (no layer reads anything back: on CUDA that would wait for the GPU in
  every layer): which device's kernels run; the `Documents` when attention stays inside each packed
  document (`document_masking`: doc ids on the device, each row's spans on the host; documents are
  contiguous runs of one id, as packing makes them), and on CUDA the same documents as flash varlen
  `Segments`; the `Prefix` under a prefix pattern (prefix-LM rows, or a mixture's causal rows (prefix 0) and
  bidirectional rows (prefix L) in one micro-batch: a query sees every key k < prefix of its row besides
  the causal ones, within the window on local layers and within its document); and, on CUDA with a prefix,
  the global layers' FlexAttention block mask (ablate.models.flex).

Each layer takes one of the computations `route` names, by the device's kernels and the inputs:

- CUDA, bf16/fp16: local layers and documents through FlashAttention's variable-length kernel
  (ablate.models.varlen: windows (w, w) or causal (w, 0), one segment per row or per document, no mask, no
  padding, no copy of the keys); global layers without documents through SDPA, cuDNN first (sdpa_priority);
  a prefix pattern through FlexAttention (global) and the blocked path (local);
- the CPU (and CUDA in float32, or under attention dropout, which flash varlen lacks): global layers SDPA
  with is_causal for CLM and no mask for MLM (the fused kernels); with documents, one SDPA call per document
  (sum of len^2, not L^2); with a prefix, per row (or document) the fused causal call, its first `prefix`
  queries replaced by one fused call over the prefix alone (bidirectional); local layers in query blocks of
  `block` positions, each against its own block and `window` positions either side (causal: before only),
  with a (block, block + 2 window) boolean mask that documents, padding and a prefix add to.

Why the CPU keeps the blocked path (measured on this project's 2-core CPU, torch 2.13, 12 heads x 64, fp32,
forward + backward of one layer at 8192 tokens; bench/attention_8192.py measures the whole step): a dense
additive CLM mask 9.6 s, the causal flag 2.7 s; a local layer under dense masks 9.6 s (CLM) / 10.6 s (MLM
bool), blocked 0.3-0.7 s. FlashAttention has no CPU kernel, and FlexAttention no backward on the CPU.
The meta device takes CUDA's choices (kernels_for): the memory plan and the CUDA-path tests trace them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from ablate.models import flex, varlen

IMPLEMENTATION = "ablate_sdpa"
INPUTS_ATTR = "ablate_inputs"  # attention-module attribute: the micro-batch's LayerInputs, or absent
MIN_BLOCK = 16  # query block of a local layer (CPU): its window, at least this
FLASH_DTYPES = (torch.float16, torch.bfloat16)  # what FlashAttention computes in
GPU_KERNELS = "cuda"  # LayerInputs.kernels: the CUDA kernels (on CUDA, and on meta, which stands for it)
CPU_KERNELS = "cpu"


@dataclass(frozen=True)
class LayerInputs:
    """What every attention layer of one micro-batch reads besides q, k and v (set by
    ablate.train.attention_masks.attention_for, found on the host once per micro-batch)."""

    kernels: str = CPU_KERNELS  # GPU_KERNELS or CPU_KERNELS: which device's paths (kernels_for)
    documents: Documents | None = None  # attention stays inside each packed document
    prefix: Prefix | None = None  # per-row prefix lengths (a prefix pattern)
    block_mask: object | None = None  # global layers' FlexAttention BlockMask (CUDA, with a prefix)
    segments: varlen.Segments | None = None  # the documents, or padded rows' tokens and padding, as flash
    # varlen segments (CUDA kernels)
    padded: bool = False  # `segments` are padded rows' (fine-tuning): each row's tokens, then its padding


def kernels_for(device: torch.device | str) -> str:
    """The kernels a device runs: CUDA's on CUDA and on meta (the memory plan and the CUDA-path tests trace
    what CUDA runs there), the CPU's elsewhere."""
    return GPU_KERNELS if torch.device(device).type in ("cuda", "meta") else CPU_KERNELS


def route(
    kernels: str,
    device_type: str,
    dtype: torch.dtype,
    local: bool,
    documents: bool,
    prefix: bool,
    padding: bool,
    dropout: bool,
    block_mask: bool,
    padded_segments: bool = False,
) -> str:
    """Which computation a layer runs (pure: tests/test_attention_kernels.py tabulates it):

    varlen        CUDA kernels, FlashAttention's dtypes, a local layer, documents or padding whose rows'
                  lengths came from the host (`padded_segments`: fine-tuning), no prefix or dropout: flash
                  variable length (ablate.models.varlen), windowed on local layers (the CPU runs CUDA's
                  kernels only where a test asks: through the reference kernel, which takes float32 too)
    flex          a global layer under a FlexAttention block mask (CUDA, a prefix pattern)
    banded        a local layer otherwise: blocked SDPA over each query block's window
    prefixed      a global layer under a prefix pattern: fused calls per row (and document)
    per_document  a global layer with documents: one fused call per document
    full          a global layer otherwise: SDPA (on CUDA in the order sdpa_priority sets)"""
    flash = flash_serves(kernels, device_type, dtype) and not (prefix or dropout)
    if flash and (padded_segments or (local or documents) and not padding):
        return "varlen"
    if block_mask and not (local or padding or dropout):
        return "flex"
    if local:
        return "banded"
    if prefix and not padding:
        return "prefixed"
    return "per_document" if documents else "full"


def flash_serves(kernels: str, device_type: str, dtype: torch.dtype) -> bool:
    """Whether flash variable length can run a layer of these kernels, device and dtype (a layer without a
    prefix pattern or attention dropout: `route`)."""
    return varlen.AVAILABLE and kernels == GPU_KERNELS and (dtype in FLASH_DTYPES or device_type == "cpu")


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
    inputs = getattr(module, INPUTS_ATTR, None) or LayerInputs(kernels_for(query.device))
    documents = inputs.documents
    prefix = inputs.prefix if causal else None
    keep = None if attention_mask is None else attention_mask.to(torch.bool)  # (B, L): False = padding
    if documents is not None and keep is not None:
        raise ValueError("document masking takes packed sequences without padding; got a padding mask too")
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    local = sliding_window is not None and sliding_window - 1 < query.shape[2] - 1
    window = sliding_window - 1 if local else None
    how = route(
        inputs.kernels,
        query.device.type,
        query.dtype,
        local,
        documents is not None,
        prefix is not None,
        keep is not None,
        bool(dropout),
        inputs.block_mask is not None,
        inputs.padded and keep is not None,
    )
    if how == "varlen":
        rows, length = query.shape[0], query.shape[2]
        given = documents is not None or (inputs.padded and keep is not None)
        parts = inputs.segments if given else varlen.row_segments(rows, length, query.device)
        return varlen.attend(query, key, value, parts, window, causal, scale), None
    if how == "flex":
        out = flex.attend(query, key, value, inputs.block_mask, scale)
    elif how == "banded":
        out = banded(query, key, value, window, causal, keep, documents, dropout, scale, prefix)
    elif how == "prefixed":
        out = prefixed(query, key, value, prefix, documents, dropout, scale)
    elif how == "per_document":
        out = per_document(query, key, value, causal, documents, dropout, scale)
    else:
        out = full(query, key, value, causal, keep, dropout, scale, prefix)
    return out.transpose(1, 2).contiguous(), None


def sdpa_priority(deterministic: bool = False):
    """A context in which SDPA on CUDA tries cuDNN's kernel first, then flash, memory-efficient and math:
    cuDNN is the fastest of them on Hopper at these shapes (bench/gpu_check.py row 0 says which ran).
    deterministic: flash first, cuDNN last (its backward does not promise repeatable sums). Enter it
    around a step on CUDA: a compiled layer picks its kernel when it is traced."""
    order = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    order = [*order, SDPBackend.CUDNN_ATTENTION] if deterministic else [SDPBackend.CUDNN_ATTENTION, *order]
    return sdpa_kernel(order, set_priority=True)


def kernel_priority(device: torch.device | str, deterministic: bool = False):
    """sdpa_priority on the CUDA kernels (CUDA, and meta, where the memory plan's router reads it), nothing
    on the CPU."""
    return sdpa_priority(deterministic) if kernels_for(device) == GPU_KERNELS else contextlib.nullcontext()


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

    ids: torch.Tensor | None  # (B, L) doc ids on the model's device; None where no kernel reads them
    spans: tuple[tuple[tuple[int, int], ...], ...]  # per row, [start, end) of each document (host ints)


def documents_of(doc_ids, device: torch.device | str, ids_read: bool = True) -> Documents:
    """Documents from host doc ids (B, L) (numpy or a CPU tensor): the spans found here, once, on the host;
    the ids copied to the device only where a kernel reads them (`ids_read`: the banded path and FlexAttention's
    block mask do, flash varlen reads the segments and the per-document path the spans)."""
    host = np.asarray(doc_ids.cpu() if isinstance(doc_ids, torch.Tensor) else doc_ids)
    ids = torch.as_tensor(host, dtype=torch.long).to(device, non_blocking=True) if ids_read else None
    return Documents(ids, document_spans(host))


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
            if documents.ids is None:
                raise RuntimeError(
                    "a banded layer met documents whose ids were not sent to the device (documents_of)"
                )
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
    """transformers' mask-function interface: the 2D padding mask as it came (bool; None without padding on
    the CPU: on CUDA, where looking would wait for the GPU, the mask as it came), no 4D mask. Without a mask
    function of its own, an implementation gets no mask at all: padding lost."""
    if attention_mask is None or (attention_mask.device.type == "cpu" and bool(attention_mask.all())):
        return None
    return attention_mask


AttentionInterface.register(IMPLEMENTATION, attention)
AttentionMaskInterface.register(IMPLEMENTATION, padding_only)
