"""The fused, chunked vocabulary projection + cross-entropy (ablate.train.vocab_loss): the same loss and
gradients as the dense head (w.r.t. the features, the decoder weight and bias, and through the family's head
transform the parameters upstream: tied embeddings, encoder), with ignored positions, under gradient
accumulation and under two-rank data parallelism, never holding more than one chunk of logits.

Tolerances: float64 to 1e-10 relative (the same arithmetic up to summation order); float32 within 1e-6 of
float64 in norm-relative error, as the dense float32 path; bf16 (as tensors, and under CPU autocast) within
1e-2 of float64 for gradients and 1e-4 for the loss, and never more than 1.25x the dense bf16 path's error.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import AutoModelForMaskedLM

from ablate.config.spec import parse_run_spec
from ablate.models.families import FAMILIES
from ablate.models.loading import load_config, load_masked_lm
from ablate.train.loop import pretrain
from ablate.train import cpu, vocab_loss
from ablate.train.vocab_loss import IGNORE_INDEX, dense_cross_entropy, fused_cross_entropy
from tests.test_ddp import _assert_same_weights, _ranks, _weights, ddp_spec

CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))


def _problem(n=50, width=12, vocab=97, dtype=torch.float64, ignored=0.3, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, width, generator=g, dtype=torch.float64)
    w = torch.randn(vocab, width, generator=g, dtype=torch.float64) * 0.5
    b = torch.randn(vocab, generator=g, dtype=torch.float64) * 0.5
    y = torch.randint(vocab, (n,), generator=g)
    y[torch.rand(n, generator=g) < ignored] = IGNORE_INDEX
    return [t.to(device, dtype).requires_grad_() for t in (x, w, b)] + [y.to(device)]


@pytest.fixture(params=["position-major", "vocabulary-major"])
def layout(request, monkeypatch):
    """Every chunk's logits stored one way or the other (the engine picks by chunk size on CPU)."""
    monkeypatch.setattr(cpu, "VOCAB_MAJOR_FROM", 10**9 if request.param == "position-major" else 1)
    return request.param


def _loss_and_grads(loss_fn, x, w, b, y, autocast=False, **kw):
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(x, w, b, y, **kw)
    loss.backward()
    return [loss.detach()] + [None if t is None else t.grad.clone() for t in (x, w, b)]


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double().cpu(), ref.double().cpu()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("chunk", [1, 7, 50, 1024])
@pytest.mark.parametrize("with_bias", [True, False])
def test_float64_loss_and_gradients_equal_the_dense_head(chunk, with_bias, layout):
    x, w, b, y = _problem()
    b = b if with_bias else None
    fused = _loss_and_grads(fused_cross_entropy, x, w, b, y, chunk=chunk)
    dense = _loss_and_grads(dense_cross_entropy, x, w, b, y)
    assert fused[0].dtype == torch.float64
    for got, want in zip(fused, dense):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    ignored = y == IGNORE_INDEX
    assert ignored.any() and fused[1][ignored].abs().max() == 0  # no gradient from an ignored position


def test_float32_is_as_close_to_float64_as_the_dense_float32_head(layout):
    x, w, b, y = _problem(n=600, width=64, vocab=3000, ignored=0.2)
    truth = _loss_and_grads(dense_cross_entropy, x, w, b, y)
    x32, w32, b32 = (t.detach().float().requires_grad_() for t in (x, w, b))
    fused = _loss_and_grads(fused_cross_entropy, x32, w32, b32, y, chunk=256)
    dense = _loss_and_grads(dense_cross_entropy, x32, w32, b32, y)
    for got, ref, want in zip(fused, dense, truth):
        assert got.dtype == torch.float32
        assert _rel(got, want) < 1e-6 and _rel(ref, want) < 1e-6


@pytest.mark.parametrize("how", ["bf16 tensors", "cpu autocast"])
def test_bf16_is_as_close_to_float64_as_the_dense_bf16_head(how, layout):
    x, w, b, y = _problem(n=600, width=64, vocab=3000, ignored=0.2)
    truth = _loss_and_grads(dense_cross_entropy, x, w, b, y)
    autocast = how == "cpu autocast"
    dtype = torch.float32 if autocast else torch.bfloat16
    low = [t.detach().to(dtype).requires_grad_() for t in (x, w, b)]
    fused = _loss_and_grads(fused_cross_entropy, *low, y, autocast=autocast, chunk=256)
    dense = _loss_and_grads(dense_cross_entropy, *low, y, autocast=autocast)
    for i, (got, ref, want) in enumerate(zip(fused, dense, truth)):
        assert i == 0 or got.dtype == dtype  # each gradient in its input's dtype
        err = _rel(got, want)
        assert err < (1e-4 if i == 0 else 1e-2)
        assert err <= 1.25 * _rel(ref, want) + 1e-6


