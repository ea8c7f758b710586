"""What only the CPU runs: the speed paths measured on this project's 2-core CPU (BENCHMARKS.md). On CUDA
none of this runs, so a reader of the GPU path can skip this module; each path is chosen by device where it
is used (ablate.train.loop, ablate.train.vocab_loss). Fine-tuning's CPU path, a batch run in length-sorted
pieces, is ablate.evaluate.batching's.

- Dropout masks from numpy's SFC64 stream (`cpu_dropout`, `CpuDropout`).
- The vocabulary head's chunked loop (`chunked`): chunks of CHUNK positions, each chunk's logits in the layout
  MKL runs the three matmuls fastest in (`logits_view`, VOCAB_MAJOR_FROM); CUDA's loop is
  ablate.train.vocab_loss._chunked_gpu.

Dropout: torch's CPU `bernoulli_` draws two 32-bit Mersenne-Twister numbers per element, one element after another in one
thread: in a BERT CLM step on 2 cores the attention-probability masks (B x H x L x L) and the hidden-state
masks took 15% of the step while the other core waited. Here each element's keep/drop is one 32-bit word of
SFC64 (numpy's fastest bit generator, 64 bits per draw), compared with a threshold as a signed integer in
torch (both cores), the same Bernoulli(1 - p) scaled by 1 / (1 - p) that torch applies.

`cpu_dropout(seed, device)` is what a training step enters around each micro-batch's forward: it seeds torch
(for any dropout a model draws by hand, e.g. DeBERTa's) and, on the CPU, activates `CpuDropout`, a
TorchFunctionMode that answers

- F.dropout (nn.Dropout, and eager attention's dropout on the probabilities) with a mask from the stream;
- F.scaled_dot_product_attention with dropout_p > 0 (torch's CPU SDPA draws its mask by bernoulli_ in its
  math path) by the same math written out: scores, causal or given mask, softmax, the stream's mask, values.

Without dropout, or on CUDA (Philox inside the fused kernels), nothing changes. A compiled encoder is not put
under the mode (inductor draws its own dropout). Masks are a pure function of (seed, the order of the draws),
so a resumed or repeated step draws the same ones.

May import: nothing from ablate. Torch and numpy only.
"""

from __future__ import annotations

import contextlib
import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_WORD = 2**32


def _dropout_args(input, p=0.5, training=True, inplace=False):
    return input, p, training, inplace


