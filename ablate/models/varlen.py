"""Flash attention over variable-length segments: the CUDA kernel of local layers (a sliding window), and of
global layers when attention stays inside each packed document.

torch ships FlashAttention-2's variable-length kernel as the op `torch_attn::_varlen_attn` (behind
`torch.nn.attention.varlen.varlen_attn`): the rows of a micro-batch are flattened into one (tokens, heads, head
dim) tensor, `cu_seqlens` says where each segment (a row, or a document of a row) starts, `max_seqlen` bounds
every segment's length (the kernel launches ceil(max_seqlen / 128) x segments x heads thread blocks), and
`window_size` (left, right) keeps a query's keys within `left` before and `right` after it (-1: no bound; (w, 0)
is causal within w). It scores only what the segments and the window allow, with no mask, no padding and no
copy of the keys.

Why a custom op of our own around it (`ablate::varlen_attn`, with its backward `ablate::varlen_attn_backward`):
a compiled block (ablate.train.compiled) specialises on every Python int and every tensor shape it is given.
torch's op takes the segment count as cu_seqlens' length and `max_seqlen` as an int, so each new document mix
(a new count, a new longest document) would compile every block again. Ours is opaque to the compiler and takes
both as runtime values:

- `cu_seqlens` has one slot per token, plus one (a segment holds at least a token, so any mix fits): its shape
  follows the micro-batch's, never its documents; the spare slots repeat the total (empty segments);
- `sizes`, a (2,) int64 tensor on the host: [segment count, longest segment]. Inside the op the offsets are cut
  to the count (no empty segment is launched) and the longest is read from the host (no wait for the GPU), so
  the kernel's grid is sized to the longest document, not the row.

A compiled block then traces one graph per block kind, frozen state and phase, whatever the documents
(tests/test_compile_documents.py counts them over random document mixes).

A micro-batch's `Segments` are found on the host (the document spans, or the rows) once, before its ids would
go to the device, and every layer reuses them.

`reference` computes the same thing with dense per-segment masks in the inputs' dtype: what the CPU tests
register as the kernel's CPU implementation (tests/varlen_reference.py) and what bench/gpu_check.py compares the
CUDA kernel against.

A torch whose varlen op lacks `window_size` (before 2.10; `AVAILABLE` false) keeps the other paths
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
T = torch.Tensor  # the custom ops' signatures, which torch reads for their schemas
AVAILABLE = varlen_attn is not None and "window_size" in inspect.signature(varlen_attn).parameters


@dataclass(frozen=True)
class Segments:
    """Where each segment of a flattened micro-batch starts: `cu_seqlens` (slots + 1,) int32 on the device,
    non-decreasing, its first count + 1 entries the offsets and the spare slots empty; `sizes` (2,) int64 on
    the host: [count, longest segment]."""

    cu_seqlens: torch.Tensor
    sizes: torch.Tensor

    @property
    def count(self) -> int:
        return int(self.sizes[0])

    @property
    def longest(self) -> int:
        return int(self.sizes[1])


def offsets(spans_per_row, length: int) -> list[int]:
    """Flattened segment starts of rows of `length` tokens from each row's [start, end) spans, then the total:
    [0, ..., rows x length]."""
    starts = [row * length + start for row, spans in enumerate(spans_per_row) for start, _end in spans]
    return [*starts, len(spans_per_row) * length]


def segments(bounds: list[int], length: int, device: torch.device | str) -> Segments:
    """Segments from host offsets (`offsets`) of rows of `length` tokens: one slot per token (the spare ones
    empty), copied from pinned memory to a CUDA device (a pageable copy would wait for the GPU)."""
    count, tokens = len(bounds) - 1, bounds[-1]
    host = torch.full((tokens + 1,), tokens, dtype=torch.int32)
    host[: count + 1] = torch.tensor(bounds, dtype=torch.int32)
    if torch.device(device).type == "cuda":
        host = host.pin_memory()
    longest = max(end - start for start, end in zip(bounds[:-1], bounds[1:]))
    return Segments(host.to(device, non_blocking=True), torch.tensor([count, longest]))


def row_segments(rows: int, length: int, device: torch.device | str) -> Segments:
    """One segment per row (a micro-batch without document masking), made on the device: no copy."""
    cu = torch.arange(0, rows * length + 1, length, dtype=torch.int32, device=device)
    return Segments(cu, torch.tensor([rows, length]))


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
    left, right = window_size(window, causal)
    out, _lse, _rng = torch.ops.ablate.varlen_attn(*flat, parts.cu_seqlens, parts.sizes, left, right, scale)
    return out.view(batch, length, heads, dim)


def _cut(cu_seqlens: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, int]:
    count, longest = (int(n) for n in sizes.tolist())
    return cu_seqlens[: count + 1], longest


@torch.library.custom_op("ablate::varlen_attn", mutates_args=())
def _varlen_attn(q: T, k: T, v: T, cu_seqlens: T, sizes: T, left: int, right: int, scale: float) -> tuple[T, T, T]:
    """torch's varlen op on the first `sizes[0]` segments, bounded by `sizes[1]`: (out, lse, rng state)."""
    cu, longest = _cut(cu_seqlens, sizes)
    causal = (left, right) == (NO_BOUND, 0)  # as torch's varlen_attn sets it
    return torch.ops.torch_attn._varlen_attn(q, k, v, cu, cu, longest, longest, causal, scale, [left, right])


@_varlen_attn.register_fake
def _varlen_attn_fake(q, k, v, cu_seqlens, sizes, left, right, scale):
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)  # (heads, tokens), as flash returns it
    return torch.empty_like(q), lse, q.new_empty((2,), dtype=torch.uint64)


@torch.library.custom_op("ablate::varlen_attn_backward", mutates_args=())
def _varlen_attn_backward(
    grad: T, q: T, k: T, v: T, out: T, lse: T, cu_seqlens: T, sizes: T, rng: T, left: int, right: int, scale: float
) -> tuple[T, T, T]:
    cu, longest = _cut(cu_seqlens, sizes)
    causal = (left, right) == (NO_BOUND, 0)
    return torch.ops.torch_attn._varlen_attn_backward(
        grad.contiguous(), q, k, v, out, lse, cu, cu, longest, longest, causal, rng, scale, [left, right]
    )


@_varlen_attn_backward.register_fake
def _varlen_attn_backward_fake(grad, q, k, v, out, lse, cu_seqlens, sizes, rng, left, right, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens, sizes, left, right, scale = inputs
    out, lse, rng = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, sizes, rng)
    ctx.window = (left, right, scale)


def _backward(ctx, grad, _grad_lse, _grad_rng):
    q, k, v, out, lse, cu_seqlens, sizes, rng = ctx.saved_tensors
    dq, dk, dv = torch.ops.ablate.varlen_attn_backward(
        grad, q, k, v, out, lse, cu_seqlens, sizes, rng, *ctx.window
    )
    return dq, dk, dv, None, None, None, None, None


_varlen_attn.register_autograd(_backward, setup_context=_setup_context)


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
