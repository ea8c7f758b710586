"""Converters of single repositories: MORFITT's TSV, PubMedQA's labelled JSON with its derived train/dev split,
and E3C's French clinical-entity IOB files with the official train split cut into train and dev.

May import: data.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from ablate.data.converters.blurb import tsv_rows
from ablate.data.converters.common import SPLITS, write_jsonl

PUBMEDQA_DEV_FRACTION, PUBMEDQA_SEED = 0.1, 0
E3C_NER_DEV_SENTENCES = 50


def morfitt_records(rows: list[dict[str, str]]) -> list[dict]:
    return [
        {"id": r["identifier"], "text": " ".join(r["abstract"].split()), "labels": r["specialities"].split("|")}
        for r in rows
    ]


def convert_morfitt(inputs: dict[str, Path], out: Path, ds) -> None:
    for split in SPLITS:
        write_jsonl(out / f"{split}.jsonl", morfitt_records(tsv_rows(inputs[split])))


def pubmedqa_record(pmid: str, item: dict) -> dict:
    return {
        "pmid": pmid,
        "question": item["QUESTION"],
        "context": " ".join(item["CONTEXTS"]),
        "context_labels": item["LABELS"],
        "long_answer": item["LONG_ANSWER"],
        "year": item["YEAR"],
        "meshes": item.get("MESHES", []),
        "label": item["final_decision"],
    }


def pubmedqa_splits(labelled: dict[str, dict], test_pmids: set[str]) -> dict[str, list[dict]]:
    """test: the official test PMIDs in file order. The other 500, per label (sorted), PMIDs sorted numerically
    and shuffled with random.Random(0): the first 10 % (rounded) -> dev, the rest -> train; both in PMID order."""
    records = {pmid: pubmedqa_record(pmid, item) for pmid, item in labelled.items()}
    rest = [r for pmid, r in records.items() if pmid not in test_pmids]
    splits = {"train": [], "dev": [], "test": [r for pmid, r in records.items() if pmid in test_pmids]}
    rng = random.Random(PUBMEDQA_SEED)
    for label in sorted({r["label"] for r in rest}):
        group = sorted((r for r in rest if r["label"] == label), key=lambda r: int(r["pmid"]))
        rng.shuffle(group)
        n_dev = round(len(group) * PUBMEDQA_DEV_FRACTION)
        splits["dev"] += group[:n_dev]
        splits["train"] += group[n_dev:]
    for split in ("train", "dev"):
        splits[split].sort(key=lambda r: int(r["pmid"]))
    return splits


def convert_pubmedqa(inputs: dict[str, Path], out: Path, ds) -> None:
    labelled = json.loads(inputs["labelled"].read_text(encoding="utf-8"))
    test_pmids = set(json.loads(inputs["test_ground_truth"].read_text(encoding="utf-8")))
    for split, records in pubmedqa_splits(labelled, test_pmids).items():
        write_jsonl(out / f"{split}.jsonl", records)


def conll_sentences(text: str) -> list[str]:
    """A CoNLL file's sentences, each its lines as they are (newline-terminated), blank lines dropped."""
    sentences, current = [], []
    for line in text.splitlines(keepends=True):
        if line.strip():
            current.append(line)
        elif current:
            sentences.append("".join(current))
            current = []
    if current:
        sentences.append("".join(current))
    return sentences


def convert_e3c_fr_ner(inputs: dict[str, Path], out: Path, ds) -> None:
    train = conll_sentences(inputs["train"].read_text(encoding="utf-8"))
    cut = len(train) - E3C_NER_DEV_SENTENCES
    parts = {
        "train": train[:cut],
        "dev": train[cut:],
        "test": conll_sentences(inputs["test"].read_text(encoding="utf-8")),
    }
    for split, sentences in parts.items():
        (out / f"{split}.txt").write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
