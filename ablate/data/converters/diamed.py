"""DiaMED (Hugging Face dataset Dr-BERT/DiaMED, data.zip): French clinical cases -> their ICD-10 chapter,
as the paper's harness reads them (Rian-T/tabib @ 16649393, src/tabib/data/diamed.py, DiaMEDAdapter.load_splits):
the official splits (splits/{train,validation,test}.json -> train / dev / test), text = `clinical_case`
stripped, a case with an empty text or an empty label dropped, label = the `icd-10` chapter name. Cases
labelled "nan", "Plusieurs cas cliniques" or "Aucune annotation" are not among the 22 chapters tabib's label
space holds (its loader's class list) and are skipped.

May import: config, data.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path, PurePosixPath

from ablate.config.errors import SpecError
from ablate.data.converters.common import write_jsonl

SPLIT_FILES = {"train": "train.json", "dev": "validation.json", "test": "test.json"}
SKIPPED_LABELS = frozenset({"nan", "Plusieurs cas cliniques", "Aucune annotation"})


def diamed_cases(raw: str) -> list[dict]:
    """A split file's records: a JSON list, an object holding one under `data`, or JSON lines."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    if isinstance(parsed, dict):
        parsed = parsed.get("data", [parsed])
    return list(parsed)


def diamed_records(cases: list[dict], split: str) -> list[dict]:
    records = []
    for i, case in enumerate(cases):
        text = (case.get("clinical_case") or "").strip()
        label = str(case.get("icd-10") if case.get("icd-10") is not None else "").strip()
        if not text or not label or label in SKIPPED_LABELS:
            continue
        records.append({"id": str(case.get("id") or f"{split}-{i}"), "text": text, "label": label})
    return records


def convert_diamed(inputs: dict[str, Path], out: Path, ds) -> None:
    with zipfile.ZipFile(inputs["data.zip"]) as archive:
        by_name = {PurePosixPath(n).name: n for n in archive.namelist() if PurePosixPath(n).parent.name == "splits"}
        for split, file in SPLIT_FILES.items():
            if file not in by_name:
                raise SpecError(f"dataset {ds.name}: data.zip has no splits/{file}", key="file", value=file,
                                allowed=", ".join(sorted(by_name)) or "(no splits/ folder)")
            cases = diamed_cases(archive.read(by_name[file]).decode("utf-8"))
            write_jsonl(out / f"{split}.jsonl", diamed_records(cases, split))
