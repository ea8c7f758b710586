"""CRAFT's 97 full-text articles (UCDenver-ccp/CRAFT articles/txt/<PMID>.txt) -> a pretraining corpus: one
article a line (whitespace collapsed), sorted by PMID, shuffled with random.Random(13), the first 5 % ->
valid.txt; doc_ids.tsv gives each line's PMID, journal (the first line of <PMID>.copyright) and copyright
notice (that file's last line when it states a copyright or licence, whitespace collapsed, its first 300
characters; else empty).

May import: data.
"""

from __future__ import annotations

import csv
import random
import re
from pathlib import Path

from ablate.data.converters.e3c_corpus import SHUFFLE_SEED, VALID_SHARE

NOTICE = re.compile(r"Copyright|open-access|Open Access|Creative Commons")
NOTICE_CHARS = 300


def journal_and_notice(copyright_file: str) -> tuple[str, str]:
    lines = [line for line in copyright_file.splitlines() if line.strip()]
    notice = " ".join(lines[-1].split())[:NOTICE_CHARS] if NOTICE.search(lines[-1]) else ""
    return lines[0], notice


def convert_craft(inputs: dict[str, Path], out: Path, ds) -> None:
    pmids = sorted(name[:-4] for name in inputs if name.endswith(".txt"))
    random.Random(SHUFFLE_SEED).shuffle(pmids)
    n_valid = len(pmids) // VALID_SHARE
    with open(out / "doc_ids.tsv", "w", encoding="utf-8", newline="") as ids:
        rows = csv.writer(ids, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE, escapechar="\\")
        rows.writerow(["split", "id", "journal", "copyright_notice"])
        for split, part in (("train", pmids[n_valid:]), ("valid", pmids[:n_valid])):
            texts = [" ".join(inputs[f"{p}.txt"].read_text(encoding="utf-8").split()) for p in part]
            (out / f"{split}.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
            rows.writerows(
                [split, p, *journal_and_notice(inputs[f"{p}.copyright"].read_text(encoding="utf-8"))] for p in part
            )
