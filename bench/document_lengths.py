"""The document lengths bench/gpu_check.py packs its document rows from: each English pretraining corpus of the
data root, tokenized as a preparation tokenizes it, reduced to its percentiles, into bench/document_lengths.json.

    ABLATE_DATA_ROOT=../shared/data PYTHONPATH=$PWD python bench/document_lengths.py

Made once on a machine with the data (the GPU node has none) and committed: a length is the document's token
count with its special tokens ([CLS] ... [SEP], as ablate.data.encode packs documents) under bench/tokenizer
(the MiniLM WordPiece vocabulary, the check's tokenizer); the table keeps the 0th, 1st, ..., 100th
percentiles (numpy.quantile, rounded), from which gpu_recipes.draw_document_lengths draws (linear between
percentiles). About 30 s on a 2-core machine (corpus_en_medquad's 5,207 documents are most of it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parent
TABLE = BENCH / "document_lengths.json"
CORPORA = ("corpus_en_e3c", "corpus_en_medquad", "corpus_en_craft")  # the English pretraining corpora


def corpus_table(path: Path, tokenizer) -> dict:
    """{documents, mean, percentiles} of the documents (one per line) of `path`."""
    import numpy as np

    docs = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    lengths = np.array([len(ids) for ids in tokenizer(docs, add_special_tokens=True)["input_ids"]])
    return {
        "documents": len(lengths),
        "mean": round(float(lengths.mean()), 1),
        "percentiles": [int(round(q)) for q in np.quantile(lengths, np.linspace(0, 1, 101))],
    }


def make(data_root: Path) -> dict:
    from ablate.models.loading import load_tokenizer

    tokenizer = load_tokenizer(str(BENCH / "tokenizer"))
    tokenizer.model_max_length = 10**9  # lengths, not inputs: no warning for long documents
    return {
        "made_by": "bench/document_lengths.py",
        "tokenizer": "bench/tokenizer (MiniLM WordPiece), with [CLS] and [SEP]",
        "corpora": {name: corpus_table(data_root / name / "train.txt", tokenizer) for name in CORPORA},
    }


def main(argv=None) -> int:
    from ablate.config.paths import data_root

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", default=None, help="default: ABLATE_DATA_ROOT, else ./data")
    ap.add_argument("--out", default=str(TABLE))
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    table = make(data_root(args.data_root))
    text = json.dumps(table, indent=1)
    text = re.sub(r"\[([\d,\s]+)\]", lambda m: "[" + ", ".join(re.findall(r"\d+", m.group(1))) + "]", text)
    Path(args.out).write_text(text + "\n")  # a corpus's percentiles on one line
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
