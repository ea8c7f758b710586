"""Counted attention FLOPs at 8192 tokens: what each layer type's mask allows against what each path computes.

    python bench/attention_flops.py [--corpus corpus_en_e3c/train.txt] [--rows 8] [--check]

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

FLOPs are the forward's two matmuls, 4 x head dim x heads x pairs, per sequence and layer (backward about
twice that). --check also builds ablate.models.flex's BlockMask for the first row's global CLM and MLM layers
with documents and asserts its computed pairs equal the tile count here (about a minute per mask at 8192 on
a 2-core CPU).
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


def key_intervals(docs: np.ndarray, causal: bool, window: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the first and last key it may see (inclusive)."""
    q = np.arange(len(docs))
    change = np.flatnonzero(docs[1:] != docs[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(docs)]]) - 1
    which = np.searchsorted(starts, q, side="right") - 1
    lo, hi = starts[which], (q if causal else ends[which])
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


def sdpa_global_pairs(docs: np.ndarray, causal: bool, documents: bool) -> int:
    """The SDPA path's global layer: all pairs (CLM: the causal half), per document with documents."""
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(docs)) + 1, [len(docs)]]) if documents \
        else np.array([0, len(docs)])
    return sum(n * (n + 1) // 2 if causal else n * n for n in np.diff(bounds).tolist())


def row_counts(docs: np.ndarray, layer: str, causal: bool, documents: bool) -> dict[str, int]:
    window = WINDOW if layer == "local" else None
    seen = docs if documents else np.zeros_like(docs)
    lo, hi = key_intervals(seen, causal, window)
    if layer == "local":
        sdpa = cuda = banded_pairs(len(docs), causal)
    else:
        sdpa = sdpa_global_pairs(docs, causal, documents)
        cuda = tile_pairs(lo, hi, 128) if (causal or documents) else len(docs) ** 2
    return {"dense": len(docs) ** 2, "allowed": int((hi - lo + 1).sum()), "sdpa_cpu": sdpa, "cuda": cuda,
            "flex128": tile_pairs(lo, hi, 128), "flex64": tile_pairs(lo, hi, 64)}


def check_block_masks(docs: np.ndarray) -> None:
    import torch

    from ablate.models import flex
    for causal in (False, True):
        mask = flex.block_mask(1, len(docs), causal, None, torch.as_tensor(docs)[None], "cpu")
        lo, hi = key_intervals(docs, causal, None)
        assert flex.computed_pairs(mask) == tile_pairs(lo, hi, flex.TILE), causal
    print("block masks: computed pairs equal the tile counts (row 0, global layers with documents)")


def packed_rows(corpus: str, rows: int) -> np.ndarray:
    from ablate.config.spec import parse_run_spec
    from ablate.data.corpus import SequenceOrder, open_prepared
    from ablate.models.sources import DEFAULT_MODEL, load_tokenizer

    spec = parse_run_spec({"model": DEFAULT_MODEL, "data": {"corpus": corpus, "seq_len": LENGTH},
                           "phases": [{"name": "p", "objective": "mlm", "steps": 1}]})
    _sequences, doc_ids = open_prepared(spec.data, load_tokenizer(DEFAULT_MODEL)).packed(LENGTH)
    return np.asarray(doc_ids[SequenceOrder(len(doc_ids), spec.data.data_seed).take(0, rows)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="corpus_en_e3c/train.txt")
    ap.add_argument("--rows", type=int, default=8, help="sequences of the micro-batch (default 8)")
    ap.add_argument("--check", action="store_true", help="cross-check the tile counts with flex's BlockMasks")
    args = ap.parse_args()
    docs = packed_rows(args.corpus, args.rows)
    lengths = np.diff(np.flatnonzero(np.diff(np.concatenate([[-1], docs[0], [-1]])))).tolist()
    print(f"{args.corpus}: {len(docs)} rows of {LENGTH}; row 0 holds {len(lengths)} documents "
          f"(median {int(np.median(lengths))} tokens)")
    if args.check:
        check_block_masks(docs[0])
    table = []
    for layer in LAYERS:
        for objective in ("mlm", "clm"):
            for documents in (False, True):
                counts = [row_counts(row, layer, objective == "clm", documents) for row in docs]
                mean = {k: sum(c[k] for c in counts) / len(counts) for k in counts[0]}
                table.append({"layer": layer, "objective": objective, "documents": documents,
                              **{k: round(4 * HEAD_DIM * HEADS * v / 1e9, 2) for k, v in mean.items()}})
    print("forward GFLOPs per sequence and layer (4 x 64 x 12 x pairs)")
    for row in table:
        print(json.dumps(row))
    print("forward GFLOPs per sequence, the whole model (8 global + 14 local layers)")
    for objective in ("mlm", "clm"):
        for documents in (False, True):
            rows = [r for r in table if r["objective"] == objective and r["documents"] == documents]
            total = {k: round(sum(LAYERS[r["layer"]] * r[k] for r in rows), 1)
                     for k in ("dense", "allowed", "sdpa_cpu", "cuda", "flex128", "flex64")}
            print(json.dumps({"layer": "model", "objective": objective, "documents": documents, **total}))


if __name__ == "__main__":
    main()