def _sdpa_args(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


class CpuDropout(TorchFunctionMode):
    """Dropout drawn from one SFC64 stream seeded by `seed`: every mask in call order."""

    def __init__(self, seed: int):
        super().__init__()
        self.bits = np.random.SFC64(seed)

    def keep(self, shape: torch.Size, p: float, dtype: torch.dtype) -> torch.Tensor:
        """1 with probability 1 - p, else 0: each element one uniform 32-bit word, read as a signed int32
        (uniform on [-2^31, 2^31)) and kept below -2^31 + round((1 - p) 2^32)."""
        n = math.prod(shape)
        words = torch.from_numpy(self.bits.random_raw((n + 1) // 2).view(np.int32)[:n])
        threshold = round((1 - p) * _WORD) - _WORD // 2
        return torch.lt(words, threshold, out=torch.empty(n, dtype=dtype)).view(shape)

    def dropout(self, x: torch.Tensor, p: float, inplace: bool) -> torch.Tensor:
        """x * keep / (1 - p), as torch's dropout computes it (its noise is keep / (1 - p))."""
        if p >= 1:
            return x.mul_(0.0) if inplace else x * 0.0
        keep = self.keep(x.shape, p, x.dtype)
        return (x.mul_(keep) if inplace else x * keep).mul_(1 / (1 - p))

    def attention(
        self, q, k, v, attn_mask, p: float, is_causal: bool, scale: float | None, enable_gqa: bool
    ) -> torch.Tensor:
        """torch's math path (_scaled_dot_product_attention_math) with this stream's mask on the probabilities."""
        if enable_gqa:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        scores = torch.matmul(q * scale, k.transpose(-2, -1))
        if is_causal:  # an additive mask: no pass in the backward, and every row keeps its diagonal
            scores = scores + _causal_bias(q.shape[-2], k.shape[-2], scores.dtype)
        if attn_mask is not None:
            scores = (
                scores.masked_fill(attn_mask.logical_not(), -math.inf)
                if attn_mask.dtype == torch.bool
                else scores + attn_mask
            )
        # a row that a given mask hides entirely attends to nothing, as in torch's math path
        probs = scores.softmax(-1) if attn_mask is None else torch._safe_softmax(scores, -1)
        if p >= 1:
            return torch.matmul(probs * 0.0, v)
        # the 1 / (1 - p) on the (L x D) output: the same product, one pass over L x L fewer
        return torch.matmul(probs * self.keep(probs.shape, p, probs.dtype), v).mul_(1 / (1 - p))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout:
            x, p, training, inplace = _dropout_args(*args, **kwargs)
            if training and p > 0 and x.device.type == "cpu":
                return self.dropout(x, p, inplace)
        elif func is F.scaled_dot_product_attention:
            q, k, v, mask, p, causal, scale, gqa = _sdpa_args(*args, **kwargs)
            if p > 0 and q.device.type == "cpu":
                return self.attention(q, k, v, mask, p, causal, scale, gqa)
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=8)
def _causal_bias(queries: int, keys: int, dtype: torch.dtype) -> torch.Tensor:
    """0 where key <= query (torch's is_causal: top-left aligned), -inf above."""
    return torch.zeros(queries, keys, dtype=dtype).masked_fill_(
        torch.ones(queries, keys, dtype=torch.bool).triu_(1), -math.inf
    )


def cpu_dropout(seed: int, device: torch.device | str, compiled: bool = False):
    """Seeds torch with `seed`, and on the CPU (eager) draws the forward's dropout from CpuDropout(seed)."""
    torch.manual_seed(seed)
    if torch.device(device).type != "cpu" or compiled:
        return contextlib.nullcontext()
    return CpuDropout(seed)


# ---------------------------------------------------------------- the vocabulary head's loop

CHUNK = 512  # positions per chunk: 62 MB of float32 logits at BERT's 30,522-token vocabulary
# Chunks of this many positions or more are stored vocabulary-major: measured, position-major is the faster at
# 307 positions and vocabulary-major at 448 and more (bench/vocab_head.py).
VOCAB_MAJOR_FROM = 400


def logits_view(flat: torch.Tensor, vocab: int, positions: int) -> torch.Tensor:
    """A (vocabulary x positions) view of `flat` for one chunk's logits, in the memory layout its matmuls run
    fastest in: vocabulary-major (contiguous) for big CPU chunks, position-major (the transpose of a contiguous
    (positions x vocabulary)) otherwise. Every op of the loop reads either layout through the same view."""
    if flat.device.type == "cpu" and positions >= VOCAB_MAJOR_FROM:
        return flat.view(vocab, positions)
    return flat.view(positions, vocab).t()


def chunked(features, weight, bias, labels, dtype, ignore_index, chunk, want_x, want_w, want_b):
    """ablate.train.vocab_loss's fused loss on the CPU: (loss, grad features, grad weight, grad bias), the
    gradients None where not wanted (its module docstring says what is computed)."""
    acc = torch.promote_types(dtype, torch.float32)  # exponentials, loss and gradient sums
    w = weight.to(dtype)
    b = None if bias is None else bias.to(dtype)[:, None]
    x_all = features.to(dtype)
    n, vocab = features.shape[0], weight.shape[0]
    loss = torch.zeros((), dtype=acc, device=features.device)
    grad_x = torch.empty_like(features) if want_x else None
    grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_w else None
    grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if want_b else None
    buffer = torch.empty(vocab * min(chunk, n), dtype=dtype, device=features.device)
    for start in range(0, n, chunk):
        x, y = x_all[start : start + chunk], labels[start : start + chunk]
        logits = logits_view(buffer[: vocab * len(x)], vocab, len(x))  # (vocabulary x positions), either layout
        torch.addmm(b, w, x.t(), out=logits) if b is not None else torch.mm(w, x.t(), out=logits)
        z = logits.to(acc)  # the same tensor unless dtype is narrower
        valid = y != ignore_index
        target = torch.where(valid, y, torch.zeros_like(y))
        picked = z.gather(0, target[None, :]).squeeze(0)
        top = z.amax(0, keepdim=True)
        e = z.sub_(top).exp_()  # exp(logit - position's max), in place
        total = e.sum(0)
        loss += torch.where(valid, total.log() + top.squeeze(0) - picked, 0.0).sum()
        if not (want_x or want_w or want_b):
            continue
        # d loss / d logit = softmax - one-hot = e * scale - one-hot on labelled positions, 0 on ignored ones
        scale = torch.where(valid, total.reciprocal(), 0.0)
        hot = valid.to(acc)
        e_low = e.to(dtype)
        if want_x:
            gx = (e_low.t() @ w).to(acc).mul_(scale[:, None])
            gx -= w.index_select(0, target).to(acc) * hot[:, None]
            grad_x[start : start + chunk] = gx.to(grad_x.dtype)
        if want_w:
            xs = x.to(acc) * scale[:, None]
            if dtype == acc:
                grad_w.addmm_(e, xs)
            else:
                grad_w += (e_low @ xs.to(dtype)).to(acc)
            grad_w.index_add_(0, target, x.to(acc) * -hot[:, None])
        if want_b:
            grad_b.addmv_(e, scale)
            grad_b.index_add_(0, target, -hot)
    cast = lambda g, like: None if g is None else g.to(like.dtype)  # noqa: E731
    return loss, grad_x, cast(grad_w, weight), cast(grad_b, bias)
