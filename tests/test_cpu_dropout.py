"""CPU dropout from the SFC64 stream (ablate.train.cpu): the Bernoulli(1 - p) masks scaled by 1 / (1 - p) that
torch applies, the same masks for the same seed, attention with dropout equal to torch's math path under the
same mask (values and gradients), and a training step on the CPU that draws no Mersenne-Twister dropout."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from ablate.config.spec import parse_run_spec
from ablate.train.cpu import CpuDropout, cpu_dropout
from ablate.train.loop import Optimizer, setup, train_step

from builders import detour_spec


def test_masks_keep_one_minus_p_and_scale_by_its_inverse():
    x = torch.ones(1_000_000)
    with CpuDropout(3):
        out = F.dropout(x, 0.1)
    kept = out != 0
    assert out.unique().tolist() == [0.0, pytest.approx(1 / 0.9)]
    assert kept.float().mean().item() == pytest.approx(0.9, abs=0.002)  # 1e6 draws: sd 0.0003


def test_the_same_seed_draws_the_same_masks_another_seed_others():
    x = torch.ones(4096)

    def draws(seed):
        with CpuDropout(seed):
            return F.dropout(x, 0.1), F.dropout(x, 0.1)

    first, second = draws(5)
    again = draws(5)
    assert torch.equal(first, again[0]) and torch.equal(second, again[1])
    assert not torch.equal(first, second)  # one stream: each call draws on
    assert not torch.equal(first, draws(6)[0])


def test_gradient_is_the_mask_and_eval_or_p_zero_is_the_identity():
    x = torch.randn(64, 32, requires_grad=True)
    with CpuDropout(0):
        out = F.dropout(x, 0.25)
        same = F.dropout(x, 0.25, training=False)
        zero = F.dropout(x, 0.0)
    out.sum().backward()
    assert torch.equal(x.grad, torch.where(out != 0, torch.tensor(1 / 0.75), torch.tensor(0.0)))
    assert same is x and torch.equal(zero, x)


def test_nn_dropout_in_place_and_p_one():
    with CpuDropout(0):
        x = torch.ones(1000)
        y = torch.nn.Dropout(0.5, inplace=True)(x)
        assert y is x and set(x.unique().tolist()) == {0.0, 2.0}
        assert torch.equal(F.dropout(torch.ones(10), 1.0), torch.zeros(10))


def _reference(q, k, v, mask, p, causal, keep, enable_gqa=False):
    """torch's own math path, given the same keep mask (the op itself adds its mask: SDPA's front end turns a
    boolean mask into -inf first)."""
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(mask.logical_not(), -math.inf)
    if enable_gqa:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    with warnings.catch_warnings():  # torch warns (once) that a given dropout mask is for tests
        warnings.simplefilter("ignore")
        return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, mask, p, causal, dropout_mask=keep)[0]


@pytest.mark.parametrize("case", ["causal", "bidirectional", "bool mask with a hidden row", "float mask", "gqa"])
def test_attention_with_dropout_is_torchs_math_path_under_the_same_mask(case):
    torch.manual_seed(0)
    b, h, length, d, p = 2, 4, 12, 8, 0.2
    q, k, v = (torch.randn(b, h, length, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    if case == "gqa":
        k, v = (torch.randn(b, 2, length, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    mask = None
    if case == "bool mask with a hidden row":
        mask = torch.rand(b, 1, length, length) > 0.3
        mask[0, 0, 3] = False  # a query that sees nothing attends to nothing
    elif case == "float mask":
        mask = torch.randn(b, 1, length, length, dtype=torch.float64)
    causal = case == "causal"
    with CpuDropout(11):
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, enable_gqa=case == "gqa"
        )
    keep = CpuDropout(11).keep(torch.Size((b, h, length, length)), p, torch.float64).bool()
    ref = _reference(q, k, v, mask, p, causal, keep, enable_gqa=case == "gqa")
    assert 0.7 < keep.float().mean() < 0.9
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    if case == "bool mask with a hidden row":
        assert torch.equal(out[0, :, 3], torch.zeros_like(out[0, :, 3]))


def test_attention_without_dropout_is_torchs_own_call():
    q = k = v = torch.randn(1, 2, 8, 4)
    with CpuDropout(0):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_on_a_gpu_device_only_torch_is_seeded():
    assert not isinstance(cpu_dropout(4, "cuda"), CpuDropout)
    assert torch.initial_seed() == 4
    assert isinstance(cpu_dropout(4, "cpu"), CpuDropout)
    assert not isinstance(cpu_dropout(4, "cpu", compiled=True), CpuDropout)


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_cpu_training_step_with_dropout_draws_no_mersenne_twister_and_repeats(attn, tmp_path, data_root):
    spec = parse_run_spec(detour_spec(attn_implementation=attn, device="cpu"))
    ctx, _tokenizer, plans = setup(spec)
    assert ctx.model.config.attention_probs_dropout_prob > 0 and ctx.model.config.hidden_dropout_prob > 0
    batch, docs = ctx.sequences[:4], ctx.doc_ids[:4]
    start = {k: t.clone() for k, t in ctx.model.state_dict().items()}

    def step():
        ctx.model.load_state_dict(start)
        ctx.model.train()
        opt = Optimizer(ctx.model, spec, fused=False)
        opt.set_trainable()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            loss = float(train_step(ctx, plans[0], batch, docs, 0, opt, 1e-4)[0])
        return loss, {e.key for e in prof.key_averages()}

    loss, ops = step()
    assert math.isfinite(loss)
    assert "aten::bernoulli_" not in ops and "aten::mul" in ops
    assert step()[0] == loss
