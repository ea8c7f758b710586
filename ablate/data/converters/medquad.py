"""MedQuAD (abachaa/MedQuAD, sets 1-9 of XML question-answer files) -> a pretraining corpus: one document per
XML file, its pairs as "question answer" joined by spaces in file order, an answer whose (whitespace-collapsed)
text appeared anywhere before dropped; whitespace collapsed, documents under 200 characters and repeated
documents dropped (sets and files in order), sorted by document id (a file without one: <set>/<file stem>),
shuffled with random.Random(13), the first 5 % -> valid.txt; doc_ids.tsv: split, id, collection, source,
url, licence.

May import: data.
"""

from __future__ import annotations

import csv
import random
import xml.etree.ElementTree as ET
from pathlib import Path, PurePosixPath

from ablate.data.converters.e3c_corpus import MIN_CHARS, SHUFFLE_SEED, archive_members, shuffled_split

LICENCE = "CC BY 4.0"


def _collapsed(text: str | None) -> str:
    return " ".join((text or "").split())


def medquad_documents(files: dict[str, bytes], sets: tuple[str, ...]) -> list[dict]:
    """Every XML file's document (sets in the catalogue's order, files sorted), answers seen before dropped."""
    seen_answers, docs = set(), []
    for folder in sets:
        for name in sorted(p for p in files if p.startswith(folder) and p.endswith(".xml")):
            root = ET.fromstring(files[name])
            pairs = []
            for pair in root.iter("QAPair"):
                answer = _collapsed(pair.findtext("Answer"))
                if answer not in seen_answers:
                    seen_answers.add(answer)
                    pairs.append(f"{_collapsed(pair.findtext('Question'))} {answer}")
            collection = folder.rstrip("/")
            docs.append(
                {
                    "id": root.get("id") or f"{collection}/{PurePosixPath(name).stem}",
                    "collection": collection,
                    "source": root.get("source"),
                    "url": root.get("url"),
                    "text": _collapsed(" ".join(pairs)),
                }
            )
    return docs


def kept_documents(docs: list[dict]) -> list[tuple[dict, str]]:
    seen, kept = set(), []
    for doc in docs:
        if len(doc["text"]) >= MIN_CHARS and doc["text"] not in seen:
            seen.add(doc["text"])
            kept.append((doc, doc["text"]))
    return sorted(kept, key=lambda pair: pair[0]["id"])


def convert_medquad(inputs: dict[str, Path], out: Path, ds) -> None:
    files = dict(archive_members(inputs["archive"], ds.archive))
    parts = shuffled_split(kept_documents(medquad_documents(files, ds.archive)), random.Random(SHUFFLE_SEED))
    with open(out / "doc_ids.tsv", "w", encoding="utf-8", newline="") as ids:
        rows = csv.writer(ids, delimiter="\t", lineterminator="\n")
        rows.writerow(["split", "id", "collection", "source", "url", "licence"])
        for split, docs in parts.items():
            (out / f"{split}.txt").write_text("".join(line + "\n" for _, line in docs), encoding="utf-8")
            rows.writerows([split, d["id"], d["collection"], d["source"], d["url"], LICENCE] for d, _ in docs)
