"""The BLURB-processed files of hieunguyen7337/KeBioLM (data/<TASK>/{train,dev,test}.tsv) -> the shipped forms:
JNLPBA's untyped B/I tags relabelled B-ENT/I-ENT with the -DOCSTART- lines gone; GAD, BIOSSES and HoC as
JSON lines (HoC: the sentence rows, and one abstract per line whose labels are the union of its sentences').

May import: data.
"""

from __future__ import annotations

import csv
from pathlib import Path

from ablate.data.converters.common import SPLITS, write_jsonl

HALLMARKS = (
    "activating invasion and metastasis",
    "avoiding immune destruction",
    "cellular energetics",
    "enabling replicative immortality",
    "evading growth suppressors",
    "genomic instability and mutation",
    "inducing angiogenesis",
    "resisting cell death",
    "sustaining proliferative signaling",
    "tumor promoting inflammation",
)


def tsv_rows(path: Path) -> list[dict[str, str]]:
    """A headed TSV whose fields are never quoted (BLURB's sentences hold bare quotes)."""
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def jnlpba_lines(text: str) -> str:
    """BLURB's JNLPBA CoNLL text -> token<TAB>B-ENT|I-ENT|O, documents' -DOCSTART- lines (and the blank line
    after each) removed, one blank line between sentences."""
    sentences, current = [], []
    for line in text.splitlines():
        if line.startswith("-DOCSTART-") or not line.strip():
            if current:
                sentences.append(current)
            current = []
            continue
        token, tag = line.split("\t")
        current.append(f"{token}\t{tag}-ENT" if tag in ("B", "I") else f"{token}\t{tag}")
    if current:
        sentences.append(current)
    return "".join("\n".join(s) + "\n\n" for s in sentences)


def convert_jnlpba(inputs: dict[str, Path], out: Path, ds) -> None:
    for split in SPLITS:
        (out / f"{split}.tsv").write_text(
            jnlpba_lines(inputs[split].read_text(encoding="utf-8")), encoding="utf-8"
        )


def gad_records(rows: list[dict[str, str]], split: str) -> list[dict]:
    return [{"id": f"{split}-{r['index']}", "text": r["sentence"], "label": int(r["label"])} for r in rows]


def convert_gad(inputs: dict[str, Path], out: Path, ds) -> None:
    for split in SPLITS:
        write_jsonl(out / f"{split}.jsonl", gad_records(tsv_rows(inputs[split]), split))


def biosses_records(rows: list[dict[str, str]]) -> list[dict]:
    return [
        {"id": r["pair_id"], "text_a": r["sent1"], "text_b": r["sent2"], "label": float(r["score"])} for r in rows
    ]


def convert_biosses(inputs: dict[str, Path], out: Path, ds) -> None:
    for split in SPLITS:
        write_jsonl(out / f"{split}.jsonl", biosses_records(tsv_rows(inputs[split])))


def hoc_sentences(rows: list[dict[str, str]]) -> list[dict]:
    """BLURB's rows (labels `0_0,1_1,...`, sentence, `<PMID>_s<k>`) as sentence records."""
    return [
        {
            "id": r["index"],
            "doc_id": r["index"].rsplit("_s", 1)[0],
            "text": r["sentence"],
            "labels": [int(pair.split("_")[1]) for pair in r["labels"].split(",")],
        }
        for r in rows
    ]


def hoc_abstracts(sentences: list[dict]) -> list[dict]:
    """One record per abstract, in order of first appearance: its sentences joined, the union of their labels."""
    docs: dict[str, dict] = {}
    for s in sentences:
        doc = docs.setdefault(s["doc_id"], {"id": s["doc_id"], "texts": [], "labels": [0] * len(HALLMARKS)})
        doc["texts"].append(s["text"])
        doc["labels"] = [max(a, b) for a, b in zip(doc["labels"], s["labels"])]
    return [
        {
            "id": d["id"],
            "text": " ".join(d["texts"]),
            "labels": d["labels"],
            "label_names": [HALLMARKS[i] for i, on in enumerate(d["labels"]) if on],
        }
        for d in docs.values()
    ]


def convert_hoc(inputs: dict[str, Path], out: Path, ds) -> None:
    for split in SPLITS:
        sentences = hoc_sentences(tsv_rows(inputs[split]))
        write_jsonl(out / f"{split}_sentences.jsonl", sentences)
        write_jsonl(out / f"{split}.jsonl", hoc_abstracts(sentences))
