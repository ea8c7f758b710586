"""Dropout on the CPU from ablate.models.dropout: the rate and the expectation of torch's dropout, the same
masks from the same torch seed (what the loop's per-micro-batch seeding and resume rely on), gradients
through the kept elements only, and the attention path that uses it."""

import torch
from torch import nn

from ablate.models import attention
from ablate.models.dropout import CpuDropout, cpu_dropout, use_cpu_dropout


def test_rate_and_expectation_are_dropouts():
    torch.manual_seed(0)
    out = cpu_dropout(torch.ones(1_000_000), 0.1)
    dropped = (out == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.002
    assert abs(out.mean().item() - 1.0) < 0.005
    kept = torch.unique(out[out != 0])
    assert len(kept) == 1 and abs(kept.item() - 65536 / (65536 - round(0.1 * 65536))) < 1e-6


def test_the_same_torch_seed_gives_the_same_mask_and_a_call_moves_the_generator():
    x = torch.randn(4, 3, 17, 19)
    torch.manual_seed(5)
    first, second = cpu_dropout(x, 0.2), cpu_dropout(x, 0.2)
    torch.manual_seed(5)
    assert torch.equal(cpu_dropout(x, 0.2), first)
    assert not torch.equal(first, second)


def test_gradient_flows_through_kept_elements_only():
    x = torch.randn(64, 32, requires_grad=True)
    torch.manual_seed(1)
    out = cpu_dropout(x, 0.3)
    out.sum().backward()
    kept = out.detach() != 0
    assert torch.allclose(x.grad[kept], torch.full_like(x.grad[kept], 65536 / (65536 - round(0.3 * 65536))))
    assert torch.all(x.grad[~kept] == 0)


def test_no_dropout_and_all_dropped_are_exact():
    x = torch.randn(10, 10)
    assert cpu_dropout(x, 0.0) is x
    assert torch.all(cpu_dropout(x, 1.0) == 0)


def test_model_swap_keeps_eval_outputs_and_drops_in_training():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    x = torch.randn(16, 8)
    model.eval()
    before = model(x)
    use_cpu_dropout(model)
    assert type(model[1]) is CpuDropout
    assert torch.equal(model(x), before)
    model.train()
    torch.manual_seed(3)
    a = model(x)
    torch.manual_seed(3)
    assert torch.equal(model(x), a)


def test_causal_attention_with_dropout_is_softmax_dropped_then_values():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 12, 8, dtype=torch.float64) for _ in range(3))
    torch.manual_seed(7)
    out = attention.full(q, k, v, True, None, 0.1, 8 ** -0.5)
    scores = (q @ k.transpose(-2, -1)) * 8 ** -0.5
    scores = scores.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf"))
    torch.manual_seed(7)
    expected = cpu_dropout(scores.softmax(-1), 0.1) @ v
    assert torch.allclose(out, expected, atol=1e-12)
    # with no dropout the fused path runs, and the math path agrees with it
    fused = attention.full(q, k, v, True, None, 0.0, 8 ** -0.5)
    assert torch.allclose(fused, scores.softmax(-1) @ v, atol=1e-10)
