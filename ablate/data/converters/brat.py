"""BRAT annotations (text + .ann) -> flat IOB2 NER: QUAERO (CLEF eHealth release) and Mantra GSC French.

Tokens are the Unicode regex \\w+|[^\\w\\s] over the raw text. Nested and multi-label entities are flattened
keeping the longest spans first (ties: earlier start, then annotation order) and dropping any span that
overlaps a kept one; each fragment of a discontinuous entity is its own span; a token partly covered by a
span belongs to it. QUAERO-MEDLINE and Mantra: one file = one sentence; QUAERO-EMEA: split at newlines and
after . ? ! (never inside an entity). Mantra's type is a CUI: its semantic group comes from the
AnnotatorNotes line; its split is derived (file ids sorted, shuffled with random.Random(4), 70/10/20 %;
each split in id order).

May import: data.
"""

from __future__ import annotations

import random
import re
import zipfile
from pathlib import Path

from ablate.data.converters.e3c_corpus import archive_members

TOKEN = re.compile(r"\w+|[^\w\s]")
QUOTED = re.compile(r'"([^"]*)"')
GROUPS = {"ANAT", "CHEM", "DEVI", "DISO", "GEOG", "LIVB", "OBJC", "PHEN", "PHYS", "PROC"}
QUAERO = "CLEF_2017/dataset/corpus/"
QUAERO_README = "CLEF_2017/dataset/README.txt"
MANTRA = "Mantra-GSC/French/"
MANTRA_FOLDERS = {
    "mantragsc_fr_emea": "EMEA_ec22-cui-best_man",
    "mantragsc_fr_medline": "Medline_EN_FR_ec22-cui-best_man",
    "mantragsc_fr_patents": "Patents_ec22-cui-best_man",
}
MANTRA_SEED, MANTRA_SHARES = 4, (0.7, 0.1)


def brat_spans(ann: str, kinds: dict[str, str] | None = None) -> list[tuple[int, int, str, int]]:
    """(start, end, type, annotation order) of every fragment of every text-bound annotation; `kinds`:
    annotation id -> the type to use instead of the written one."""
    spans = []
    for order, line in enumerate(ann.splitlines()):
        if line.startswith("T"):
            tid, info = line.split("\t")[:2]
            kind, offsets = info.split(" ", 1)
            kind = (kinds or {}).get(tid, kind)
            spans += [(int(a), int(b), kind, order) for a, b in (f.split() for f in offsets.split(";"))]
    return spans


def flatten(spans: list[tuple[int, int, str, int]]) -> list[tuple[int, int, str, int]]:
    kept: list[tuple[int, int, str, int]] = []
    for span in sorted(spans, key=lambda s: (s[0] - s[1], s[0], s[3])):
        if all(span[1] <= k[0] or k[1] <= span[0] for k in kept):
            kept.append(span)
    return sorted(kept)


def tagged_tokens(text: str, spans) -> list[tuple[str, str, int, int]]:
    """(token, IOB2 tag, start, end) over the text, the flattened spans as entities."""
    tokens = [(m.group(), m.start(), m.end()) for m in TOKEN.finditer(text)]
    tags = ["O"] * len(tokens)
    for start, end, kind, _ in flatten(spans):
        covered = [j for j, (_, s, e) in enumerate(tokens) if s < end and e > start and tags[j] == "O"]
        for n, j in enumerate(covered):
            tags[j] = f"{'B' if n == 0 else 'I'}-{kind}"
    return [(w, t, s, e) for (w, s, e), t in zip(tokens, tags)]


def emea_sentences(text: str, tokens: list[tuple[str, str, int, int]]) -> list[list[tuple[str, str]]]:
    sentences, current = [], []
    for j, (word, tag, _, end) in enumerate(tokens):
        current.append((word, tag))
        following = tokens[j + 1] if j + 1 < len(tokens) else None
        inside = following is not None and following[1].startswith("I-")
        newline = following is not None and "\n" in text[end : following[2]]
        if not inside and (word in ".?!" or newline):
            sentences.append(current)
            current = []
    return sentences + ([current] if current else [])


