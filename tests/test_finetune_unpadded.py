"""Fine-tuning without padding waste (ablate.train.attention_masks.padded_attention): on CUDA's kernels a padded
batch's attention runs over each row's tokens alone (flash variable length, the padding a segment of its own),
with the logits at the rows' tokens and every gradient what the padded path (transformers' SDPA with the
padding mask) gives, float64, on the CPU through the kernel's reference (tests/varlen_reference.py); on the
CPU's own kernels nothing changes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

import varlen_reference
from ablate.models import attention
from ablate.models.loading import load_config
from ablate.train.attention_masks import padded_attention

LENGTHS = [40, 17, 33]  # tiny ModernBERT's window is |q - k| <= 8: local layers matter at these lengths


@pytest.fixture(autouse=True, scope="module")
def _reference_kernel():
    varlen_reference.register()


def _batch(lengths, seed: int = 0):
    longest = max(lengths)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 2000, (len(lengths), longest), generator=generator)
    mask = torch.tensor([[1] * n + [0] * (longest - n) for n in lengths])
    return ids.masked_fill(mask == 0, 0), mask


def _model(arch: str, kind):
    config = load_config(f"config:{arch}")
    config.num_labels = 3
    torch.manual_seed(0)
    return kind.from_config(config, attn_implementation="sdpa").double().eval()


def _run(model, ids, mask, kernels: str | None):
    """(logits, every parameter's gradient) of a fixed function of the logits at the rows' tokens."""
    model.zero_grad(set_to_none=True)
    with padded_attention(model, mask.sum(1).tolist(), mask.shape[1], "cpu", kernels=kernels):
        logits = model(input_ids=ids, attention_mask=mask).logits
    kept = logits if logits.dim() == 2 else logits[mask.bool()]  # token tasks: the rows' tokens only
    (kept * torch.linspace(-1, 1, kept.numel(), dtype=kept.dtype).view_as(kept)).sum().backward()
    return kept.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ["tiny-modernbert", "tiny-bert"])
@pytest.mark.parametrize("kind", [AutoModelForSequenceClassification, AutoModelForTokenClassification])
def test_the_unpadded_path_gives_the_padded_path_s_logits_and_gradients(arch, kind):
    model = _model(arch, kind)
    ids, mask = _batch(LENGTHS)
    calls = []
    real = attention.varlen.attend
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention.varlen, "attend", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
        unpadded, unpadded_grads = _run(model, ids, mask, kernels="cuda")
    padded, padded_grads = _run(model, ids, mask, kernels=None)
    assert calls, "the unpadded path did not run flash varlen"
    # each row's tokens, then its padding, as segments: [0, 40) | [40, 57) [57, 80) | [80, 113) [113, 120)
    assert calls[0].cu_seqlens.tolist()[:6] == [0, 40, 57, 80, 113, 120]
    torch.testing.assert_close(unpadded, padded, rtol=0, atol=1e-11)
    assert unpadded_grads.keys() == padded_grads.keys()
    for name, grad in padded_grads.items():
        torch.testing.assert_close(unpadded_grads[name], grad, rtol=0, atol=1e-10, msg=name)


def test_on_the_cpu_s_kernels_nothing_changes():
    model = _model("tiny-modernbert", AutoModelForSequenceClassification)
    implementation = model.config._attn_implementation
    with padded_attention(model, LENGTHS, max(LENGTHS), "cpu"):
        assert model.config._attn_implementation == implementation
        assert not any(hasattr(m, attention.INPUTS_ATTR) for m in model.modules())
    with padded_attention(model, LENGTHS, max(LENGTHS), "cpu", kernels="cuda"):
        assert model.config._attn_implementation == attention.IMPLEMENTATION
    assert model.config._attn_implementation == implementation  # restored
    assert not any(hasattr(m, attention.INPUTS_ATTR) for m in model.modules())
