"""Flash attention over variable-length segments: the CUDA kernel of local layers (a sliding window), and of
global layers when attention stays inside each packed document.

torch ships FlashAttention-2's variable-length kernel as `torch.nn.attention.varlen.varlen_attn`: the rows of
a micro-batch are flattened into one (tokens, heads, head dim) tensor, `cu_seqlens` says where each segment
(a row, or a document of a row) starts, and `window_size` (left, right) keeps a query's keys within
`left` before and `right` after it (-1: no bound; (w, 0) is causal within w). It scores only what the
segments and the window allow, with no mask, no padding and no copy of the keys.

A micro-batch's `Segments` are found on the host (the document spans, or the rows) before its ids go to the
device, once, and every layer reuses them. Their cu_seqlens have a fixed length per row count
(`segment_slots`): the spare slots repeat the last offset (empty segments, which the kernel skips), and the
longest segment is given as the row length. So a compiled layer sees the same shapes and constants in every
micro-batch whatever its documents, and never recompiles for them.

`reference` computes the same thing with dense per-segment masks in the inputs' dtype: what the CPU tests
register as the kernel's CPU implementation (tests/varlen_reference.py) and what bench/gpu_check.py compares the
CUDA kernel against.

Where torch's `varlen_attn` lacks `window_size` or is missing (torch before 2.10), aten's flash forward and
backward ops are called with their window arguments through `_Windowed` (torch's own autograd wiring of
them); a torch whose flash ops take no window either (`AVAILABLE` false) keeps the other paths
(ablate.models.attention.route).

May import: nothing from ablate. Torch only.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # torch < 2.9
    varlen_attn = None

NO_BOUND = -1  # a window side without a bound, as flash attention spells it
HAS_WINDOW = varlen_attn is not None and "window_size" in inspect.signature(varlen_attn).parameters
_ATEN_WINDOW = "window_size_left" in str(torch.ops.aten._flash_attention_forward.default._schema)
AVAILABLE = HAS_WINDOW or _ATEN_WINDOW  # this torch can run flash variable length with windows


@dataclass(frozen=True)
class Segments:
    """Where each segment of a flattened micro-batch starts: cu_seqlens (slots + 1,) int32 on the device,
    non-decreasing, the spare slots empty; `longest` bounds every segment's length (the row length)."""

    cu_seqlens: torch.Tensor
    longest: int


def segment_slots(count: int) -> int:
    """The slots of cu_seqlens for `count` segments: the next power of two, so that a run's micro-batches
    share a handful of shapes (a compiled layer traces one graph per shape)."""
    return 1 << max(count - 1, 0).bit_length()


def offsets(spans_per_row, length: int) -> list[int]:
    """Flattened segment starts of rows of `length` tokens from each row's [start, end) spans, then the total:
    [0, ..., rows x length]."""
    starts = [row * length + start for row, spans in enumerate(spans_per_row) for start, _end in spans]
    return [*starts, len(spans_per_row) * length]


def segments(bounds: list[int], length: int, device: torch.device | str) -> Segments:
    """Segments from host offsets (`offsets`) of rows of `length` tokens, padded to `segment_slots`; copied
    from pinned memory to a CUDA device (a pageable copy would wait for the GPU)."""
    padded = bounds + [bounds[-1]] * (segment_slots(len(bounds) - 1) + 1 - len(bounds))
    host = torch.tensor(padded, dtype=torch.int32)
    if torch.device(device).type == "cuda":
        host = host.pin_memory()
    return Segments(host.to(device, non_blocking=True), length)


def row_segments(rows: int, length: int, device: torch.device | str) -> Segments:
    """One segment per row (a micro-batch without document masking), made on the device: no copy."""
    return Segments(torch.arange(0, rows * length + 1, length, dtype=torch.int32, device=device), length)


def window_size(window: int | None, causal: bool) -> tuple[int, int]:
    """(left, right) for a query seeing keys within `window` positions (None: all), causal: before it only."""
    side = NO_BOUND if window is None else window
    return side, (0 if causal else side)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    parts: Segments,
    window: int | None,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """(B, H, L, D) q, k, v (the layout transformers hands an attention function) -> (B, L, H, D), each query
    attending to the keys of its segment within `window` (causal: not after it)."""
    batch, heads, length, dim = q.shape
    flat = [t.transpose(1, 2).reshape(batch * length, heads, dim) for t in (q, k, v)]
    cu, longest = parts.cu_seqlens, parts.longest
    sides = window_size(window, causal)
    if HAS_WINDOW:
        out = varlen_attn(*flat, cu, cu, longest, longest, scale=scale, window_size=sides)
    else:
        out = _Windowed.apply(*flat, cu, longest, causal, scale, sides)
    return out.view(batch, length, heads, dim)


class _Windowed(torch.autograd.Function):
    """aten's flash forward and backward with window arguments, as torch's varlen_attn wires them (for a
    torch whose varlen_attn has no window_size)."""

    @staticmethod
    def forward(ctx, q, k, v, cu, longest, causal, scale, sides):
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, longest, longest, 0.0, causal, False, scale=scale,
            window_size_left=sides[0], window_size_right=sides[1],
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, cu, rng, unused)
        ctx.args = (longest, causal, scale, sides)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, cu, rng, unused = ctx.saved_tensors
        longest, causal, scale, sides = ctx.args
        gq, gk, gv = torch.ops.aten._flash_attention_backward(
            grad.contiguous(), q, k, v, out, lse, cu, cu, longest, longest, 0.0, causal, rng, unused,
            scale=scale, window_size_left=sides[0], window_size_right=sides[1],
        )  # fmt: skip
        return gq, gk, gv, None, None, None, None, None


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    sides: tuple[int, int],
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the variable-length kernel computes, written out: (T, H, D) q, k, v, each segment of cu_seqlens
    on its own under a dense mask (key j seen from query i when i - left <= j <= i + right, -1 no bound), in
    the inputs' dtype. Returns (out (T, H, D), the log-sum-exp of the scaled scores (H, T), float32 or
    wider), as the kernel does. Differentiable."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    outs, lses = [], []
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        pos = torch.arange(end - start, device=q.device)
        offset = pos[None, :] - pos[:, None]  # key - query
        allowed = torch.ones(end - start, end - start, dtype=torch.bool, device=q.device)
        if sides[0] != NO_BOUND:
            allowed &= offset >= -sides[0]
        if sides[1] != NO_BOUND:
            allowed &= offset <= sides[1]
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # (H, n, D)
        scores = (qs @ ks.transpose(1, 2) * scale).masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # (H, n)
        outs.append((torch.exp(scores - lse[..., None]) @ vs).transpose(0, 1))
        lses.append(lse.to(torch.promote_types(lse.dtype, torch.float32)))
    return torch.cat(outs), torch.cat(lses, dim=1)