def conll_text(sentences) -> str:
    return "".join("".join(f"{w}\t{t}\n" for w, t in s) + "\n" for s in sentences if s)


def convert_quaero(inputs: dict[str, Path], out: Path, ds) -> None:
    corpus = ds.name.removeprefix("quaero_").upper()
    files = dict(archive_members(inputs["archive"], ds.archive))
    for split in ("train", "dev", "test"):
        prefix, sentences = f"{QUAERO}{split}/{corpus}/", []
        for name in sorted(p for p in files if p.startswith(prefix) and p.endswith(".txt")):
            text = files[name].decode("utf-8")
            tokens = tagged_tokens(text, brat_spans(files[name[:-4] + ".ann"].decode("utf-8")))
            sentences += emea_sentences(text, tokens) if corpus == "EMEA" else [[(w, t) for w, t, _, _ in tokens]]
        (out / f"{split}.tsv").write_text(conll_text(sentences), encoding="utf-8")


def convert_quaero_brat(inputs: dict[str, Path], out: Path, ds) -> None:
    """QUAERO's BRAT release as the repository has it (nested and discontinuous entities untouched), for the span
    model: {train,dev,test}/{EMEA,MEDLINE}/*.{txt,ann} and the release's README.txt; editor backups (*.ann~)
    left out."""
    for path, data in archive_members(inputs["archive"], ds.archive):
        if path.startswith(QUAERO) and path.endswith((".txt", ".ann")):
            target = out / path.removeprefix(QUAERO)
        elif path == QUAERO_README:
            target = out / "README.txt"
        else:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def mantra_group(note: str) -> str:
    """The semantic group of an AnnotatorNotes line: its last quoted field (of `A|B`, A), or, where that is
    a type name, the last group code quoted before it."""
    for field in reversed(QUOTED.findall(note)):
        code = field.split("|")[0]
        if code in GROUPS:
            return code
    raise ValueError(f"no semantic group in the note {note!r}")


def mantra_spans(ann: str) -> list[tuple[int, int, str, int]]:
    """The spans, each typed by the semantic group of its note (`#n AnnotatorNotes Tk <note>`)."""
    notes = [line.split("\t", 2) for line in ann.splitlines() if line.startswith("#")]
    return brat_spans(ann, {target.split()[1]: mantra_group(note) for _, target, note in notes})


def mantra_split(ids: list[str]) -> dict[str, list[str]]:
    shuffled = sorted(ids)
    random.Random(MANTRA_SEED).shuffle(shuffled)
    n_train, n_dev = int(len(shuffled) * MANTRA_SHARES[0]), int(len(shuffled) * MANTRA_SHARES[1])
    parts = {
        "train": shuffled[:n_train],
        "dev": shuffled[n_train : n_train + n_dev],
        "test": shuffled[n_train + n_dev :],
    }
    return {split: sorted(ids) for split, ids in parts.items()}


def convert_mantra(inputs: dict[str, Path], out: Path, ds) -> None:
    folder = f"{MANTRA}{MANTRA_FOLDERS[ds.name]}/"
    with zipfile.ZipFile(inputs["corpus"]) as archive:
        units = {
            n[len(folder) : -4]: (archive.read(n).decode("utf-8"), archive.read(n[:-4] + ".ann").decode("utf-8"))
            for n in archive.namelist()
            if n.startswith(folder) and n.endswith(".txt")
        }
    for split, ids in mantra_split(list(units)).items():
        (out / f"{split}_ids.txt").write_text("".join(i + "\n" for i in ids), encoding="utf-8")
        sentences = [[(w, t) for w, t, _, _ in tagged_tokens(units[i][0], mantra_spans(units[i][1]))] for i in ids]
        (out / f"{split}.tsv").write_text(conll_text(sentences), encoding="utf-8")
