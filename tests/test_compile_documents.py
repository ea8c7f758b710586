"""A compiled encoder over micro-batches of any document mix (ablate.models.varlen, ablate.train.compiled): on
CUDA's kernels (flash varlen, here through the reference kernel registered as its CPU implementation), each
block kind traces its graphs once per attention pattern, whatever the count and lengths of the documents of
the rows, and computes what the eager encoder computes. Dynamo's graphs and guards are the point, so the
graphs run through aot_eager (inductor's CPU code is not the Triton a GPU runs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend

import varlen_reference
from ablate.models.families import family_of
from ablate.models.loading import load_masked_lm
from ablate.train.attention_masks import attention_for
from ablate.train.compiled import CompiledEncoder, block_kinds

ROWS, LENGTH = 2, 128
MICRO_BATCHES = 4  # per pattern
PATTERNS = ("clm",)  # the detour's long phase (another pattern is another graph per block kind, as a phase is)


def _document_ids(rng: np.random.Generator) -> np.ndarray:
    """(ROWS, LENGTH) doc ids: each row 1 to LENGTH / 16 documents of random lengths (cuts anywhere)."""
    rows = []
    for _ in range(ROWS):
        count = int(rng.integers(1, LENGTH // 16 + 1))
        cuts = np.sort(rng.choice(np.arange(1, LENGTH), count - 1, replace=False))
        rows.append(np.repeat(np.arange(count), np.diff([0, *cuts, LENGTH])))
    return np.stack(rows)


def _step(encoder, model, family, pattern, ids, docs) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, the first block's attention weight gradient) of one forward and backward on CUDA's kernels."""
    model.zero_grad(set_to_none=True)
    with attention_for(model, family, pattern, LENGTH, torch.float32, "cpu", docs, kernels="cuda") as attn:
        hidden = encoder(input_ids=ids, attention_mask=attn).last_hidden_state
    loss = (hidden * torch.linspace(-1, 1, hidden.numel()).view_as(hidden)).sum()
    loss.backward()
    return loss.detach(), family.encoder(model).layers[0].attn.Wqkv.weight.grad.clone()


@pytest.mark.slow
def test_documents_of_any_count_and_length_compile_each_block_kind_once_per_pattern():
    varlen_reference.register()
    torch._dynamo.reset()  # earlier tests compile the same block code: count from an empty cache
    model = load_masked_lm("config:tiny-modernbert", "sdpa", seed=0).train()
    family = family_of(model.config)
    lines: list[str] = []
    compiled = CompiledEncoder(family.encoder(model), family, lines.append, compiler=lookup_backend("aot_eager"))
    kinds = block_kinds(family.encoder(model), family)
    rng = np.random.default_rng(0)
    counts, graphs = set(), []
    for pattern in PATTERNS:
        for step in range(MICRO_BATCHES):
            docs = _document_ids(rng)
            counts.add(sum(len(set(row)) for row in docs))
            ids = torch.randint(1000, 2000, (ROWS, LENGTH), generator=torch.Generator().manual_seed(step))
            loss, grad = _step(compiled, model, family, pattern, ids, docs)
            eager_loss, eager_grad = _step(family.encoder(model), model, family, pattern, ids, docs)
            torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(grad, eager_grad, rtol=1e-4, atol=1e-6)
            graphs.append(compiled.graphs)
    # segment counts over several powers of two (today's bound: a new graph per block kind at each one)
    assert len({max(n - 1, 0).bit_length() for n in counts}) >= 3, counts
    # After a pattern's second micro-batch no document mix is a new graph (the second may add one per kind:
    # the `kernels` package sets a context variable during the first call that its graphs guarded as unset).
    for first in range(0, len(graphs), MICRO_BATCHES):
        assert graphs[first + 1] == graphs[first + MICRO_BATCHES - 1], (graphs, lines)
    assert graphs[-1] <= 2 * kinds * len(PATTERNS), (graphs, lines)
    assert not compiled.fallbacks
