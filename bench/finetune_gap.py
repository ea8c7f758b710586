"""Where ablate's and the run_ner Trainer recipe's test F1 differ: one factor at a time, F1 only (no timing).

    python bench/finetune_gap.py --variants shuffled grouped hf_schedule recipe \
        --seeds 1 2 3 --json-out gap.json

Each (variant, seed) runs in a subprocess of its own (bench/finetune_compare.py's sides, same settings and
flags: NCBI-disease, MiniLM-L6, --max-train sentences x --epochs, batch 16, length 128, 2 threads). On the CPU
a fine-tuning's F1 is a function of its settings and seed alone, so a loaded machine changes no number here.

  shuffled     ablate, batches shuffled (the default before issue 32)
  grouped      ablate, batches grouped by length (the default from issue 32)
  hf_schedule  ablate shuffled, with the Trainer's warmup (step / warmup: the first step at lr 0) instead of
               ablate's ((step + 1) / (warmup + 1))
  init         ablate shuffled, with the global RNG reset to the seed after the model is built, as the
               Trainer's constructor does (the classifier's initialisation is the same on both sides: the model
               is built right after seeding; only the dropout stream differs)
  recipe       the run_ner-style Trainer script (tests the last epoch's model)

Every ablate variant reports the epoch it tested (the best dev epoch); with --test-every-epoch it also scores
test after every epoch, so that the model ablate tests and the last one are compared on the same run. Prints a
Markdown table (variant x seed, mean and spread), then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import finetune_compare  # noqa: E402

VARIANTS = ("shuffled", "grouped", "hf_schedule", "init", "recipe")


def _hf_lr_factor(warmup: int, total: int):
    from transformers.optimization import _get_linear_schedule_with_warmup_lr_lambda as hf

    return lambda step: hf(step, num_warmup_steps=warmup, num_training_steps=total)


def run_variant(args) -> dict:
    """One ablate variant in this process: test F1 after every epoch besides finetune's own rows."""
    import torch

    from ablate.evaluate import finetune as ft
    from ablate.evaluate.metrics import entity_f1

    per_epoch = []
    real_predict, real_load, real_encode = ft._predict, ft._load_model, ft.encode
    encoded = []  # (encodings, examples) of train, dev, test: finetune encodes them in this order

    def encode(tokenizer, task, examples, labels, max_length):
        encoded.append((real_encode(tokenizer, task, examples, labels, max_length), examples))
        return encoded[-1][0]

    def predict(model, task, data, labels, examples, *rest):
        preds = real_predict(model, task, data, labels, examples, *rest)
        if args.test_every_epoch and data is encoded[1][0]:  # a dev pass, after an epoch: score test too
            test_data, test_examples = encoded[2]
            test_preds = real_predict(model, task, test_data, labels, test_examples, *rest)
            per_epoch.append(round(entity_f1([list(ex.label) for ex in test_examples], test_preds), 4))
            model.train()
        return preds

    def load_model(*a, **k):
        model = real_load(*a, **k)
        if args.variant == "init":
            torch.manual_seed(args.seed)
        return model

    ft._predict, ft._load_model, ft.encode = predict, load_model, encode
    if args.variant == "hf_schedule":
        ft._lr_factor = _hf_lr_factor
    args.ablate_batches = "grouped" if args.variant == "grouped" else "shuffled"
    args.ablate_length_pieces = False
    row = finetune_compare.run_ablate(args, time.perf_counter())
    return {**row, "variant": args.variant, "test_f1_per_epoch": per_epoch}


def _child(args, variant: str, seed: int) -> dict:
    script = finetune_compare.__file__ if variant == "recipe" else __file__
    cmd = [
        sys.executable,
        script,
        "--seed",
        str(seed),
        "--max-train",
        str(args.max_train),
        "--epochs",
        str(args.epochs),
        "--threads",
        str(args.threads),
        "--lr",
        str(args.lr),
    ]
    cmd += ["--max-eval", str(args.max_eval)] if args.max_eval else []
    cmd += ["--side", "recipe"] if variant == "recipe" else ["--variant", variant]
    cmd += ["--test-every-epoch"] if args.test_every_epoch and variant != "recipe" else []
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONWARNINGS="ignore",
    )
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"subprocess failed (exit {proc.returncode}): {' '.join(cmd)}")
    row = {**json.loads(lines[-1]), "variant": variant}
    print(
        f"  {variant} seed {seed}: test F1 {row['test_entity_f1']:.4f} dev {row['dev_entity_f1']:.4f} "
        f"per epoch {row.get('test_f1_per_epoch')} best epoch {row.get('best_epoch')}",
        file=sys.stderr,
        flush=True,
    )
    return row


def table(rows: list[dict]) -> str:
    seeds = sorted({r["seed"] for r in rows})
    out = [
        "| variant | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | spread (sd) | min-max |",
        "|---|" + "---:|" * (len(seeds) + 3),
    ]
    for variant in dict.fromkeys(r["variant"] for r in rows):
        f1 = {r["seed"]: r["test_entity_f1"] for r in rows if r["variant"] == variant}
        vals = list(f1.values())
        sd = statistics.stdev(vals) if len(vals) > 1 else float("nan")
        out.append(
            f"| {variant} | "
            + " | ".join(f"{f1[s]:.4f}" if s in f1 else "" for s in seeds)
            + f" | {statistics.fmean(vals):.4f} | {sd:.4f} | {min(vals):.4f}-{max(vals):.4f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--variant", choices=[v for v in VARIANTS if v != "recipe"], help="run one ablate variant here"
    )
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--runs", nargs="*", metavar="VARIANT:SEED", help="these runs, in this order, instead")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-train", type=int, default=2000)
    ap.add_argument(
        "--max-eval", type=int, default=None, help="the first N dev and N test sentences (default all)"
    )
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--jobs", type=int, default=1, help="subprocesses at once (F1 does not depend on the load)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--test-every-epoch", action="store_true", help="ablate variants: test F1 after every epoch too"
    )
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    if args.variant:
        base = finetune_compare.parser().parse_args(
            [
                "--seed",
                str(args.seed),
                "--max-train",
                str(args.max_train),
                "--epochs",
                str(args.epochs),
                "--threads",
                str(args.threads),
                "--lr",
                str(args.lr),
            ]
            + (["--max-eval", str(args.max_eval)] if args.max_eval else [])
        )
        base.variant, base.test_every_epoch = args.variant, args.test_every_epoch
        print(json.dumps(run_variant(base)), flush=True)
        return
    todo = [(v, s) for s in args.seeds for v in args.variants]
    if args.runs:
        todo = [(r.split(":")[0], int(r.split(":")[1])) for r in args.runs]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda vs: _child(args, *vs), todo))
    out = {"bench": "finetune_gap", "rows": rows, "settings": vars(args)}
    print(table(rows), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
