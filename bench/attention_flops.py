"""Counted attention FLOPs at 8192 tokens: what each layer type's mask allows against what each path computes.

    python bench/attention_flops.py [--corpus corpus_en_e3c/train.txt] [--rows 8] [--prefix-draws 8] [--check]

ModernBERT-base shapes (ablate/models/configs/modernbert-base.json: 22 layers, 8 global and 14 local with a
64-token window either side, 12 heads of 64), the first micro-batch of 8 packed sequences of the real corpus
in a run's data order (MiniLM's tokenizer, the project's default). Counts are exact, from each row's
allowed key interval per query (documents, the window and causality all keep it one interval):

- dense         every (query, key) pair: an L x L mask (eager, `per-layer-type`; SDPA with a mask)
- allowed       the pairs the mask allows: what attention that skips nothing allowed and computes nothing
                else would score
- sdpa (CPU)    ablate.models.attention on the CPU: global layers SDPA (MLM: all pairs; CLM: the causal flag,
                counted as L(L+1)/2), with documents one SDPA call per document; local layers blocked
                (queries in blocks of 64 against 64 + 2 x 64 keys, CLM 64 + 64)
- CUDA (chosen) what a CUDA step computes: global layers without documents SDPA's flash kernel (MLM all
                pairs; CLM the 128-tiles on or below the diagonal), with documents FlexAttention's non-empty
                128-tiles (ablate.models.flex); local layers the blocked path on the memory-efficient kernel
- flex-128 / flex-64  FlexAttention's non-empty tiles at 128 (its default) and 64 wide: the alternatives
                for local layers

Objectives: mlm, clm, prefix-lm (per row a bidirectional prefix, split uniformly in [1, L - 1], 8 draws a
row: global layers on the CPU the fused causal call plus one over the prefix, on CUDA FlexAttention's tiles
under the prefix's block mask; local layers the blocked path's two-sided span) and mixture (grids/detours.yaml's
CLM+MLM by sequence, 1:3: a causal and a bidirectional row in one micro-batch, the same prefix paths).

FLOPs are the forward's two matmuls, 4 x head dim x heads x pairs, per sequence and layer (backward about
twice that). --check also builds ablate.models.flex's BlockMask for the first row's global CLM, MLM and
prefix-LM layers with documents and asserts its computed pairs equal the tile count here (about a minute per
mask at 8192 on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LENGTH, WINDOW, HEADS, HEAD_DIM, BLOCK = 8192, 64, 12, 64, 64
LAYERS = {"global": 8, "local": 14}


def key_intervals(
    docs: np.ndarray, causal: bool, window: int | None, prefix: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the first and last key it may see (inclusive); prefix (with causal): keys k < prefix too."""
    q = np.arange(len(docs))
    change = np.flatnonzero(docs[1:] != docs[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(docs)]]) - 1
    which = np.searchsorted(starts, q, side="right") - 1
    last = np.maximum(q, prefix - 1) if prefix is not None else q
    lo, hi = starts[which], (np.minimum(last, ends[which]) if causal else ends[which])
    if window is not None:
        lo, hi = np.maximum(lo, q - window), np.minimum(hi, q + window)
    return lo, hi


