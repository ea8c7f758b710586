"""Data path at scale: `ablate prepare` vs the datasets.map recipe, and run start-up on the prepared corpus.

Corpora of 20 MB, 200 MB and 1 GB are built at run time under /tmp from the shipped E3C text (each line's
words shuffled, seeded), never committed. For each size, each configuration runs in its own subprocess:
  prepare   ablate.data.prepare.prepare on --workers processes (time, peak RSS of the process and of its
            workers)
  start     what a run does before its first step with the prepared corpus: open (memmap) + pack + order +
            the first batch with its doc ids (time; peak RSS of the process, tokenizer loaded)
  datasets  load_dataset("text") + map(tokenize, batched, num_proc=--workers) (time, peak RSS)

    PYTHONPATH=$PWD python bench/data_scale.py --sizes 20 200 1000 --workers 2

Prints one JSON line per configuration and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TMP = Path(tempfile.gettempdir()) / "ablate-data-scale"


def build_corpus(size_mb: int) -> Path:
    path = TMP / f"corpus_{size_mb}mb.txt"
    if path.is_file():
        return path
    from ablate.config.paths import resolve_data_path

    lines = resolve_data_path("corpus_en_e3c/train.txt").read_text().splitlines()
    rng = np.random.default_rng(size_mb)
    TMP.mkdir(parents=True, exist_ok=True)
    tmp, written = path.with_suffix(".tmp"), 0
    with tmp.open("w") as f:
        while written < size_mb * 1_000_000:
            for i in rng.permutation(len(lines)):
                words = lines[i].split()
                rng.shuffle(words)
                line = " ".join(words) + "\n"
                f.write(line)
                written += len(line.encode())
                if written >= size_mb * 1_000_000:
                    break
    tmp.rename(path)
    return path


def _peak_mb() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, children


def measure(config: str, corpus: Path, workers: int) -> dict:
    from ablate.config.spec import DataSpec
    from ablate.models.loading import DEFAULT_MODEL, load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    spec = DataSpec(corpus=str(corpus), prepared_root=str(TMP / "prepared"), seq_len=128)
    if config in ("prepare", "datasets"):  # timed from nothing: no prepared folder or Arrow cache of a past run
        shutil.rmtree(TMP / ("prepared" if config == "prepare" else "hf-cache"), ignore_errors=True)
    row = {"config": config, "size_mb": round(corpus.stat().st_size / 1e6)}
    start = time.perf_counter()
    if config == "prepare":
        from ablate.data.prepare import prepare
        from ablate.data.prepared import PreparedCorpus

        prepared = PreparedCorpus(prepare(spec, tokenizer, workers=workers, show=False))
        row["tokens"] = prepared.n_tokens
        row["disk_mb"] = round(sum(f.stat().st_size for f in prepared.folder.iterdir()) / 1e6, 1)
    elif config == "start":
        from ablate.data.corpus import SequenceOrder, load_packed

        sequences, doc_ids = load_packed(spec, tokenizer)
        idx = SequenceOrder(len(sequences), 42).take(0, 16)
        batch, docs = sequences[idx], doc_ids[idx]
        row["tokens"] = int(batch.size + 0 * docs.size)  # the first batch's tokens
    else:
        from datasets import load_dataset

        raw = load_dataset("text", data_files={"train": str(corpus)}, cache_dir=str(TMP / "hf-cache"))
        tok = raw.map(
            lambda b: tokenizer(b["text"], add_special_tokens=True, truncation=False, return_attention_mask=False),
            batched=True,
            num_proc=workers,
            remove_columns=["text"],
        )
        row["tokens"] = None  # documents only: counting tokens would read the whole result again
        row["documents"] = len(tok["train"])
    row["seconds"] = round(time.perf_counter() - start, 2)
    own, children = _peak_mb()
    row["peak_rss_gb"] = round(own / 1024, 3)
    row["workers_peak_rss_gb"] = round(children / 1024, 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 200, 1000], help="corpus sizes in MB")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--configs", nargs="+", default=["prepare", "start", "datasets"])
    ap.add_argument("--one", nargs=2, metavar=("CONFIG", "CORPUS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], Path(args.one[1]), args.workers)))
        return
    rows, failed = [], 0
    for size in args.sizes:
        corpus = build_corpus(size)
        for config in args.configs:
            out = subprocess.run(
                [sys.executable, __file__, "--one", config, str(corpus), "--workers", str(args.workers)],
                capture_output=True,
                text=True,
                env=dict(os.environ),
            )
            if out.returncode:
                print(out.stderr[-3000:], file=sys.stderr)
                failed += 1
                continue
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            rows[-1]["load_avg"] = round(os.getloadavg()[0], 2)
            print(json.dumps(rows[-1]), flush=True)
    print("\n| size MB | config | seconds | peak RSS GB | workers' peak RSS GB | tokens | load avg |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['size_mb']} | {r['config']} | {r['seconds']} | {r['peak_rss_gb']} | {r['workers_peak_rss_gb']} "
            f"| {r['tokens'] or '-'} | {r['load_avg']} |"
        )
    if failed:
        sys.exit(f"{failed} measurement(s) failed (their errors above)")


if __name__ == "__main__":
    main()
