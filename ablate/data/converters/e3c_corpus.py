"""E3C layer-3 documents (JSON files in the repository's archive) -> a pretraining corpus: one document a line,
whitespace collapsed, short ones and exact duplicates dropped, a per-document licence filter, a seeded
shuffle after sorting by id, the first 5 % -> valid.txt; doc_ids.tsv names each line's document. The French
corpus adds an extra file of drug leaflets (non-commercial) drawn by the same generator.

May import: data.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Iterator
from pathlib import Path

from ablate.data.archives import gzip_tar

MIN_CHARS, SHUFFLE_SEED, VALID_SHARE = 200, 13, 20  # valid = the first len // 20 documents after shuffling
EN_LICENCES = ("CC BY", "CC BY 4.0", "CC BY-SA")
FR_LICENCES, LEAFLET_LICENCE, FR_EXTRA_CHARS = ("CC BY 4.0", "CC BY"), "CC-BY-NC", 2_500_000


def archive_members(archive: Path, folders: tuple[str, ...]) -> Iterator[tuple[str, bytes]]:
    """(path in the repository, bytes) of the regular files under `folders` of a GitHub archive (whose
    top folder, <repo>-<commit>/, is dropped), streamed in archive order."""
    with gzip_tar(archive) as tar:  # a truncated or corrupted archive raises (ablate.data.archives)
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


def shuffled_split(kept: list[tuple[dict, str]], rng: random.Random) -> dict[str, list[tuple[dict, str]]]:
    shuffled = list(kept)
    rng.shuffle(shuffled)
    n_valid = len(shuffled) // VALID_SHARE
    return {"train": shuffled[n_valid:], "valid": shuffled[:n_valid]}


def up_to_chars(kept: list[tuple[dict, str]], chars: int) -> list[tuple[dict, str]]:
    """The first documents until their lines (newline included) reach `chars` characters, that one included."""
    taken, total = [], 0
    for doc, line in kept:
        if total >= chars:
            break
        taken.append((doc, line))
        total += len(line) + 1
    return taken


def write_corpus(parts: dict[str, list[tuple[dict, str]]], out: Path, files: dict[str, str] | None = None) -> None:
    """Each part's lines to its file (<split>.txt unless `files` names another), and doc_ids.tsv: split, id,
    licence, source for every line, part after part."""
    with open(out / "doc_ids.tsv", "w", encoding="utf-8", newline="") as ids:
        rows = csv.writer(ids, delimiter="\t", lineterminator="\n")
        rows.writerow(["split", "id", "licence", "source"])
        for split, docs in parts.items():
            name = (files or {}).get(split, f"{split}.txt")
            (out / name).write_text("".join(line + "\n" for _, line in docs), encoding="utf-8")
            rows.writerows([split, d["id"], d["licence"], d["source"]] for d, _ in docs)


def convert_corpus_en_e3c(inputs: dict[str, Path], out: Path, ds) -> None:
    kept = corpus_lines(e3c_documents(inputs["archive"], ds.archive), EN_LICENCES)
    write_corpus(shuffled_split(kept, random.Random(SHUFFLE_SEED)), out)


def french_parts(docs: list[dict]) -> dict[str, list[tuple[dict, str]]]:
    """The CC BY clinical cases as train/valid; then, shuffled by the same generator, leaflets (CC-BY-NC)
    up to 2.5 M characters as the extra part."""
    rng = random.Random(SHUFFLE_SEED)
    parts = shuffled_split(corpus_lines(docs, FR_LICENCES), rng)
    leaflets = corpus_lines(docs, (LEAFLET_LICENCE,))
    rng.shuffle(leaflets)
    parts["extra"] = up_to_chars(leaflets, FR_EXTRA_CHARS)
    return parts


def convert_corpus_fr_e3c(inputs: dict[str, Path], out: Path, ds) -> None:
    write_corpus(
        french_parts(e3c_documents(inputs["archive"], ds.archive)), out, {"extra": "extra_leaflets_cc-by-nc.txt"}
    )
