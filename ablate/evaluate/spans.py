"""Spans as the span model sees them, as pure functions: BIOUL tags of one label's spans and back, sub-token
spans of character spans (and back), and the overlap filter its decoding applies. A span is (start, end,
label) with `end` inclusive for token positions and exclusive for characters.

May import: nothing of ablate.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

O, B, I, L, U = range(5)  # BIOUL: outside, begin, inside, last, unit (a one-token span)
BIOUL = "OBILU"


def non_overlapping(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans a single tag sequence can hold: longest first (then leftmost), each kept if it overlaps none
    kept before; in order. (A tag sequence cannot nest; the biaffine scorer still sees every span.)"""
    kept: list[tuple[int, int]] = []
    for s, e in sorted(set(spans), key=lambda se: (se[0] - se[1], se[0])):
        if all(e < ks or s > ke for ks, ke in kept):
            kept.append((s, e))
    return sorted(kept)


def bioul_tags(spans: Iterable[tuple[int, int]], length: int) -> list[int]:
    """One label's BIOUL tags over `length` positions: its non-overlapping spans (inclusive ends)."""
    tags = [O] * length
    for s, e in non_overlapping(spans):
        if s == e:
            tags[s] = U
        else:
            tags[s], tags[e] = B, L
            tags[s + 1 : e] = [I] * (e - s - 1)
    return tags


def bioul_spans(tags: Sequence[int]) -> list[tuple[int, int]]:
    """The spans of a BIOUL tag sequence (a B without its L, or an I or L without a B, is no span)."""
    spans, start = [], None
    for pos, t in enumerate(tags):
        if t == U:
            spans.append((pos, pos))
            start = None
        elif t == B:
            start = pos
        elif t == L and start is not None:
            spans.append((start, pos))
            start = None
        elif t == O:
            start = None
    return spans


def token_span(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """The sub-tokens (first, last) covering characters [start, end), special tokens ((0, 0)) left out; None
    when no kept sub-token overlaps them (cut off by max_length)."""
    inside = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
    return (inside[0], inside[-1]) if inside else None


def char_span(offsets: Sequence[tuple[int, int]], first: int, last: int) -> tuple[int, int]:
    return offsets[first][0], offsets[last][1]


def drop_same_label_overlaps(scored: Iterable[tuple[float, int, int, str]]) -> list[tuple[int, int, str]]:
    """(score, start, end, label) candidates -> the spans kept, highest score first (then longest), each kept
    if no kept span of its label overlaps it; spans of different labels may nest or overlap. In order."""
    candidates = sorted(scored, key=lambda c: (-c[0], c[1] - c[2], c[1], c[3]))
    size = max((e for _, _, e, _ in candidates), default=0)
    taken: dict[str, bytearray] = {}  # label -> the characters its kept spans cover
    kept: list[tuple[int, int, str]] = []
    for _, s, e, lab in candidates:
        used = taken.setdefault(lab, bytearray(size))
        if not any(used[s:e]):
            used[s:e] = b"\x01" * (e - s)
            kept.append((s, e, lab))
    return sorted(kept)