def test_positions_all_ignored_or_none_give_zero_loss_and_zero_gradients_like_the_dense_head(layout):
    x, w, b, y = _problem(n=20)
    for labels, rows in ((torch.full_like(y, IGNORE_INDEX), 20), (y[:0], 0)):
        xs = x[:rows].detach().requires_grad_()
        fused = _loss_and_grads(fused_cross_entropy, xs, w, b, labels)
        dense = _loss_and_grads(dense_cross_entropy, xs, w, b, labels)
        for got, want in zip(fused, dense):
            assert torch.equal(got, want) and not got.any()


def test_without_grad_only_the_loss_is_computed(layout):
    x, w, b, y = _problem()
    with torch.no_grad():
        loss = fused_cross_entropy(x, w, b, y, chunk=16)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, dense_cross_entropy(x, w, b, y).detach(), rtol=1e-10, atol=0)


class _LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an op produced while active (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.largest = max([self.largest] + [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
        return out


def test_no_more_than_one_chunk_of_logits_exists_forward_or_backward(layout):
    n, vocab, chunk = 3000, 5000, 512
    x, w, b, y = _problem(n=n, width=8, vocab=vocab, dtype=torch.float32)
    with _LargestTensor() as fused:
        fused_cross_entropy(x, w, b, y, chunk=chunk).backward()
    with _LargestTensor() as dense:
        dense_cross_entropy(x, w, b, y).backward()
    assert fused.largest <= chunk * vocab
    assert dense.largest >= n * vocab  # the probe sees the full logits where they exist


# ------------------------------------------------------------------------------- on the families' heads


def _model(arch: str, impl: str = "sdpa", **config) -> torch.nn.Module:
    model = load_masked_lm(f"config:{arch}", impl, seed=0).double().eval()  # eval: no dropout
    for key, value in config.items():
        setattr(model.config, key, value)
    return model


def _labels(shape, vocab: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(1000, vocab, shape, generator=g)
    y[torch.rand(shape, generator=g) < 0.6] = IGNORE_INDEX
    return y


def _param_grads(model, loss_of) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = loss_of()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["tiny-bert", "tiny-modernbert"])
def test_model_gradients_equal_the_model_s_own_logits_in_float64_also_accumulated(arch):
    """Every parameter's gradient (head transform, decoder weight tied to the embeddings, decoder bias,
    encoder) from the fused loss at labelled positions, whole and in two accumulated micro-batches, equals
    the gradient of cross-entropy over the model's own full logits."""
    model = _model(arch)
    family = FAMILIES[arch.removeprefix("tiny-")]
    ids = torch.randint(1000, 2000, (4, 24), generator=torch.Generator().manual_seed(0))
    y = _labels(ids.shape, model.config.vocab_size)
    n_labels = int((y != IGNORE_INDEX).sum())

    def own_logits():
        return (
            F.cross_entropy(
                model(input_ids=ids).logits.reshape(-1, model.config.vocab_size), y.reshape(-1), reduction="sum"
            )
            / n_labels
        )

    def fused(rows=slice(None)):
        hidden = family.encoder(model)(input_ids=ids[rows]).last_hidden_state
        where = y[rows] != IGNORE_INDEX
        features = family.transform(model, hidden[where])
        return fused_cross_entropy(features, *family.decoder(model), y[rows][where], chunk=16) / n_labels

    def accumulated():
        first = fused(slice(0, 2))
        first.backward()
        return first.detach() + fused(slice(2, 4))

    want_loss, want = _param_grads(model, own_logits)
    weight, bias = family.decoder(model)
    assert weight is model.get_input_embeddings().weight and bias is not None  # tied, with a bias
    for loss_of in (fused, accumulated):
        loss, got = _param_grads(model, loss_of)
        torch.testing.assert_close(loss, want_loss, rtol=1e-10, atol=0)
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12, msg=lambda m: f"{name}: {m}")
    head = [n for n in want if n.startswith(("cls.", "head."))]
    assert head and all(want[n].abs().sum() > 0 for n in head)  # the transform's parameters are covered


@pytest.mark.parametrize("name, config", [(name, {}) for name in FAMILIES] + [("deberta-v2", {"legacy": False})])
def test_every_family_s_head_split_gives_the_model_s_own_logits_and_the_fused_loss_its_gradients(name, config):
    """The registry's transform + decoder reproduce each *ForMaskedLM's own head, so the fused loss (and the
    dense fallback) train what the model's forward would."""
    family = FAMILIES[name]
    config_ = load_config(f"config:{family.tiny_config}")
    config_.update(config)  # legacy False: DeBERTa-v3's head, projecting on the word embeddings
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(config_, attn_implementation=family.attn_implementations[0])
    model = model.double().eval()
    ids = torch.randint(1000, 2000, (2, 16), generator=torch.Generator().manual_seed(0))
    hidden = family.encoder(model)(input_ids=ids).last_hidden_state
    torch.testing.assert_close(
        family.head_logits(model, hidden), model(input_ids=ids).logits, rtol=1e-12, atol=1e-12
    )

    y = _labels(ids.shape, model.config.vocab_size).reshape(-1)

    def fused():
        features = family.transform(model, family.encoder(model)(input_ids=ids).last_hidden_state)
        return fused_cross_entropy(features.reshape(y.numel(), -1), *family.decoder(model), y, chunk=8)

    want_loss, want = _param_grads(
        model, lambda: F.cross_entropy(model(input_ids=ids).logits.reshape(y.numel(), -1), y, reduction="sum")
    )
    loss, got = _param_grads(model, fused)
    torch.testing.assert_close(loss, want_loss, rtol=1e-10, atol=0)
    assert got.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-9, atol=1e-12, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_fused_matches_dense_under_bf16_autocast_on_each_device(device):
    x, w, b, y = _problem(n=2500, width=64, vocab=3000, dtype=torch.float32, device=device)
    fused = _loss_and_grads(fused_cross_entropy, x, w, b, y, autocast=True, chunk=1024)
    dense = _loss_and_grads(dense_cross_entropy, x, w, b, y, autocast=True)
    for got, ref in zip(fused, dense):
        assert got.device.type == device and got.dtype == ref.dtype
        assert _rel(got, ref) < 1e-2


# ------------------------------------------------------------------------------- in the engine


def _quiet(_m: str) -> None:
    pass


@pytest.mark.slow
def test_the_spec_switch_runs_the_dense_head_with_the_same_run_id_and_numbers(tmp_path, data_root, monkeypatch):
    spec = ddp_spec(model="config:tiny-bert", micro_batch_size=2)  # dropout, two micro-batches a step
    fused, dense = parse_run_spec(spec), parse_run_spec({**spec, "vocab_loss": "dense"})
    assert fused.vocab_loss == "fused" and dense.vocab_loss == "dense" and fused.run_id == dense.run_id
    calls = {"fused": 0, "dense": 0}
    for kind, loss_fn in list(vocab_loss.LOSSES.items()):

        def counted(*args, _kind=kind, _fn=loss_fn, **kw):
            calls[_kind] += 1
            return _fn(*args, **kw)

        monkeypatch.setitem(vocab_loss.LOSSES, kind, counted)
    a = pretrain(fused, tmp_path / "fused", log=_quiet)
    assert calls == {"fused": 8, "dense": 0}  # 4 steps x 2 micro-batches
    b = pretrain(dense, tmp_path / "dense", log=_quiet)
    assert calls == {"fused": 8, "dense": 8}
    assert [c["loss"] for c in a.curves] == pytest.approx([c["loss"] for c in b.curves], rel=1e-5)
    _assert_same_weights(_weights(tmp_path / "fused"), _weights(tmp_path / "dense"))


@pytest.mark.slow
def test_two_gloo_ranks_with_the_fused_loss_match_one_process_with_the_dense_head(tmp_path, data_root):
    """Two ranks, two accumulated micro-batches each, CLM then MLM, dropout on: the fused default against the
    dense head in one process."""
    spec = ddp_spec(model="config:tiny-bert", micro_batch_size=1)
    single = pretrain(parse_run_spec({**spec, "vocab_loss": "dense"}), tmp_path / "single", log=_quiet)
    ranks = _ranks(spec, tmp_path / "ddp")
    assert ranks[0]["done"] and ranks[0]["losses"] == pytest.approx([c["loss"] for c in single.curves], rel=1e-5)
    _assert_same_weights(_weights(tmp_path / "ddp"), _weights(tmp_path / "single"))
