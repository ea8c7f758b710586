"""E3C layer-3 documents (JSON files in the repository's archive) -> a pretraining corpus: one document a line,
whitespace collapsed, short ones and exact duplicates dropped, a per-document licence filter, a seeded
shuffle after sorting by id, the first 5 % -> valid.txt; doc_ids.tsv names each line's document.

May import: config, data.
"""

from __future__ import annotations

import csv
import json
import random
import tarfile
from collections.abc import Iterator
from pathlib import Path

MIN_CHARS, SHUFFLE_SEED, VALID_SHARE = 200, 13, 20      # valid = the first len // 20 documents after shuffling
EN_LICENCES = ("CC BY", "CC BY 4.0", "CC BY-SA")


def archive_members(archive: Path, folders: tuple[str, ...]) -> Iterator[tuple[str, bytes]]:
    """(path in the repository, bytes) of the regular files under `folders` of a GitHub archive (whose
    top folder, <repo>-<commit>/, is dropped), streamed in archive order."""
    with tarfile.open(archive, "r|gz") as tar:
        for member in tar:
            path = member.name.split("/", 1)[-1]
            if member.isfile() and path.startswith(folders):
                yield path, tar.extractfile(member).read()


def e3c_documents(archive: Path, folders: tuple[str, ...]) -> list[dict]:
    return [json.loads(data) for path, data in archive_members(archive, folders) if path.endswith(".json")]


def corpus_lines(docs: list[dict], licences: tuple[str, ...]) -> list[tuple[dict, str]]:
    """(document, its line) kept, in id order: long enough, first of identical texts, licence allowed."""
    seen, kept = set(), []
    for doc in sorted(docs, key=lambda d: d["id"]):
        line = " ".join(doc["text"].split())
        if len(line) < MIN_CHARS or line in seen:
            continue
        seen.add(line)
        if doc.get("licence") in licences:
            kept.append((doc, line))
    return kept


def write_corpus(kept: list[tuple[dict, str]], out: Path) -> None:
    shuffled = list(kept)
    random.Random(SHUFFLE_SEED).shuffle(shuffled)
    n_valid = len(shuffled) // VALID_SHARE
    parts = {"train": shuffled[n_valid:], "valid": shuffled[:n_valid]}
    with open(out / "doc_ids.tsv", "w", encoding="utf-8", newline="") as ids:
        rows = csv.writer(ids, delimiter="\t", lineterminator="\n")
        rows.writerow(["split", "id", "licence", "source"])
        for split, docs in parts.items():
            (out / f"{split}.txt").write_text("".join(line + "\n" for _, line in docs), encoding="utf-8")
            rows.writerows([split, d["id"], d["licence"], d["source"]] for d, _ in docs)


def convert_corpus_en_e3c(inputs: dict[str, Path], out: Path, ds) -> None:
    write_corpus(corpus_lines(e3c_documents(inputs["archive"], ds.archive), EN_LICENCES), out)
