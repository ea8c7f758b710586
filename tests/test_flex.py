"""The FlexAttention path (CUDA only in a run) proven on the CPU: its block masks allow exactly the pairs the
dense masks allow, FlexAttention's forward under them equals SDPA under the dense masks, and a model run
through it computes what the SDPA paths compute. (torch 2.13's FlexAttention has no backward on the CPU and
refuses the meta device: forward only here.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_mask, flex_attention

from ablate.models import flex
from ablate.models.families import family_of
from ablate.models.loading import load_masked_lm
from ablate.train.attention_masks import attention_for, dense_mask

LENGTH = 300  # three 128-tiles, the last one partial


def _doc_ids(batch: int, length: int) -> torch.Tensor:
    rng = np.random.default_rng(0)
    rows = [np.repeat(np.arange(40), rng.integers(1, 60, 40))[:length] + 100 * b for b in range(batch)]
    return torch.as_tensor(np.stack(rows))


@pytest.mark.parametrize("documents", [False, True], ids=["", "docs"])
@pytest.mark.parametrize("window", [None, 8, 130], ids=["global", "w8", "w130"])
@pytest.mark.parametrize("causal", [False, True], ids=["mlm", "clm"])
def test_block_masks_allow_what_the_dense_masks_allow_and_attend_alike(causal, window, documents):
    docs = _doc_ids(2, LENGTH) if documents else None
    mask = flex.block_mask(2, LENGTH, causal, window, docs, "cpu")
    dense = dense_mask(LENGTH, torch.bool, "cpu", causal, window, docs)  # (1|B, 1, L, L)
    pairs = create_mask(flex.allowed_pairs(causal, window, docs), dense.shape[0], 1, LENGTH, LENGTH, "cpu")
    assert torch.equal(pairs, dense)
    q, k, v = (
        torch.randn(2, 3, LENGTH, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
        for i in range(3)
    )
    with torch.no_grad():
        got = flex_attention(q, k, v, block_mask=mask)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True], ids=["mlm", "clm"])
def test_a_mask_s_computed_pairs_are_its_non_empty_tiles(causal):
    length, window = 1024, 64
    mask = flex.block_mask(1, length, causal, window, None, "cpu")
    tiles = length // flex.TILE
    expected = tiles + (tiles - 1) * (1 if causal else 2)  # the diagonal and its neighbours
    assert flex.computed_pairs(mask, heads=2) == expected * flex.TILE**2 * 2
    documents = flex.block_mask(1, length, causal, None, torch.arange(length)[None] // 256, "cpu")
    assert flex.computed_pairs(documents) == 4 * (256 * 256 if not causal else 3 * 128 * 128)


@pytest.mark.parametrize("objective", ["mlm", "clm"])
@pytest.mark.parametrize("arch", ["tiny-modernbert", "tiny-bert"])
def test_a_model_through_flex_attention_computes_what_the_sdpa_paths_compute(arch, objective, monkeypatch):
    """Global layers with documents under FlexAttention (what CUDA runs) against one SDPA call per document."""
    model = load_masked_lm(f"config:{arch}", "sdpa", seed=0).double().eval()
    family = family_of(model.config)
    ids = torch.randint(1000, 2000, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    docs = _doc_ids(2, LENGTH).numpy()
    outputs, calls = [], []
    real = flex.attend
    monkeypatch.setattr(flex, "attend", lambda *args: calls.append(1) or real(*args))
    for use_flex in (False, True):
        with (
            torch.no_grad(),
            attention_for(model, family, objective, LENGTH, torch.float64, "cpu", docs, use_flex=use_flex) as attn,
        ):
            outputs.append(family.encoder(model)(input_ids=ids, attention_mask=attn).last_hidden_state)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-9, atol=1e-9)
    global_layers = sum(
        t == "full_attention"
        for t in getattr(model.config, "layer_types", None) or ["full_attention"] * model.config.num_hidden_layers
    )
    assert len(calls) == global_layers


@pytest.mark.slow
def test_a_compiled_encoder_takes_each_micro_batch_s_block_mask_without_recompiling():
    """What CUDA runs under `compile: auto` with documents in float32 (or a prefix): the encoder's blocks
    compiled one by one as a run compiles them (ablate.train.compiled), the block mask and doc ids new every
    micro-batch, the graphs not (forward: FlexAttention has no backward on the CPU). Dynamo's graphs and guards
    are the point, so its graphs run through aot_eager: inductor's CPU code for flex (C++, minutes of g++ on a
    cold cache) is not the Triton a GPU runs."""
    from torch._dynamo.backends.registry import lookup_backend

    from ablate.train.compiled import CompiledEncoder

    torch._dynamo.reset()  # earlier tests compile the same block code: count from an empty cache
    model = load_masked_lm("config:tiny-modernbert", "sdpa", seed=0)
    family = family_of(model.config)
    lines: list[str] = []
    encoder = CompiledEncoder(family.encoder(model), family, lines.append, compiler=lookup_backend("aot_eager"))
    graphs = []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        docs = np.stack([np.repeat(np.arange(50), rng.integers(5, 40, 50))[:256] for _ in range(2)])
        ids = torch.randint(1000, 2000, (2, 256), generator=torch.Generator().manual_seed(seed))
        with (
            torch.no_grad(),
            attention_for(model, family, "mlm", 256, torch.float32, "cpu", docs, use_flex=True) as attn,
        ):
            encoder(input_ids=ids, attention_mask=attn)
        graphs.append(encoder.graphs)
    # One recompile per block kind may follow the first call: the `kernels` package (transformers' hub
    # kernels) sets a context variable during it that the first graphs guarded as unset. After that, a new
    # mask is never a new graph.
    assert graphs[0] == 3, lines  # the first block, the local ones, the global one
    assert graphs[1] <= 2 * 3 and graphs[2] == graphs[1], (graphs, lines)
    assert not encoder.fallbacks


@pytest.mark.slow
def test_the_compiled_mask_builder_cuda_uses_gives_the_eager_masks_in_one_graph():
    """Dynamo's trace of the builder, run through aot_eager (inductor's CPU code is not the Triton a GPU
    runs, and costs a cold cache about 10 s of g++)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    for seed in range(2):
        docs = torch.as_tensor(
            np.stack(
                [
                    np.repeat(np.arange(60), np.random.default_rng(seed + b).integers(1, 30, 60))[:LENGTH]
                    for b in range(2)
                ]
            )
        )
        eager = flex.block_mask(2, LENGTH, True, None, docs, "cpu", compiled=False)
        built = flex.block_mask(2, LENGTH, True, None, docs, "cpu", compiled="aot_eager")
        assert torch.equal(built.to_dense(), eager.to_dense())
        assert torch.equal(built.kv_num_blocks, eager.kv_num_blocks)  # partial tiles
        assert torch.equal(built.full_kv_num_blocks, eager.full_kv_num_blocks)  # full tiles
    assert counters["stats"]["unique_graphs"] == 1
