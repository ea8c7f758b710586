"""The objectives: CLM is causal on every allowed attention implementation, MLM is bidirectional,
labels are shifted and cut at document boundaries, masking follows its rules."""

from __future__ import annotations

import pytest
import torch

from ablate.models.families import family_of

from ablate.models.loading import load_masked_lm
from ablate.train.attention_masks import IGNORE, attention_for, clm_labels, mlm_inputs


def _logits(model, ids, objective):
    fam = family_of(model.config)
    with attention_for(model, fam, objective, ids.shape[1], torch.float32) as mask:
        hidden = fam.encoder(model)(input_ids=ids, attention_mask=mask).last_hidden_state
    return fam.head_logits(model, hidden)


def test_the_causal_flag_is_restored_after_a_clm_forward():
    model = load_masked_lm("config:tiny-bert", "sdpa", seed=0).eval()
    ids = torch.randint(1000, 2000, (1, 16))
    before = _logits(model, ids, "mlm")
    _logits(model, ids, "clm")
    assert torch.equal(_logits(model, ids, "mlm"), before)  # bidirectional again


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["tiny-bert", "tiny-modernbert"])
def test_clm_is_causal_and_mlm_is_bidirectional(arch, impl):
    model = load_masked_lm(f"config:{arch}", impl, seed=0).eval()
    g = torch.Generator().manual_seed(0)
    seq_len, pos = 48, 40  # longer than tiny-modernbert's local window (8), so local layers matter
    ids = torch.randint(1000, 2000, (2, seq_len), generator=g)
    changed = ids.clone()
    changed[:, pos] = 2500
    with torch.no_grad():
        clm_a, clm_b = _logits(model, ids, "clm"), _logits(model, changed, "clm")
        mlm_a, mlm_b = _logits(model, ids, "mlm"), _logits(model, changed, "mlm")
    assert (clm_a[:, :pos] - clm_b[:, :pos]).abs().max().item() == 0.0
    assert (clm_a[:, pos:] - clm_b[:, pos:]).abs().max().item() > 1e-4
    assert (mlm_a[:, :pos] - mlm_b[:, :pos]).abs().max().item() > 1e-4


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_modernbert_local_layers_stay_windowed_under_clm(impl):
    """With only local layers, a token more than the window back cannot be seen, even causally."""
    model = load_masked_lm("config:tiny-modernbert", impl, seed=0).eval()
    model.config.layer_types = ["sliding_attention"] * 4
    for layer in model.model.layers:
        layer.attention_type = "sliding_attention"
        layer.attn.sliding_window = model.config.sliding_window + 1  # what __init__ gives a local layer
    window = model.config.sliding_window
    ids = torch.randint(1000, 2000, (1, 40), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[:, 0] = 2500
    with torch.no_grad():
        a, b = _logits(model, ids, "clm"), _logits(model, changed, "clm")
    # one layer reaches `window` back; 4 layers reach 4 * window back
    reach = 4 * window
    assert (a[:, reach + 1 :] - b[:, reach + 1 :]).abs().max().item() == 0.0
    assert (a[:, 1:reach] - b[:, 1:reach]).abs().max().item() > 0


def test_clm_labels_shift_and_stop_at_document_boundaries():
    ids = torch.tensor([[101, 5, 6, 102, 101, 7, 102, 101]])
    docs = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2]])
    labels = clm_labels(ids, docs)
    assert labels.tolist() == [[5, 6, 102, IGNORE, 7, 102, IGNORE, IGNORE]]


def test_mlm_masks_at_rate_with_80_10_10_and_never_special_tokens():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 2000, (64, 128), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    special = torch.tensor([0, 101, 102, 103])
    inputs, labels = mlm_inputs(ids, 0.3, special, mask_id=103, vocab_size=30522, generator=g)
    masked = labels != IGNORE
    assert not masked[:, 0].any() and not masked[:, -1].any()
    rate = masked[:, 1:-1].float().mean().item()
    assert abs(rate - 0.3) < 0.01
    assert torch.equal(labels[masked], ids[masked])
    as_mask = (inputs[masked] == 103).float().mean().item()
    kept = (inputs[masked] == ids[masked]).float().mean().item()
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.02
    assert torch.equal(inputs[~masked], ids[~masked])
