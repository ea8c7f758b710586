"""The flash variable-length kernel on the CPU, for tests: torch's `torch_attn::_varlen_attn` op and its
backward get a CPU implementation computing ablate.models.varlen.reference (dense masks per segment), so the
CPU runs the very calls the CUDA path makes (cu_seqlens, windows, the autograd wiring, torch.compile's
handling of the op) and checks them against dense masks. The CUDA kernel itself is checked against the same
reference on a GPU (bench/gpu_check.py)."""

from __future__ import annotations

import functools

import torch

from ablate.models import varlen

OP = "torch_attn::_varlen_attn"


def _sides(window_size, is_causal: bool) -> tuple[int, int]:
    left, right = window_size if window_size is not None else (varlen.NO_BOUND, varlen.NO_BOUND)
    return (left, 0) if is_causal and right == varlen.NO_BOUND else (left, right)


def _forward(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None,
             window_size=None, enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):  # fmt: skip
    out, lse = varlen.reference(query, key, value, cu_seq_q, _sides(window_size, is_causal), scale)
    return out, lse, torch.zeros(2, dtype=torch.uint64)


def _backward(grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, rng_state,
              scale=None, window_size=None):  # fmt: skip
    """Attention's gradients written out per segment (autograd is off inside an op's implementation):
    dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    left, right = _sides(window_size, is_causal)
    grads = [torch.zeros_like(t) for t in (query, key, value)]
    bounds = cu_seq_q.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        q, k, v, o, do = (t[start:end].transpose(0, 1) for t in (query, key, value, out, grad_out))  # (H, n, D)
        offset = torch.arange(end - start)[None, :] - torch.arange(end - start)[:, None]  # key - query
        allowed = torch.ones(end - start, end - start, dtype=torch.bool)
        if left != varlen.NO_BOUND:
            allowed &= offset >= -left
        if right != varlen.NO_BOUND:
            allowed &= offset <= right
        p = torch.exp(
            (q @ k.transpose(1, 2) * scale).masked_fill(~allowed, float("-inf")) - lse[:, start:end, None]
        )
        p = p.to(q.dtype)
        ds = p * (do @ v.transpose(1, 2) - (do * o).sum(-1, keepdim=True))
        for grad, part in zip(grads, (ds @ k * scale, ds.transpose(1, 2) @ q * scale, p.transpose(1, 2) @ do)):
            grad[start:end] = part.transpose(0, 1)
    return tuple(grads)


@functools.cache
def register() -> None:
    """Give the op and its backward their CPU implementations (once per process; the CUDA ones untouched)."""
    torch.library.register_kernel(OP, "cpu", _forward)
    torch.library.register_kernel(OP + "_backward", "cpu", _backward)
