"""The MLM head's vocabulary projection and its cross-entropy, fused and a chunk of positions at a time.

    fused_cross_entropy(features, weight, bias, labels)
        = sum over positions with a label (not ignore_index) of cross_entropy(features @ weight.T + bias, label)

is what dense_cross_entropy computes, without ever holding the (positions x vocabulary) logits, forward or
backward. Each chunk of positions is projected, and the gradients w.r.t. the features, the weight and the
bias are computed from its softmax right there, in the forward pass; backward only scales them by the
incoming gradient. So one chunk's logits exist at a time, nothing vocabulary-sized per position is kept for
backward, and the matmuls are the dense path's three.

- CUDA (and meta, which stands for it), `_chunked_gpu`: chunks of gpu_chunk positions (GPU_CHUNK_BYTES of
  logits), each chunk's loss and d loss / d logits (softmax - one-hot) in one compiled op (softmax_tail:
  float32 in registers, no float32 copy of the logits), then the three matmuls in the compute dtype.
- The CPU, ablate.train.cpu.chunked: chunks of 512 positions, the softmax's 1/sum and the one-hot applied to
  the small matmul results, each chunk's logits in the layout MKL runs fastest in.

Precision: the matmuls run in the features' dtype, or under autocast in autocast's dtype (bf16), as F.linear
would; the exponentials, the loss and the sums over chunks are float32 (float64 for float64 inputs); each
gradient comes back in its input's dtype. A weight tied to the input embeddings gets this gradient added to
the embedding's by autograd, as with the dense head. With grad disabled (or nothing that needs it) only the
loss is computed. Deterministic: the CUDA path has no atomic adds; on the CPU the result is deterministic for
a given thread count (fixed chunk order; index_add_ is sequential there).

`LOSSES` maps the RunSpec's `vocab_loss` to the function the training loop calls.

May import: train (cpu).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ablate.train import cpu

IGNORE_INDEX = -100
# On CUDA a chunk's logits take at most this many bytes (ModernBERT's 50,368-token vocabulary in bf16: 2,664
# positions), and their gradient as many beside them: the head runs when the forward's activations are all
# held, so the chunk adds to the step's peak. The memory plan's trace of ModernBERT-base at 8192 x 4 (MLM):
# 21.3 GiB with 512-position chunks, 21.6 at 2,048, 22.5 at 8,192; the matmuls stay large at these sizes.
GPU_CHUNK_BYTES = 2**28


def dense_cross_entropy(
    features: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """The reference: all logits at once (F.linear), then cross-entropy in float32 (float64 for float64 inputs)
    summed over labelled rows."""
    logits = F.linear(features, weight, bias)
    return F.cross_entropy(logits.to(_wide(logits.dtype)), labels, reduction="sum", ignore_index=ignore_index)


def fused_cross_entropy(
    features: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    chunk: int | None = None,
    gpu: bool | None = None,
) -> torch.Tensor:
    """dense_cross_entropy's value and gradients, a chunk of positions at a time (see the module docstring).
    features (N, H), weight (V, H), bias (V,) or None, labels (N,) int64; returns a float32 scalar
    (float64 for float64 inputs). gpu (None: on CUDA, and on meta, which stands for it): CUDA's path,
    _chunked_gpu; else the CPU's loop, ablate.train.cpu.chunked. chunk: positions per chunk (default: gpu_chunk
    on CUDA's path, else cpu.CHUNK)."""
    device = features.device.type
    gpu = device in ("cuda", "meta") if gpu is None else gpu
    dtype = torch.get_autocast_dtype(device) if _autocast_on(device) else features.dtype
    chunk = chunk if chunk is not None else gpu_chunk(weight.shape[0], dtype) if gpu else cpu.CHUNK
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (features, weight, bias))
    compute = _chunked_gpu if gpu else cpu.chunked
    return _FusedCrossEntropy.apply(features, weight, bias, labels, dtype, ignore_index, chunk, grads, compute)


LOSSES = {"fused": fused_cross_entropy, "dense": dense_cross_entropy}


