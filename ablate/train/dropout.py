"""Dropout masks on the CPU, drawn from numpy's SFC64 instead of torch's Mersenne Twister.

torch's CPU `bernoulli_` draws two 32-bit Mersenne-Twister numbers per element, one element after another in one
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

May import: nothing from ablate (torch and numpy only).
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
