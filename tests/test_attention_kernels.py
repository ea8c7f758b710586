"""The CUDA attention paths (ablate.models.varlen: flash variable length with windows and documents; SDPA's
priority) on the CPU: the very calls CUDA makes, through the kernel's CPU reference (tests/varlen_reference.py),
against dense masks in float64, values and gradients; their layouts on the meta device; and which path each
layer takes (ablate.models.attention.route)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import varlen_reference
from ablate.models import attention, varlen
from ablate.models.families import family_of
from ablate.models.loading import load_masked_lm
from ablate.train.attention_masks import attention_for
from cuda_paths import CudaKernels

LENGTH = 72  # tiny ModernBERT's local window is |q - k| <= 8
DOCS = np.array([[0] * 20 + [1] * 31 + [2] * 21, [7] * 45 + [8] * 27])
META = torch.device("meta")


@pytest.fixture(autouse=True, scope="module")
def _reference_kernel():
    varlen_reference.register()


def _dense(q, k, v, allowed, scale):
    """(B, H, L, D) attention under a (B, L, L) bool mask, as (B, L, H, D)."""
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], scale=scale)
    return out.transpose(1, 2)


def _allowed(doc_ids: np.ndarray, window: int | None, causal: bool) -> torch.Tensor:
    ids = torch.as_tensor(doc_ids)
    length = ids.shape[1]
    offset = torch.arange(length)[None, :] - torch.arange(length)[:, None]  # key - query
    allowed = ids[:, :, None] == ids[:, None, :]
    if window is not None:
        allowed = allowed & (offset.abs() <= window)
    if causal:
        allowed = allowed & (offset <= 0)
    return allowed


@pytest.mark.parametrize("window", [None, 5], ids=["global", "window"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("documents", [False, True], ids=["rows", "documents"])
def test_varlen_attends_what_a_dense_mask_per_document_allows_values_and_gradients(window, causal, documents):
    batch, heads, dim = 2, 3, 8
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, LENGTH, dim, dtype=torch.float64, generator=generator) for _ in "qkv")
    doc_ids = DOCS if documents else np.repeat(np.arange(batch)[:, None], LENGTH, axis=1)
    parts = (
        varlen.segments(varlen.offsets(attention.document_spans(DOCS), LENGTH), LENGTH, "cpu")
        if documents
        else varlen.row_segments(batch, LENGTH, "cpu")
    )
    weight = torch.randn(batch, LENGTH, heads, dim, dtype=torch.float64, generator=generator)
    results = []
    for compute in (
        lambda a, b, c: varlen.attend(a, b, c, parts, window, causal, 0.3),
        lambda a, b, c: _dense(a, b, c, _allowed(doc_ids, window, causal), 0.3),
    ):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = compute(*inputs)
        (out * weight).sum().backward()
        results.append((out.detach(), [t.grad for t in inputs]))
    (out, grads), (dense, dense_grads) = results
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-12)
    for grad, expected in zip(grads, dense_grads):
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


def test_segments_have_a_slot_per_token_and_carry_their_count_and_longest_on_the_host():
    spans = attention.document_spans(DOCS)  # 3 + 2 documents of 20, 31, 21, 45 and 27 tokens
    parts = varlen.segments(varlen.offsets(spans, LENGTH), LENGTH, "cpu")
    cu = parts.cu_seqlens.tolist()
    assert cu[:6] == [0, 20, 51, 72, 117, 144] and len(cu) == 2 * LENGTH + 1 and set(cu[6:]) == {144}
    assert parts.cu_seqlens.dtype == torch.int32 and (parts.count, parts.longest) == (5, 45)
    assert parts.sizes.device.type == "cpu"  # read inside the op without waiting for the GPU
    rows = varlen.row_segments(3, 10, "cpu")
    assert rows.cu_seqlens.tolist() == [0, 10, 20, 30] and (rows.count, rows.longest) == (3, 10)
    assert varlen.window_size(64, False) == (64, 64) and varlen.window_size(64, True) == (64, 0)
    assert varlen.window_size(None, True) == (-1, 0)


def test_the_kernel_is_launched_over_the_real_segments_bounded_by_the_longest_document(monkeypatch):
    """torch's op gets the offsets cut to the segment count (no empty segment launched) and the longest
    document as its max_seqlen (the grid sized to it, not to the row), in the forward and the backward."""
    seen = []
    forward, backward = torch.ops.torch_attn._varlen_attn, torch.ops.torch_attn._varlen_attn_backward

    def spy(op):
        def call(*args):
            at = 3 if op is forward else 6  # cu_seq_q, then max_q two places on
            seen.append((op, args[at].tolist(), args[at + 2]))
            return op(*args)

        return call

    monkeypatch.setattr(torch.ops.torch_attn, "_varlen_attn", spy(forward))
    monkeypatch.setattr(torch.ops.torch_attn, "_varlen_attn_backward", spy(backward))
    parts = varlen.segments(varlen.offsets(attention.document_spans(DOCS), LENGTH), LENGTH, "cpu")
    q = torch.randn(2, 3, LENGTH, 8, dtype=torch.float64, requires_grad=True)
    varlen.attend(q, q, q, parts, None, True, 0.3).sum().backward()
    assert [(op, cu, longest) for op, cu, longest in seen] == [
        (forward, [0, 20, 51, 72, 117, 144], 45),
        (backward, [0, 20, 51, 72, 117, 144], 45),
    ]


@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("documents", [False, True], ids=["", "docs"])
def test_a_model_on_cuda_s_kernels_computes_what_the_cpu_paths_compute(objective, documents):
    """tiny ModernBERT (global and local layers) through flash varlen (the CUDA choice) against the CPU's
    banded and per-document paths: outputs and every parameter's gradient, float64."""
    model = load_masked_lm("config:tiny-modernbert", "sdpa", seed=0).double().train()
    family = family_of(model.config)
    ids = torch.randint(1000, 2000, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    results = {}
    for kernels in ("cpu", "cuda"):
        model.zero_grad(set_to_none=True)
        with attention_for(
            model, family, objective, LENGTH, torch.float64, "cpu", DOCS if documents else None, kernels=kernels
        ) as attn:
            hidden = family.encoder(model)(input_ids=ids, attention_mask=attn).last_hidden_state
        (hidden * torch.linspace(-1, 1, hidden.numel(), dtype=hidden.dtype).view_as(hidden)).sum().backward()
        results[kernels] = hidden.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    (cpu, cpu_grads), (cuda, cuda_grads) = results["cpu"], results["cuda"]
    torch.testing.assert_close(cuda, cpu, rtol=0, atol=1e-12)
    assert cuda_grads.keys() == cpu_grads.keys()
    for name in cpu_grads:
        torch.testing.assert_close(cuda_grads[name], cpu_grads[name], rtol=0, atol=1e-11, msg=name)


def test_the_route_takes_flash_varlen_for_windows_and_documents_and_keeps_the_rest():
    def how(kernels="cuda", device="cuda", dtype=torch.bfloat16, local=False, documents=False, prefix=False,
            padding=False, dropout=False, block_mask=False):  # fmt: skip
        return attention.route(kernels, device, dtype, local, documents, prefix, padding, dropout, block_mask)

    assert how(local=True) == how(documents=True) == how(local=True, documents=True) == "varlen"
    assert how() == "full"  # global layers without documents: SDPA (cuDNN first, sdpa_priority)
    assert how(dtype=torch.float32, local=True) == "banded"  # flash computes in fp16/bf16 only
    assert how(dtype=torch.float32, documents=True) == "per_document"
    assert how(dtype=torch.float32, documents=True, block_mask=True) == "flex"
    assert how(prefix=True, block_mask=True) == "flex" and how(prefix=True, local=True) == "banded"
    assert how(dropout=True, documents=True) == "per_document"  # torch's varlen has no dropout
    assert how(padding=True, local=True) == "banded"
    assert how(kernels="cpu", device="cpu", local=True) == "banded"
    assert how(kernels="cpu", device="cpu", documents=True) == "per_document"
    assert how(device="meta", local=True) == "varlen"  # meta traces what CUDA runs
    assert how(device="cpu", dtype=torch.float32, local=True) == "varlen"  # a test's reference kernel
    assert attention.kernels_for("meta") == attention.kernels_for("cuda") == "cuda"
    assert attention.kernels_for("cpu") == "cpu"


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_on_meta_the_varlen_output_is_the_layout_transformers_reshapes_without_a_copy(objective):
    model = load_masked_lm("config:tiny-modernbert", "sdpa", seed=0).to(device=META, dtype=torch.bfloat16)
    family = family_of(model.config)
    layer = family.encoder(model).layers[1]  # a local layer
    seen = []
    layer.attn.register_forward_hook(lambda _m, _inputs, out: seen.append(out[0]))
    with CudaKernels() as mode, attention_for(model, family, objective, LENGTH, torch.bfloat16, META, DOCS):
        family.encoder(model)(input_ids=torch.zeros(2, LENGTH, dtype=torch.long, device=META))
    assert set(mode.kernels) == {"varlen"}  # documents: every layer, global and local
    assert seen[0].shape == (2, LENGTH, model.config.hidden_size) and seen[0].is_contiguous()


def test_on_meta_the_op_gives_the_layouts_of_the_flash_kernel_forward_and_backward():
    """ablate::varlen_attn on meta (its fake implementation, what the memory plan traces): the output in
    transformers' (B, L, H, D) layout and q's gradient as q, without reading the host sizes' values."""
    q = torch.empty(2, 4, LENGTH, 64, device=META, dtype=torch.bfloat16, requires_grad=True)
    out = varlen.attend(q, q, q, varlen.row_segments(2, LENGTH, META), 8, True, 0.125)
    out.sum().backward()
    assert out.shape == (2, LENGTH, 4, 64) and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert q.grad.shape == q.shape and q.grad.dtype == q.dtype


@pytest.mark.parametrize("kernels,objective", [("cpu", "clm"), ("cuda", "mlm"), ("cuda", "clm")])
def test_every_block_compiles_into_one_graph_without_a_break(kernels, objective):
    """dynamo's explain over each block kind of tiny ModernBERT (the first, a local, a global) as a step calls
    it, documents on: one graph, no break, on the CPU's paths and on CUDA's (flash varlen, here through the
    reference kernel)."""
    from ablate.train.compiled import blocks

    model = load_masked_lm("config:tiny-modernbert", "sdpa", seed=0).train()
    family = family_of(model.config)
    encoder = family.encoder(model)
    seen = {}
    for name, block in blocks(encoder, family):
        block.register_forward_pre_hook(
            lambda m, args, kwargs, name=name: seen.setdefault(name, (args, kwargs)), with_kwargs=True
        )
    ids = torch.randint(1000, 2000, (2, LENGTH), generator=torch.Generator().manual_seed(0))
    with attention_for(model, family, objective, LENGTH, torch.float32, "cpu", DOCS, kernels=kernels) as attn:
        encoder(input_ids=ids, attention_mask=attn)
        for name in ("layers.0", "layers.1", "layers.3"):
            args, kwargs = seen[name]
            explained = torch._dynamo.explain(encoder.get_submodule(name))(*args, **kwargs)
            assert explained.graph_count == 1 and explained.graph_break_count == 0, (name, explained.break_reasons)


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_a_bert_block_compiles_into_one_graph_without_a_break(objective):
    """The BERT family's block (the embedded default's) as a step calls it: one graph, no break (compiled
    numerics and freezing are tests/test_precision_compile.py's, on ModernBERT's block kinds)."""
    from ablate.train.compiled import blocks

    model = load_masked_lm("config:tiny-bert", "sdpa", seed=0).train()
    family = family_of(model.config)
    encoder = family.encoder(model)
    (name, block), *_ = blocks(encoder, family)
    seen = {}
    block.register_forward_pre_hook(
        lambda m, args, kwargs: seen.setdefault("in", (args, kwargs)), with_kwargs=True
    )
    ids = torch.randint(1000, 2000, (2, LENGTH), generator=torch.Generator().manual_seed(0))
    with attention_for(model, family, objective, LENGTH, torch.float32, "cpu") as attn:
        encoder(input_ids=ids, attention_mask=attn)
        args, kwargs = seen["in"]
        explained = torch._dynamo.explain(block)(*args, **kwargs)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, (name, explained.break_reasons)
