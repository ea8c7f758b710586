"""BRAT stand-off files (a folder of <doc>.txt with <doc>.ann) -> span examples, as tabib's BRAT adapter reads
them (github Rian-T/tabib, src/tabib/data/brat.py at 16649393): `lines`, one example per non-empty line of each
document (its EMEA reading), or `documents`, one per document, the whole file (its MEDLINE reading). An
example's entities are (start, end, type) character offsets within it, nested, overlapping and repeated ones
all kept. A discontinuous entity (fragments `a b;c d`) is the span from its first fragment's start to its last
fragment's end (tabib's rule); read by lines, an entity that crosses a line break belongs to no line and is left
out (BratCounts says how many). Documents are in file-name order; a whitespace-only line or document is no
example.

May import: config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, NamedTuple

from ablate.config.errors import SpecError

Units = Literal["lines", "documents"]


class BratCounts(NamedTuple):
    entities: int  # T lines
    discontinuous: int  # of them, with more than one fragment
    kept: int  # in the examples
    across_lines: int  # left out: crossing a line break


def read_ann(path: Path) -> list[tuple[int, int, str, int]]:
    """The text-bound entities (T lines) of one .ann file as (start, end, type, fragments), fragments joined."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("T"):
            continue
        parts = line.split("\t")
        try:
            kind, where = parts[1].split(" ", 1)
            fragments = [tuple(map(int, f.split())) for f in where.split(";")]
            start, end = min(a for a, _ in fragments), max(b for _, b in fragments)
        except (IndexError, ValueError):
            raise SpecError("malformed BRAT entity line", file=str(path), key=f"line {n}", value=line) from None
        out.append((start, end, kind, len(fragments)))
    return out


def _pieces(text: str, units: Units) -> list[tuple[int, str]]:
    """(offset, text) of the document's examples before the whitespace-only ones are dropped."""
    if units == "documents":
        return [(0, text)]
    pieces, at = [], 0
    for line in text.split("\n"):
        pieces.append((at, line))
        at += len(line) + 1
    return pieces


def read_folder(
    folder: Path, units: Units = "lines"
) -> tuple[list[tuple[str, tuple[tuple[int, int, str], ...]]], BratCounts]:
    """Every document's examples as (text, spans), and the counts of what was kept."""
    examples, total, disc, kept = [], 0, 0, 0
    for txt in sorted(folder.glob("*.txt")):
        ann = txt.with_suffix(".ann")
        if not ann.is_file():
            raise SpecError("a BRAT text file has no .ann file beside it", file=str(txt))
        text = txt.read_text(encoding="utf-8")
        entities = read_ann(ann)
        total += len(entities)
        disc += sum(1 for *_, n in entities if n > 1)
        for at, piece in _pieces(text, units):
            end = at + len(piece)
            spans = tuple(sorted((s - at, e - at, k) for s, e, k, _ in entities if s >= at and e <= end))
            if piece.strip():
                examples.append((piece, spans))
                kept += len(spans)
    return examples, BratCounts(total, disc, kept, total - kept)
