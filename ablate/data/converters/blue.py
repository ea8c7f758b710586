"""BLUE's ChemProt (ncbi-nlp/BLUE_Benchmark release 0.1, `bert_data.zip`: bert_data/ChemProt/{train,dev,test}.tsv)
-> JSON lines {"id", "text", "label"}: one example per row, the chemical and the gene masked as BLUE wrote them
(@CHEMICAL$, @GENE$, @CHEM-GENE$ where they overlap), the label as BLUE wrote it (CPR:3, CPR:4, CPR:5, CPR:6,
CPR:9, or `false` for a pair without one of the five relations). Official splits.

The reading is BioClinical-ModernBERT's (lindvalllab/BioClinical-ModernBERT at fb40fb6,
src/dataloader/dataloader.py, `ChemProt.preprocess_data`): each TSV read by pandas.read_csv(sep="\t") with its
header (index, sentence, label), every row kept, in file order. BLUE writes one row per relation of a pair, so an
index repeats when a pair has two labels: the id of the k-th repeat (k >= 1) is `<index>#k`.

May import: config, data.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pandas as pd

from ablate.config.errors import SpecError
from ablate.data.converters.common import SPLITS, write_jsonl

CHEMPROT = "ChemProt/{split}.tsv"  # under the archive's top folder (bert_data/)
COLUMNS = ("index", "sentence", "label")


def chemprot_records(rows: pd.DataFrame) -> list[dict]:
    seen: dict[str, int] = {}
    records = []
    for index, sentence, label in zip(rows["index"].astype(str), rows["sentence"], rows["label"]):
        repeat = seen.get(index, 0)
        seen[index] = repeat + 1
        record_id = index if repeat == 0 else f"{index}#{repeat}"
        records.append({"id": record_id, "text": sentence, "label": str(label)})
    return records


def read_split(archive: zipfile.ZipFile, split: str, where: str) -> pd.DataFrame:
    suffix = CHEMPROT.format(split=split)
    members = [n for n in archive.namelist() if n == suffix or n.endswith("/" + suffix)]
    if len(members) != 1:
        raise SpecError(
            f"the archive holds {len(members)} files named {suffix}, expected one",
            file=where,
            key=split,
            value=suffix,
        )
    with archive.open(members[0]) as f:
        rows = pd.read_csv(f, sep="\t")
    if missing := [c for c in COLUMNS if c not in rows.columns]:
        raise SpecError(
            "BLUE's ChemProt TSV lacks a column",
            file=f"{where}:{members[0]}",
            key="header",
            value=", ".join(missing),
            allowed=", ".join(COLUMNS),
        )
    return rows


def convert_blue_chemprot(inputs: dict[str, Path], out: Path, ds) -> None:
    with zipfile.ZipFile(inputs["corpus"]) as archive:
        for split in SPLITS:
            rows = read_split(archive, split, str(inputs["corpus"]))
            write_jsonl(out / f"{split}.jsonl", chemprot_records(rows))
