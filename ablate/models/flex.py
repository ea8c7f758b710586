"""FlexAttention block masks: global layers kept inside their documents on CUDA, no loop, no dense mask.

A layer's allowed (query, key) pairs are a mask_mod (q and k in the same document; |q - k| <= window for a
local layer; k <= q for CLM, or k < the row's prefix under a prefix pattern). `create_block_mask` turns it into a BlockMask: per 128 x 128 tile of the
score matrix, whether it is empty (skipped), full (computed without a mask) or partial (computed with the
mask_mod). FlexAttention compiled into one Triton kernel scores the non-empty tiles only.

Where it is used, chosen by counted FLOPs (bench/attention_flops.py, BENCHMARKS.md): global layers with
document masking or a per-row prefix (prefix-LM, a mixture's causal and bidirectional rows) on CUDA. There it scores what the documents allow, tile-rounded, in one kernel, where the
SDPA path calls the fused kernel once per document from a Python loop. Local layers keep the blocked SDPA
path of ablate.models.attention: it scores (block + 2 window) keys per query (MLM; block + window for CLM),
the same as FlexAttention with 64-wide tiles and less than with its default 128-wide ones (a 64-token window
touches three 128-tiles per query tile).

The block mask is built in ablate.train.attention_masks.attention_for once per micro-batch (its doc ids differ
from the next micro-batch's; the layers of one micro-batch share it) and read by ablate.models.attention in
every global layer. CUDA only: torch 2.13's FlexAttention runs forward on the CPU but has no backward there,
and refuses the meta device; on the CPU the SDPA paths stay what they were, measured the faster there
(bench/attention_8192.py). tests/test_flex.py checks the block masks against the dense masks of
ablate.train.attention_masks.dense_mask, FlexAttention's forward against SDPA under those, and a model run through
this path against the SDPA paths, on the CPU.

May import: nothing from ablate. Torch only.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

TILE = 128  # FlexAttention's default block size (queries and keys), what its Triton kernel computes in
_COMPILED: dict = {}  # the compiled mask builder (per backend) and FlexAttention, made on first use


def allowed_pairs(
    causal: bool, window: int | None, doc_ids: torch.Tensor | None, prefix: torch.Tensor | None = None
):
    """The mask_mod of a layer: (batch, head, query, key) index tensors -> True where the key is seen.
    prefix (B,): with causal, each row's keys k < prefix are seen from every query as well."""

    def mask_mod(b, h, q, k):
        ok = q >= 0  # all True, as a tensor of the indices' shape
        if causal and prefix is not None:
            ok = ok & ((k <= q) | (k < prefix[b]))
        elif causal:
            ok = ok & (k <= q)
        if window is not None:
            ok = ok & ((q - k).abs() <= window)
        if doc_ids is not None:
            ok = ok & (doc_ids[b, q] == doc_ids[b, k])
        return ok

    return mask_mod


def _create(
    doc_ids: torch.Tensor | None,
    causal: bool,
    window: int | None,
    rows: int,
    length: int,
    device: torch.device | str,
    prefix: torch.Tensor | None = None,
) -> BlockMask:
    return create_block_mask(
        allowed_pairs(causal, window, doc_ids, prefix), rows, None, length, length, device=device, BLOCK_SIZE=TILE
    )


def block_mask(
    batch: int,
    length: int,
    causal: bool,
    window: int | None,
    doc_ids: torch.Tensor | None,
    device: torch.device | str,
    compiled: bool | str | None = None,
    prefix: torch.Tensor | None = None,
) -> BlockMask:
    """The BlockMask of one layer type for a (batch, length) micro-batch (one for every head). Built by a
    compiled function on CUDA (`compiled` None; True: inductor, a string: that torch.compile backend): eager
    create_block_mask materialises the (rows, L, L) mask and its index gathers (4 GB of int64 at 8 x 8192 x
    8192); the doc ids are that function's input, so every micro-batch reuses one graph. prefix (B,) on
    `device`: each row's prefix lengths (with causal)."""
    per_row = doc_ids is not None or (causal and prefix is not None)
    rows = batch if per_row else 1  # without documents or a prefix every row has the same mask
    prefix = prefix if causal else None
    if not (compiled if compiled is not None else torch.device(device).type == "cuda"):
        return _create(doc_ids, causal, window, rows, length, device, prefix)
    backend = compiled if isinstance(compiled, str) else "inductor"
    if ("mask", backend) not in _COMPILED:
        _COMPILED["mask", backend] = torch.compile(_create, dynamic=False, backend=backend)
    return _COMPILED["mask", backend](doc_ids, causal, window, rows, length, device, prefix)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: BlockMask, scale: float) -> torch.Tensor:
    """FlexAttention of (B, H, L, D) q, k, v under `mask` -> (B, H, L, D). Compiled on CUDA (one fused
    kernel); eager elsewhere, which materialises the scores: the CPU runs it only to check it."""
    if q.device.type != "cuda":
        return flex_attention(q, k, v, block_mask=mask, scale=scale)
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"](q, k, v, block_mask=mask, scale=scale)


def computed_pairs(mask: BlockMask, heads: int = 1) -> int:
    """Query-key pairs FlexAttention scores under `mask` (each non-empty tile in full), summed over the
    mask's rows, for `heads` heads."""
    tiles = mask.kv_num_blocks.sum()
    if mask.full_kv_num_blocks is not None:
        tiles = tiles + mask.full_kv_num_blocks.sum()
    q_tile, kv_tile = mask.BLOCK_SIZE
    return int(tiles) * q_tile * kv_tile * heads
