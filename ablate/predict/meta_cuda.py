"""A training step's CUDA paths on the meta device of a CPU-only machine: what the GPU memory plan traces
(ablate.predict.gpu_memory) and what the CUDA-path tests run (tests/cuda_paths.py re-exports it).

On the meta device every op computes shapes, strides and dtypes only, through torch's own meta
implementations, and a meta tensor behaves as a CUDA one would where it matters here:

- a tensor made on the CPU that meets a meta one fails ("Tensor on device meta is not on the expected
  device cpu"), as it would meet a CUDA tensor (0-dim CPU scalars excepted, as on CUDA);
- a host read fails: .item(), .tolist(), .cpu(), bool(tensor), float(tensor), and boolean-mask indexing
  (torch.nonzero has no meta implementation: on CUDA it synchronises with the host).

What meta does not do by itself is pick CUDA's attention kernel: F.scaled_dot_product_attention on meta
decomposes into the math path, whose output is contiguous. `CudaKernels` (a TorchFunctionMode) routes every
SDPA call on meta tensors to the kernel torch's CUDA dispatcher would select for those inputs
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp), trying the enabled backends in torch's priority
order (a training step sets cuDNN first: ablate.models.attention.sdpa_priority):

- cuDNN: float16/bfloat16, one head dim <= 128 and a multiple of 8, last dim contiguous, no grouped-query
  heads, not is_causal with a query length different from the key length, and not under deterministic
  algorithms (torch does not select it there: its backward is not repeatable);
- flash: no attn_mask, float16/bfloat16, q/k/v of one head dim <= 256, last dim contiguous, and not
  is_causal with a query length different from the key length;
- memory-efficient: float32/16/bf16, head dim a multiple of 8 and <= 256, masks allowed (a bool mask goes in
  as an additive float bias in the query's dtype, as sdpa's preprocess_mask hands it), no grouped-query heads;
- math otherwise (aten._scaled_dot_product_attention_math: contiguous output, as on CUDA).

The fused kernels run through `torch.ops.aten._scaled_dot_product_{cudnn,flash,efficient}_attention` and
their `_backward` ops (wrapped in an autograd.Function as torch's derivatives.yaml wires them), so outputs and
gradients take the CUDA kernels' layouts: the efficient kernel returns a transposed view ((B, H, L, D) over
(B, L, H, D) memory), on which `.view` merging L with another dim fails as it does on CUDA. The other CUDA
kernels a step runs are ops with fake implementations of their own, which meta runs as they are: flash
variable length (ablate::varlen_attn, ablate.models.varlen; recorded as "varlen") and the vocabulary
loss's compiled softmax (ablate::softmax_tail, ablate.train.vocab_loss).

Meta has no autocast dispatch key. The tests stand bf16 autocast in by bf16 weights; `CudaKernels(autocast=
True)` does what CUDA's autocast does at the functions a step calls instead, on float32 weights (the master
weights a bf16 run keeps): matmuls, linear layers and SDPA get their floating inputs cast to bf16 (the cast
copies are what autograd saves, as under autocast), layer norms, softmax and cross-entropy to float32.
`paused` lets the fused vocabulary loss run as it does under autocast (which it switches off inside).

May import: models.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode

import ablate.models.varlen  # noqa: F401  (registers ablate::varlen_attn)

aten = torch.ops.aten
VARLEN_OP = torch.ops.ablate.varlen_attn  # registered by importing ablate.models.varlen
MAX_HEAD_DIM = 256
CUDNN_MAX_HEAD_DIM = 128  # cuDNN's attention backward (sm90)
BACKENDS = {
    int(SDPBackend.CUDNN_ATTENTION): "cudnn",
    int(SDPBackend.FLASH_ATTENTION): "flash",
    int(SDPBackend.EFFICIENT_ATTENTION): "efficient",
}  # torch's SDP priority entries -> the router's names (math is what is left)


def cuda_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    enable_gqa: bool = False,
) -> str:
    """'cudnn', 'flash', 'efficient' or 'math': what SDPA on CUDA (sm90) runs for these inputs, trying the
    enabled backends in torch's priority order (ablate.models.attention.sdpa_priority sets it for a step)."""
    dims = {q.shape[-1], k.shape[-1], v.shape[-1]}
    same_heads = q.shape[:-3] == k.shape[:-3] and q.shape[-3] == k.shape[-3] == v.shape[-3]
    strided = all(t.stride(-1) == 1 for t in (q, k, v))
    head_ok = len(dims) == 1 and max(dims) <= MAX_HEAD_DIM
    low = q.dtype in (torch.float16, torch.bfloat16)
    fits = {
        "cudnn": low
        and len(dims) == 1
        and max(dims) <= CUDNN_MAX_HEAD_DIM
        and max(dims) % 8 == 0
        and strided
        and same_heads
        and not (is_causal and q.shape[-2] != k.shape[-2])
        and not torch.are_deterministic_algorithms_enabled(),  # torch skips cuDNN's backward: not repeatable
        "flash": attn_mask is None
        and low
        and head_ok
        and strided
        and (same_heads or enable_gqa)
        and not (is_causal and q.shape[-2] != k.shape[-2]),
        "efficient": q.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and head_ok
        and max(dims) % 8 == 0
        and strided
        and same_heads,
    }
    enabled = {
        "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
        "flash": torch.backends.cuda.flash_sdp_enabled(),
        "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
    }
    for backend in torch._C._get_sdp_priority_order():
        name = BACKENDS.get(int(backend))
        if name is not None and enabled[name] and fits[name]:
            return name
    return "math"


