"""Spans as the span model sees them, as pure functions, each as tabib's `bert_span_ner` has it (github
Rian-T/tabib, src/tabib/models/bert_span_ner.py at 16649393): an entity's sub-tokens (`entity_tokens`), the
spans one example trains on (`training_spans`), a predicted span's characters stripped of whitespace
(`stripped`) and the overlap filter of decoding (`drop_same_label_overlaps`). A token span is (first, last)
with `last` inclusive; a character span is [start, end).

May import: nothing of ablate.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence

NEGATIVES = 500  # tabib's negative_ratio -1: the first 500 negative spans of an example, left to right
MAX_SPANS = 512  # tabib's max_spans: what its collator keeps of an example's shuffled spans


def real_tokens(offsets: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """(first, stop) of the sub-tokens a span may hold: from position 1 (after [CLS]) up to the last one whose
    offsets are not (0, 0) (before [SEP]), tabib's valid_start / valid_end."""
    last = next((i for i in range(len(offsets) - 1, -1, -1) if tuple(offsets[i]) != (0, 0)), len(offsets) - 1)
    return 1, last + 1


def _char_to_token(offsets, first: int, stop: int, pos: int, text: str) -> int | None:
    """tabib's `_char_to_token` for the character `pos`: the longest sub-token holding it, else (a whitespace
    character) the first one starting after it, else the first one ending after it."""
    tokens = [i for i in range(first, stop) if tuple(offsets[i]) != (0, 0)]
    holding = [i for i in tokens if offsets[i][0] <= pos < offsets[i][1]]
    if holding:
        return max(holding, key=lambda i: offsets[i][1] - offsets[i][0])  # the first of the longest
    if pos < len(text) and text[pos].isspace():
        after = [i for i in tokens if offsets[i][0] > pos]
        if after:
            return after[0]
    return next((i for i in tokens if pos < offsets[i][1]), None)


def entity_tokens(
    offsets: Sequence[tuple[int, int]], text: str, start: int, end: int, first: int, stop: int
) -> tuple[int, int] | None:
    """The (first, last) sub-tokens tabib trains an entity [start, end) as; None when it has none (cut off by
    max_length). Its last sub-token is the one holding the character end - 2, not end - 1: tabib passes
    end - 1 to a lookup that steps back one more character for an end, so an entity whose last sub-token is a
    single character ("utérin" "##s") trains one sub-token short."""
    begin = _char_to_token(offsets, first, stop, start, text)
    last = _char_to_token(offsets, first, stop, end - 2 if end > 1 else end - 1, text)
    if begin is None or last is None or begin > last:
        return None
    return begin, last


def training_spans(
    positives: Sequence[tuple[int, int, int]],
    first: int,
    stop: int,
    max_width: int,
    negatives: int = NEGATIVES,
    cap: int = MAX_SPANS,
) -> list[tuple[int, int, int]]:
    """The (first, last, label) spans one example trains on (label 0: none), as tabib's `_prepare_spans` and
    collator give them: every positive (duplicates kept), then the first `negatives` spans of at most
    `max_width` sub-tokens that are no positive, left to right (by start, then end); shuffled and cut to `cap`.
    The shuffle is seeded by the positives and the sub-token range, so an example keeps the same spans from
    one pass to the next (tabib shuffles once, with the run's random state)."""
    taken = {(s, e) for s, e, _ in positives}
    in_order = ((s, e) for s in range(first, stop) for e in range(s, min(s + max_width, stop)))
    others = itertools.islice((span for span in in_order if span not in taken), negatives)
    chosen = [*positives, *((s, e, 0) for s, e in others)]
    if not chosen:
        return [(first, first, 0)]
    random.Random(f"{first}:{stop}:{sorted(positives)}").shuffle(chosen)
    return chosen[:cap]


def stripped(text: str, start: int, end: int) -> tuple[int, int]:
    """[start, end) without its leading and trailing whitespace (tabib's `_normalize_char_offsets`): tokenizers
    whose offsets hold the space before a word (a byte-level BPE without offset trimming) would otherwise never
    give a span its gold start."""
    while start < end and start < len(text) and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def drop_same_label_overlaps(scored: Iterable[tuple[float, int, int, str]]) -> list[tuple[int, int, str]]:
    """(score, start, end, label) candidates -> the spans kept, as tabib's no_overlapping_same_label filter:
    by score, then length, both descending (ties keep the candidates' order), each kept if no kept span of its
    label overlaps it; spans of different labels may nest or overlap. In order."""
    candidates = sorted(scored, key=lambda c: (-c[0], c[1] - c[2]))
    size = max((e for _, _, e, _ in candidates), default=0)
    taken: dict[str, bytearray] = {}  # label -> the characters its kept spans cover
    kept: list[tuple[int, int, str]] = []
    for _, s, e, lab in candidates:
        used = taken.setdefault(lab, bytearray(size))
        if not any(used[s:e]):
            used[s:e] = b"\x01" * (e - s)
            kept.append((s, e, lab))
    return sorted(kept)
