"""DDI-2013 (isegura/DDICorpus, DDICorpus-2013.zip, XML) -> BLURB-style pair classification: one example per
annotated <pair>, its two drug mentions masked as @DRUG$ (overlapping mentions: one @DRUG-DRUG$; a
discontinuous mention: its full extent), CR and LF inside a sentence each a space, the label DDI-<type> or
DDI-false (a true pair without a type is dropped). Train and dev split the training documents as BLURB
does (its dev documents are read from BLURB's dev.tsv); test is the official DDI-extraction test set.

May import: data.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterator
from pathlib import Path

from ablate.data.converters.common import write_jsonl

TRAIN, TEST = "DDICorpus/Train/", "DDICorpus/Test/Test for DDI Extraction task/"
SOURCES = ("DrugBank", "MedLine")


def _extent(offsets: str) -> tuple[int, int]:
    """`a-b;c-d` (inclusive character offsets) -> (first, last) of the whole mention."""
    parts = [tuple(map(int, part.split("-"))) for part in offsets.split(";")]
    return min(a for a, _ in parts), max(b for _, b in parts)


def masked(text: str, first: tuple[int, int], second: tuple[int, int]) -> str:
    (a1, b1), (a2, b2) = sorted([first, second])
    if a2 <= b1:
        text = text[:a1] + "@DRUG-DRUG$" + text[max(b1, b2) + 1 :]
    else:
        text = text[:a1] + "@DRUG$" + text[b1 + 1 : a2] + "@DRUG$" + text[b2 + 1 :]
    return text.replace("\r", " ").replace("\n", " ")


def pair_records(xml: bytes) -> Iterator[tuple[str, dict]]:
    """(document id, {"id", "text", "label"}) for each pair of one document, in document order."""
    document = ET.fromstring(xml)
    for sentence in document.iter("sentence"):
        mentions = {e.get("id"): _extent(e.get("charOffset")) for e in sentence.iter("entity")}
        for pair in sentence.iter("pair"):
            if pair.get("ddi") == "true" and not pair.get("type"):
                continue
            label = f"DDI-{pair.get('type')}" if pair.get("ddi") == "true" else "DDI-false"
            text = masked(sentence.get("text"), mentions[pair.get("e1")], mentions[pair.get("e2")])
            yield document.get("id"), {"id": pair.get("id"), "text": text, "label": label}


def documents(archive: zipfile.ZipFile, folder: str) -> Iterator[tuple[str, dict]]:
    for source in SOURCES:
        prefix = f"{folder}{source}/"
        for name in sorted(n for n in archive.namelist() if n.startswith(prefix) and n.endswith(".xml")):
            yield from pair_records(archive.read(name))


def blurb_dev_documents(dev_tsv: str) -> list[str]:
    """The training documents BLURB's dev.tsv draws its pairs from (a pair id is <document>.s<k>.p<j>)."""
    return sorted({line.split("\t", 1)[0].rsplit(".s", 1)[0] for line in dev_tsv.splitlines() if line.strip()})


def convert_ddi(inputs: dict[str, Path], out: Path, ds) -> None:
    dev_docs = blurb_dev_documents(inputs["blurb_dev"].read_text(encoding="utf-8"))
    (out / "dev_doc_ids.txt").write_text("".join(d + "\n" for d in dev_docs), encoding="utf-8")
    with zipfile.ZipFile(inputs["corpus"]) as archive:
        train = list(documents(archive, TRAIN))
        write_jsonl(out / "train.jsonl", (r for doc, r in train if doc not in set(dev_docs)))
        write_jsonl(out / "dev.jsonl", (r for doc, r in train if doc in set(dev_docs)))
        write_jsonl(out / "test.jsonl", (r for _, r in documents(archive, TEST)))