def _bias(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """The efficient kernel's attn_bias: additive, the query's dtype, expanded to (B, H, Lq, Lk)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, -math.inf)
    return mask.to(q.dtype).expand(*q.shape[:-1], k.shape[-2])


class _Flash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dropout, causal, scale):
        out, lse, cq, ck, mq, mk, rng, unused, _debug = aten._scaled_dot_product_flash_attention(
            q, k, v, dropout, causal, False, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse, cq, ck, rng, unused)
        ctx.args = (mq, mk, dropout, causal, scale)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, cq, ck, rng, unused = ctx.saved_tensors
        mq, mk, dropout, causal, scale = ctx.args
        gq, gk, gv = aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, out, lse, cq, ck, mq, mk, dropout, causal, rng, unused, scale=scale
        )
        return gq, gk, gv, None, None, None


class _Cudnn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, dropout, causal, scale):
        out, lse, cq, ck, mq, mk, seed, offset, _debug = aten._scaled_dot_product_cudnn_attention(
            q, k, v, bias, True, dropout, causal, False, scale=scale
        )
        ctx.save_for_backward(q, k, v, bias, out, lse, seed, offset)
        ctx.args = (mq, mk, dropout, causal, scale)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, bias, out, lse, seed, offset = ctx.saved_tensors
        mq, mk, dropout, causal, scale = ctx.args
        empty = q.new_empty(0)
        gq, gk, gv = aten._scaled_dot_product_cudnn_attention_backward(
            grad, q, k, v, out, lse, seed, offset, bias if bias is not None else empty, empty, empty, mq, mk,
            dropout, causal, scale=scale,
        )  # fmt: skip
        return gq, gk, gv, None, None, None, None


class _Efficient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, dropout, causal, scale):
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, True, dropout, causal, scale=scale
        )
        ctx.save_for_backward(q, k, v, bias, out, lse, seed, offset)
        ctx.args = (dropout, causal, scale)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, bias, out, lse, seed, offset = ctx.saved_tensors
        dropout, causal, scale = ctx.args
        wanted = [ctx.needs_input_grad[i] for i in range(3)] + [False]
        gq, gk, gv, _gb = aten._scaled_dot_product_efficient_attention_backward(
            grad.contiguous(), q, k, v, bias, out, lse, seed, offset, dropout, wanted, causal, scale=scale
        )
        return gq, gk, gv, None, None, None, None


def sdpa_on_meta(
    q,
    k,
    v,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    record: list | None = None,
) -> torch.Tensor:
    """F.scaled_dot_product_attention as CUDA computes it, on meta tensors."""
    if attn_mask is not None and is_causal:
        raise RuntimeError(
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True"
        )
    kernel = cuda_kernel(q, k, v, attn_mask, is_causal, enable_gqa)
    if record is not None:
        record.append(kernel)
    if kernel == "cudnn":
        return _Cudnn.apply(q, k, v, _bias(attn_mask, q, k), dropout_p, is_causal, scale)
    if kernel == "flash":
        if k.shape[-3] != q.shape[-3]:  # flash takes grouped-query heads natively: same shapes as repeated
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
        return _Flash.apply(q, k, v, dropout_p, is_causal, scale)
    if kernel == "efficient":
        return _Efficient.apply(q, k, v, _bias(attn_mask, q, k), dropout_p, is_causal, scale)
    return aten._scaled_dot_product_attention_math(
        q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )[0]


LOW_PRECISION = {
    F.linear,
    torch.matmul,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.mm,
    torch.Tensor.mm,
    torch.bmm,
    torch.Tensor.bmm,
    torch.addmm,
    torch.baddbmm,
    torch.einsum,
    F.scaled_dot_product_attention,
}  # autocast's bf16 list, as far as a step calls it
FULL_PRECISION = {
    F.layer_norm,
    F.softmax,
    F.log_softmax,
    F.cross_entropy,
    torch.softmax,
    torch.Tensor.softmax,
    torch.log_softmax,
    torch.Tensor.log_softmax,
}  # autocast's float32 list, likewise


def _cast(value, dtype: torch.dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


class CudaKernels(TorchFunctionMode):
    """Within: SDPA on meta tensors runs the kernel CUDA would select; `kernels` lists each call's. With
    `autocast`, bf16 autocast is done at the functions (see the module docstring) while `autocast_on`."""

    def __init__(self, autocast: bool = False):
        super().__init__()
        self.kernels: list[str] = []
        self.autocast_on = autocast
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.autocast_on and not self.paused:
            if func in LOW_PRECISION:
                args = _cast(args, torch.bfloat16)
                kwargs = {k: _cast(v, torch.bfloat16) for k, v in kwargs.items()}
            elif func in FULL_PRECISION:
                args, kwargs = _cast(args, torch.float32), {k: _cast(v, torch.float32) for k, v in kwargs.items()}
        if func is F.scaled_dot_product_attention and args[0].device.type == "meta":
            return sdpa_on_meta(*args, **kwargs, record=self.kernels)
        if func is VARLEN_OP:  # flash variable length (ablate.models.varlen): its own fake gives its layouts
            self.kernels.append("varlen")
        return func(*args, **kwargs)
