"""Document-level multi-label tasks from coded BRAT corpora, as the paper's harness derives them
(Rian-T/tabib @ 16649393, src/tabib/data/fracco.py and frasimed.py):

- FRACCO (Zenodo 17284817, FRACCO.zip; FRACCODocumentICDAdapter._load_from_zip and load_splits): a document
  is each `ann_txt_files/*.txt` (its whole text, decoded as tabib decodes a zip member: no newline
  translation), named `<stem>.ann`; its labels the set of raw `code` strings (stripped) of its
  `expression_CIM` rows in `FRACCO/DetectOnco_Final.csv` (keyed by `doc_name`). Split:
  `_compute_doc_splits` / `_split_counts` with `SplitRatios.resolve()`'s ratios (0.8, 0.1, 1 - 0.8 - 0.1):
  floors, the documents left over one each to the splits with the largest fractional parts (ties: train,
  dev, test order).
- FRASIMED (Zenodo 8355629; FRASIMEDDocumentMultilabelAdapter._load_all_documents, _load_from_brat,
  _parse_ann_with_codes): each `<subset>/<stem>.ann` directly in the subset's folder, with its `.txt` beside
  it, both read as Path.read_text reads them (UTF-8, errors replaced, universal newlines); an entity is a `T`
  line with a span (a fragment of two fields); `#` lines `#n<TAB><code type> T<id><TAB><code>` attach codes
  to entities (the last code of a type per entity wins); the code type is ICD-O-3.1 when the first entity
  with a code (documents in name order) has one, else SNOMED; a document's labels the codes of that type
  over its entities (`_split_documents`: int(0.8 n) train, int(0.1 n) dev, the rest test).

Both: documents with text and at least one code, sorted by name; a code's frequency is the number of documents
carrying it; the top k codes are kept and documents left with none dropped; then the sorted names shuffled with
random.Random(42). The top k are tabib's: it counts codes into an insertion-ordered dict while walking the
name-sorted documents and sorts that dict stably by frequency, so codes of equal frequency keep the order of
the first document carrying each. ablate ranks by frequency (descending), then that first document, then the
code (ascending): only codes first seen in the same document can still tie there, and for those tabib's order
is the iteration order of a Python set of strings, which changes with the interpreter's hash seed.

May import: config, data.
"""

from __future__ import annotations

import csv
import io
import math
import random
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from ablate.config.errors import SpecError
from ablate.data.converters.common import SPLITS, write_jsonl

SPLIT_SEED = 42
RATIOS = (0.8, 0.1, 0.1)
FRACCO_RATIOS = (0.8, 0.1, 1.0 - 0.8 - 0.1)  # tabib's SplitRatios.resolve(): test = 1 - train - val
FRACCO_CSV = "DetectOnco_Final.csv"
FRACCO_TEXTS = "ann_txt_files/"
FRACCO_LABEL = "expression_CIM"
FRASIMED_SUBSETS = {"cantemist": "CANTEMIST-FRASIMED", "distemist": "DISTEMIST-FRASIMED"}
ICD_O, SNOMED = "ICD-O-3.1", "SNOMED"


def top_codes(doc_codes: dict[str, set[str]], k: int) -> list[str]:
    """The k codes carried by the most documents (sorted), ranked as tabib ranks them: by frequency, then by the
    first name-sorted document carrying the code, then by code (ties only among codes first seen in one
    document, where tabib's order is a set's, not reproducible)."""
    frequency: Counter[str] = Counter()
    first_document: dict[str, int] = {}
    for index, doc in enumerate(sorted(doc_codes)):
        for code in doc_codes[doc]:
            frequency[code] += 1
            first_document.setdefault(code, index)
    ranked = sorted(frequency, key=lambda c: (-frequency[c], first_document[c], c))
    return sorted(ranked[:k])


def largest_remainder_counts(n: int, ratios=FRACCO_RATIOS) -> list[int]:
    """tabib's fracco._split_counts: floors, then one each to the largest fractional parts (stable order)."""
    exact = [n * r for r in ratios]
    counts = [int(x) for x in exact]
    by_fraction = sorted(range(len(ratios)), key=lambda i: exact[i] - math.floor(exact[i]), reverse=True)
    for i in range(n - sum(counts)):
        counts[by_fraction[i % len(by_fraction)]] += 1
    return counts


def floor_counts(n: int, ratios=RATIOS) -> list[int]:
    """tabib's frasimed._split_documents: int(0.8 n), int(0.1 n), the rest."""
    train, dev = int(n * ratios[0]), int(n * ratios[1])
    return [train, dev, n - train - dev]