def gpu_chunk(vocab: int, dtype: torch.dtype) -> int:
    """Positions per chunk on CUDA: as many as GPU_CHUNK_BYTES of logits hold."""
    return max(1, GPU_CHUNK_BYTES // (vocab * dtype.itemsize))


def _autocast_on(device_type: str) -> bool:
    """Whether autocast is on for `device_type`; devices without autocast (meta) never are."""
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def _wide(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 inputs: what the softmax and the sums run in."""
    return torch.promote_types(dtype, torch.float32)


class _FusedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, weight, bias, labels, dtype, ignore_index, chunk, grads, compute):
        want = [grads and ctx.needs_input_grad[i] for i in range(3)]
        device = features.device.type
        with torch.autocast(device, enabled=False) if _autocast_on(device) else contextlib.nullcontext():
            loss, *ctx.grads = compute(features, weight, bias, labels, dtype, ignore_index, chunk, *want)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.grads is None:
            raise RuntimeError(
                "backward through fused_cross_entropy twice: its gradients were handed over already"
            )
        grads, ctx.grads = ctx.grads, None
        # in place: these tensors are this call's own, and scaling a copy of the (V, H) weight gradient would
        # add one at the moment backward starts, the step's memory peak
        scaled = [None if g is None else g.mul_(grad_loss.to(g.dtype)) for g in grads]
        return (*scaled, None, None, None, None, None, None)


def _chunked_gpu(features, weight, bias, labels, dtype, ignore_index, chunk, want_x, want_w, want_b):
    """_chunked on CUDA: chunks of gpu_chunk positions, (positions x vocabulary), each chunk's softmax and
    its gradient in one compiled kernel (softmax_tail: float32 inside, never a float32 copy of the logits);
    the gradient w.r.t. the logits (softmax - one-hot) goes into the three matmuls as autocast's backward
    would hand it to them: in `dtype`."""
    acc = _wide(dtype)
    w = weight.to(dtype)
    b = None if bias is None else bias.to(dtype)
    x_all = features.to(dtype)
    loss = torch.zeros((), dtype=acc, device=features.device)
    grad_x = torch.empty_like(features) if want_x else None
    grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_w else None
    grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if want_b else None
    for start in range(0, features.shape[0], chunk):
        x, y = x_all[start : start + chunk], labels[start : start + chunk]
        part, grad_logits = softmax_tail(F.linear(x, w, b), y, ignore_index)
        loss += part
        if want_x:
            grad_x[start : start + chunk] = (grad_logits @ w).to(grad_x.dtype)
        if want_w:
            grad_w += (grad_logits.t() @ x).to(acc)
        if want_b:
            grad_b += grad_logits.sum(0, dtype=acc)
    cast = lambda g, like: None if g is None else g.to(like.dtype)  # noqa: E731
    return loss, grad_x, cast(grad_w, weight), cast(grad_b, bias)


def _softmax_tail(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy over labelled rows (float32, float64 for float64 logits), d loss / d logits =
    softmax - one-hot, zero on ignored rows, in the logits' dtype) of (N, V) logits: what CUDA compiles."""
    z = logits.to(_wide(logits.dtype))
    valid = labels != ignore_index
    target = torch.where(valid, labels, 0)
    lse = torch.logsumexp(z, dim=1)
    picked = z.gather(1, target[:, None]).squeeze(1)
    loss = torch.where(valid, lse - picked, 0.0).sum()
    hot = torch.arange(z.shape[1], device=z.device)[None, :] == target[:, None]
    grad = (torch.exp(z - lse[:, None]) - hot.to(z.dtype)) * valid[:, None]
    return loss, grad.to(logits.dtype)


def _softmax_tail_in_place(logits, labels, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """_softmax_tail's values computed in its output, with no other (N, V) tensor: the eager form (the CPU,
    and the GPU memory plan's check against real tensors), exact in float32 and float64."""
    wide = _wide(logits.dtype)
    valid = labels != ignore_index
    target = torch.where(valid, labels, 0)[:, None]
    picked = logits.gather(1, target).squeeze(1).to(wide)
    top = logits.amax(1, keepdim=True)
    grad = torch.sub(logits, top)  # the output
    total = grad.exp_().sum(1, dtype=wide)
    loss = torch.where(valid, total.log() + top.squeeze(1).to(wide) - picked, 0.0).sum()
    grad.mul_(total.reciprocal().to(grad.dtype)[:, None])
    grad.scatter_add_(1, target, torch.full_like(target, -1, dtype=grad.dtype))
    return loss, grad.mul_(valid[:, None])


_COMPILED_TAIL: list = []  # torch.compile(_softmax_tail), made on first use on CUDA


@torch.library.custom_op("ablate::softmax_tail", mutates_args=())
def softmax_tail(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """_softmax_tail as one op: compiled on CUDA (fused kernels that read the logits once, in their dtype,
    float32 in registers, and write the gradient), computed in place in its output elsewhere. Its fake
    gives the meta device (the memory plan) the outputs alone, as the compiled kernels allocate them."""
    if not logits.is_cuda:
        return _softmax_tail_in_place(logits, labels, ignore_index)
    if not _COMPILED_TAIL:
        _COMPILED_TAIL.append(torch.compile(_softmax_tail))  # shapes: dynamic after the first chunk size
    return _COMPILED_TAIL[0](logits, labels, ignore_index)


@softmax_tail.register_fake
def _(logits, labels, ignore_index):
    return logits.new_empty((), dtype=_wide(logits.dtype)), torch.empty_like(logits)