def tile_pairs(lo: np.ndarray, hi: np.ndarray, tile: int) -> int:
    """Pairs in the non-empty tile x tile blocks of the score matrix (each computed in full)."""
    n = -(-len(lo) // tile)
    diff = np.zeros((n, n + 1), dtype=np.int64)
    rows = np.arange(len(lo)) // tile
    np.add.at(diff, (rows, lo // tile), 1)
    np.add.at(diff, (rows, hi // tile + 1), -1)
    return int((np.cumsum(diff, axis=1)[:, :n] > 0).sum()) * tile * tile


def banded_pairs(length: int, causal: bool) -> int:
    """The blocked local path: every query block against its span of keys, masked or not."""
    return -(-length // BLOCK) * BLOCK * (BLOCK + WINDOW + (0 if causal else WINDOW))


def sdpa_global_pairs(docs: np.ndarray, causal: bool, documents: bool, prefix: int | None = None) -> int:
    """The SDPA path's global layer: all pairs (CLM: the causal half), per document with documents; with a
    prefix, per document the causal call plus one over its part of the prefix (prefix^2; none for 0 or 1),
    a document inside the prefix in full."""
    bounds = (
        np.concatenate([[0], np.flatnonzero(np.diff(docs)) + 1, [len(docs)]])
        if documents
        else np.array([0, len(docs)])
    )
    total = 0
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        n, head = end - start, (0 if prefix is None else min(max(prefix - start, 0), end - start))
        if not causal or head >= n:
            total += n * n
        else:
            total += n * (n + 1) // 2 + (head * head if head > 1 else 0)
    return total


def row_counts(
    docs: np.ndarray, layer: str, causal: bool, documents: bool, prefix: int | None = None
) -> dict[str, int]:
    """One row's pairs per column; prefix: the row's prefix length under the prefix pattern (a prefix-LM
    row, or a mixture's causal (0) or bidirectional (L) row in a micro-batch with rows of the other)."""
    window = WINDOW if layer == "local" else None
    seen = docs if documents else np.zeros_like(docs)
    lo, hi = key_intervals(seen, causal, window, prefix)
    if layer == "local":  # a prefix pattern takes the two-sided span (MLM's) for every row
        sdpa = cuda = banded_pairs(len(docs), causal and prefix is None)
    else:
        sdpa = sdpa_global_pairs(docs, causal, documents, prefix)
        cuda = tile_pairs(lo, hi, 128) if (causal or documents) else len(docs) ** 2
    return {
        "dense": len(docs) ** 2,
        "allowed": int((hi - lo + 1).sum()),
        "sdpa_cpu": sdpa,
        "cuda": cuda,
        "flex128": tile_pairs(lo, hi, 128),
        "flex64": tile_pairs(lo, hi, 64),
    }


def check_block_masks(docs: np.ndarray, prefix: int) -> None:
    import torch

    from ablate.models import flex

    for causal, cut in ((False, None), (True, None), (True, prefix)):
        mask = flex.block_mask(
            1,
            len(docs),
            causal,
            None,
            torch.as_tensor(docs)[None],
            "cpu",
            prefix=None if cut is None else torch.tensor([cut]),
        )
        lo, hi = key_intervals(docs, causal, None, cut)
        assert flex.computed_pairs(mask) == tile_pairs(lo, hi, flex.TILE), (causal, cut)
    print(
        f"block masks: computed pairs equal the tile counts (row 0, global layers with documents; MLM, CLM, "
        f"prefix {prefix})"
    )


OBJECTIVES = ("mlm", "clm", "prefix-lm", "mixture")
MIXTURE_CLM_SHARE = 0.25  # grids/detours.yaml's CLM+MLM mixture by sequence, 1:3


def objective_counts(
    row: np.ndarray, layer: str, objective: str, documents: bool, prefixes: list[int]
) -> dict[str, float]:
    """A row's pairs per column under an objective: prefix-lm the mean over the row's drawn prefixes; the
    mixture a CLM row (prefix 0) and an MLM row (prefix L) by their shares, both under the prefix pattern."""
    if objective in ("mlm", "clm"):
        return row_counts(row, layer, objective == "clm", documents)
    if objective == "prefix-lm":
        draws, weights = prefixes, [1 / len(prefixes)] * len(prefixes)
    else:
        draws, weights = [0, len(row)], [MIXTURE_CLM_SHARE, 1 - MIXTURE_CLM_SHARE]
    counts = [row_counts(row, layer, True, documents, p) for p in draws]
    return {k: sum(w * c[k] for w, c in zip(weights, counts)) for k in counts[0]}


def packed_rows(corpus: str, rows: int) -> np.ndarray:
    from ablate.config.spec import parse_run_spec
    from ablate.data.corpus import SequenceOrder, ensure_prepared
    from ablate.models.loading import DEFAULT_MODEL, load_tokenizer

    spec = parse_run_spec(
        {
            "model": DEFAULT_MODEL,
            "data": {"corpus": corpus, "seq_len": LENGTH},
            "phases": [{"name": "p", "objective": "mlm", "steps": 1}],
        }
    )
    _sequences, doc_ids = ensure_prepared(spec.data, load_tokenizer(DEFAULT_MODEL)).packed(LENGTH)
    return np.asarray(doc_ids[SequenceOrder(len(doc_ids), spec.data.data_seed).take(0, rows)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="corpus_en_e3c/train.txt")
    ap.add_argument("--rows", type=int, default=8, help="sequences of the micro-batch (default 8)")
    ap.add_argument("--check", action="store_true", help="cross-check the tile counts with flex's BlockMasks")
    ap.add_argument("--prefix-draws", type=int, default=8, help="prefix-LM splits drawn per row (default 8)")
    args = ap.parse_args()
    docs = packed_rows(args.corpus, args.rows)
    lengths = np.diff(np.flatnonzero(np.diff(np.concatenate([[-1], docs[0], [-1]])))).tolist()
    print(
        f"{args.corpus}: {len(docs)} rows of {LENGTH}; row 0 holds {len(lengths)} documents "
        f"(median {int(np.median(lengths))} tokens)"
    )
    # prefix-LM's split: uniform in [1, L - 1] per row (ablate.config.objectives.prefix_lm), drawn here
    prefixes = np.random.default_rng(0).integers(1, LENGTH, (len(docs), args.prefix_draws)).tolist()
    if args.check:
        check_block_masks(docs[0], prefixes[0][0])
    table = []
    for layer in LAYERS:
        for objective in OBJECTIVES:
            for documents in (False, True):
                counts = [
                    objective_counts(row, layer, objective, documents, cuts) for row, cuts in zip(docs, prefixes)
                ]
                mean = {k: sum(c[k] for c in counts) / len(counts) for k in counts[0]}
                table.append(
                    {
                        "layer": layer,
                        "objective": objective,
                        "documents": documents,
                        **{k: round(4 * HEAD_DIM * HEADS * v / 1e9, 2) for k, v in mean.items()},
                    }
                )
    print("forward GFLOPs per sequence and layer (4 x 64 x 12 x pairs)")
    for row in table:
        print(json.dumps(row))
    print("forward GFLOPs per sequence, the whole model (8 global + 14 local layers)")
    for objective in OBJECTIVES:
        for documents in (False, True):
            rows = [r for r in table if r["objective"] == objective and r["documents"] == documents]
            total = {
                k: round(sum(LAYERS[r["layer"]] * r[k] for r in rows), 1)
                for k in ("dense", "allowed", "sdpa_cpu", "cuda", "flex128", "flex64")
            }
            print(json.dumps({"layer": "model", "objective": objective, "documents": documents, **total}))


if __name__ == "__main__":
    main()