def coded_splits(
    texts: dict[str, str], doc_codes: dict[str, set[str]], k: int, counts: Callable[[int], list[int]]
) -> dict[str, list[dict]]:
    """train / dev / test records {"id", "text", "labels"} (labels sorted) of the documents with a kept code."""
    valid = sorted(d for d in texts if doc_codes.get(d))
    kept = set(top_codes({d: doc_codes[d] for d in valid}, k))
    names = sorted(d for d in valid if doc_codes[d] & kept)
    random.Random(SPLIT_SEED).shuffle(names)
    n_train, n_dev, _ = counts(len(names))
    parts = {"train": names[:n_train], "dev": names[n_train : n_train + n_dev], "test": names[n_train + n_dev :]}
    return {
        split: [
            {"id": PurePosixPath(d).stem, "text": texts[d], "labels": sorted(doc_codes[d] & kept)}
            for d in parts[split]
        ]
        for split in SPLITS
    }


def write_splits(out: Path, splits: dict[str, list[dict]]) -> None:
    for split in SPLITS:
        write_jsonl(out / f"{split}.jsonl", splits[split])


# ------------------------------------------------------------------------------------------------ FRACCO


def fracco_documents(zip_path: Path) -> tuple[dict[str, str], dict[str, set[str]]]:
    texts, codes = {}, {}
    with zipfile.ZipFile(zip_path) as archive:
        names = archive.namelist()
        for name in names:
            if name.endswith(".txt") and FRACCO_TEXTS in name:
                texts[f"{PurePosixPath(name).stem}.ann"] = archive.read(name).decode("utf-8", errors="replace")
        tables = [n for n in names if PurePosixPath(n).name == FRACCO_CSV]
        if len(tables) != 1:
            raise SpecError(
                f"FRACCO.zip must hold one {FRACCO_CSV}",
                key="file",
                value=zip_path.name,
                allowed=f"FRACCO/{FRACCO_CSV}",
            )
        with archive.open(tables[0]) as f:
            for row in csv.DictReader(io.TextIOWrapper(f, encoding="utf-8-sig")):
                code, doc = (row.get("code") or "").strip(), (row.get("doc_name") or "").strip()
                if (row.get("label") or "").strip() == FRACCO_LABEL and code and doc:
                    codes.setdefault(doc, set()).add(code)
    return texts, codes


def convert_fracco(inputs: dict[str, Path], out: Path, ds, top_k: int) -> None:
    texts, codes = fracco_documents(inputs["FRACCO.zip"])
    write_splits(out, coded_splits(texts, codes, top_k, largest_remainder_counts))


# ---------------------------------------------------------------------------------------------- FRASIMED


def entity_codes(ann: str) -> list[dict[str, str]]:
    """Per entity (T line with a span, file order): code type -> code, from the `#` note lines."""
    entities, codes = [], {}
    for line in ann.splitlines():
        line = line.strip()
        parts = line.split("\t")
        if line.startswith("T") and len(parts) >= 3:
            if _has_span(parts[1]):
                entities.append(parts[0])
        elif line.startswith("#") and len(parts) >= 3 and len(info := parts[1].split()) >= 2:
            codes.setdefault(info[1], {})[info[0]] = parts[2]
    return [codes.get(t, {}) for t in dict.fromkeys(entities)]


def _has_span(type_and_span: str) -> bool:
    """tabib keeps an entity whose `TYPE START END[;START END]` field has a fragment of two fields or more."""
    span = " ".join(type_and_span.split()[1:])
    return any(len(fragment.split()) >= 2 for fragment in span.split(";"))


def read_text(archive: zipfile.ZipFile, member: str) -> str:
    """A member's text as Path.read_text gives a file's (UTF-8, errors replaced, universal newlines)."""
    with archive.open(member) as f:
        return io.TextIOWrapper(f, encoding="utf-8", errors="replace").read()


def frasimed_documents(zip_path: Path, subset: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Texts and code sets of the documents directly in the archive's `subset` folder, as tabib globs
    `<subset>/*.ann` (an `.ann` without its `.txt` skipped)."""
    with zipfile.ZipFile(zip_path) as archive:
        members = {PurePosixPath(n): n for n in archive.namelist() if PurePosixPath(n).parent.name == subset}
        anns = sorted((p for p in members if p.suffix == ".ann"), key=lambda p: p.name)
        if not anns:
            raise SpecError(f"the FRASIMED archive has no {subset}/*.ann", key="file", value=zip_path.name)
        texts, per_doc = {}, {}
        for ann in anns:
            txt = ann.with_suffix(".txt")
            if txt not in members:
                continue
            texts[ann.stem] = read_text(archive, members[txt])
            per_doc[ann.stem] = entity_codes(read_text(archive, members[ann]))
    code_type = next(
        (ICD_O if ICD_O in c else SNOMED for doc in per_doc.values() for c in doc if ICD_O in c or SNOMED in c),
        ICD_O if "CANTEMIST" in subset else SNOMED,
    )
    codes = {d: {c[code_type] for c in entities if c.get(code_type)} for d, entities in per_doc.items()}
    return texts, codes


def convert_frasimed(inputs: dict[str, Path], out: Path, ds, subset: str, top_k: int = 100) -> None:
    (archive,) = inputs.values()
    texts, codes = frasimed_documents(archive, FRASIMED_SUBSETS[subset])
    write_splits(out, coded_splits(texts, codes, top_k, floor_counts))
