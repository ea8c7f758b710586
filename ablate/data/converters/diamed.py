"""DiaMED (Hugging Face dataset Dr-BERT/DiaMED, data.zip): French clinical cases -> their ICD-10 chapter,
as the paper's harness reads them: tabib (Rian-T/tabib @ 16649393, src/tabib/data/diamed.py,
DiaMEDAdapter.load_splits) loads DrBenchmark/DiaMED, whose loader (github DrBenchmark/DrBenchmark,
data_loaders_hf/DiaMED.py, _generate_examples) reads splits/{train,validation,test}.json (a JSON list each) and
skips a case whose `icd-10` is "nan" or contains "Plusieurs cas cliniques" or "Aucune annotation"; tabib then
strips `clinical_case` and drops empty texts. Official splits (validation -> dev); label = the chapter name;
id = the case's `identifier` (else split-index).

May import: config, data.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path, PurePosixPath

from ablate.config.errors import SpecError
from ablate.data.converters.common import write_jsonl

SPLIT_FILES = {"train": "train.json", "dev": "validation.json", "test": "test.json"}
NOT_A_CHAPTER = ("Plusieurs cas cliniques", "Aucune annotation")  # skipped when the label contains one


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
        if not text or not label or label == "nan" or any(marker in label for marker in NOT_A_CHAPTER):
            continue
        records.append({"id": str(case.get("identifier") or f"{split}-{i}"), "text": text, "label": label})
    return records


def convert_diamed(inputs: dict[str, Path], out: Path, ds) -> None:
    with zipfile.ZipFile(inputs["data.zip"]) as archive:
        by_name = {
            PurePosixPath(n).name: n for n in archive.namelist() if PurePosixPath(n).parent.name == "splits"
        }
        for split, file in SPLIT_FILES.items():
            if file not in by_name:
                raise SpecError(
                    f"dataset {ds.name}: data.zip has no splits/{file}",
                    key="file",
                    value=file,
                    allowed=", ".join(sorted(by_name)) or "(no splits/ folder)",
                )
            cases = diamed_cases(archive.read(by_name[file]).decode("utf-8"))
            write_jsonl(out / f"{split}.jsonl", diamed_records(cases, split))
