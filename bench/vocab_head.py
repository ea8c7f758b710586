"""The vocabulary head alone: ablate's fused chunked projection + cross-entropy against the dense head, in one process.

    python bench/vocab_head.py                       # MiniLM-L6's CLM head: 2,017 positions x 384 -> 30,522
    python bench/vocab_head.py --positions 307       # MLM: the 15% masked positions of a 16 x 128 batch

The dense head is what the transformers recipe computes (F.linear to all logits, then cross-entropy); the fused
one is ablate.train.vocab_loss.fused_cross_entropy, the engine's default. Both run forward + backward on the
same random features, decoder weight (tied-embedding shape) and bias, alternating call by call (A B, B A, ...)
so that the machine's drift falls on both; the ratio reported is the median of the per-round ratios
dense s / fused s, which is steadier on a shared machine than whole training steps (bench/compare_recipes.py),
where the head is about half of a CLM step's time. Peak memory per call is the process's RSS high-water mark
during the call (reset before it) minus the RSS before it.

Prints one line per variant, then one JSON object (last line).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pretrain_step import reset_peak_rss, vm_hwm_mb, vm_rss_mb  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--positions", type=int, default=2017, help="labelled positions (default 2,017: CLM, 16 x 128)"
    )
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument(
        "--chunk", type=int, default=None, help="positions per chunk of the fused head (default: its own)"
    )
    ap.add_argument("--rounds", type=int, default=16, help="calls of each head, alternating (default 16)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import torch

    from ablate.train.vocab_loss import dense_cross_entropy, fused_cross_entropy

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.positions, args.hidden, generator=g).requires_grad_()
    w = (torch.randn(args.vocab, args.hidden, generator=g) * 0.05).requires_grad_()
    b = torch.zeros(args.vocab).requires_grad_()
    y = torch.randint(0, args.vocab, (args.positions,), generator=g)
    chunk = {} if args.chunk is None else {"chunk": args.chunk}
    heads = {"dense": dense_cross_entropy, "fused": lambda *a: fused_cross_entropy(*a, **chunk)}
    seconds: dict[str, list[float]] = {name: [] for name in heads}
    peak_mb: dict[str, list[float]] = {name: [] for name in heads}
    for round_ in range(args.rounds + 1):  # round 0 warms up and is not kept
        for name in heads if round_ % 2 == 0 else reversed(heads):
            x.grad = w.grad = b.grad = None
            before = vm_rss_mb()
            reset_peak_rss()
            start = time.perf_counter()
            heads[name](x, w, b, y).backward()
            if round_:
                seconds[name].append(time.perf_counter() - start)
                peak_mb[name].append(vm_hwm_mb() - before)
    ratios = [d / f for d, f in zip(seconds["dense"], seconds["fused"])]
    result = {
        "bench": "vocab_head",
        "positions": args.positions,
        "hidden": args.hidden,
        "vocab": args.vocab,
        "chunk": args.chunk,
        "rounds": args.rounds,
        "threads": args.threads,
        "median_s": {n: round(statistics.median(s), 4) for n, s in seconds.items()},
        "peak_mb": {n: round(max(p), 1) for n, p in peak_mb.items()},
        "speed_fused_over_dense": round(statistics.median(ratios), 3),
        "torch": torch.__version__,
    }
    for name in heads:
        print(f"{name:6s} median {result['median_s'][name]:.3f} s  peak +{result['peak_mb'][name]:.0f} MB")
    print(f"fused is {result['speed_fused_over_dense']}x the dense head's speed (median of per-round ratios)")
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
