"""E3C's French drug leaflets (CC-BY-NC, layer 3) -> corpus_fr_leaflets_e3c: the leaflets corpus_fr_e3c's extra
file does not hold, near-duplicates filtered, and leaflets sharing a distinctive word 8-gram with a QUAERO-EMEA
or Mantra GSC EMEA test sentence removed (those datasets are fetched first: `requires` in the catalogue).

1. every leaflet (whitespace collapsed, >= 200 characters, first of identical texts), less corpus_fr_e3c's
   extra ones (by id and by text), in id order, shuffled with random.Random(13);
2. in that order, a leaflet is kept when at least half of its characters are in sentences (split after
   . ! ? ; : followed by a space, and at " · " bullets; lower-cased) that no kept leaflet had; the share is
   doc_ids.tsv's novel_char_fraction;
3. the kept ones in id order, shuffled with random.Random(13): the first 5 % -> valid, the rest -> train;
4. a kept leaflet is removed (removed_for_test_overlap.tsv) when one of its word 8-grams (\\w+, lower-cased)
   is in a test sentence and occurs in fewer than 20 kept leaflets.

May import: data.
"""

from __future__ import annotations

import csv
import random
import re
from collections import Counter
from pathlib import Path

from ablate.data.converters.e3c_corpus import (
    LEAFLET_LICENCE,
    SHUFFLE_SEED,
    corpus_lines,
    e3c_documents,
    french_parts,
    shuffled_split,
)

SENTENCE_END = re.compile(r"(?<=[.!?;:]) | · ")
WORD = re.compile(r"\w+")
NOVEL_SHARE, NGRAM, DISTINCTIVE_BELOW = 0.5, 8, 20
TEST_SETS = ("quaero_emea", "mantragsc_fr_emea")


def new_leaflets(docs: list[dict]) -> list[tuple[dict, str]]:
    """Step 1: the leaflets corpus_fr_e3c did not use, in the order the filter reads them."""
    used = french_parts(docs)["extra"]
    used_ids, used_texts = {d["id"] for d, _ in used}, {line for _, line in used}
    fresh = [
        (d, line)
        for d, line in corpus_lines(docs, (LEAFLET_LICENCE,))
        if d["id"] not in used_ids and line not in used_texts
    ]
    random.Random(SHUFFLE_SEED).shuffle(fresh)
    return fresh


def novel_leaflets(leaflets: list[tuple[dict, str]]) -> list[tuple[dict, str, float]]:
    """Step 2: (leaflet, line, share of its characters in sentences no kept leaflet had) of the kept ones."""
    seen: set[str] = set()
    kept = []
    for doc, line in leaflets:
        sentences = [s.strip() for s in SENTENCE_END.split(line.lower())]
        share = sum(len(s) for s in sentences if s not in seen) / len(line)
        if share >= NOVEL_SHARE:
            kept.append((doc, line, share))
            seen.update(sentences)
    return kept


def _grams(text: str) -> set[tuple[str, ...]]:
    words = WORD.findall(text.lower())
    return {tuple(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


def sentence_grams_of(conll_files: list[Path]) -> set[tuple[str, ...]]:
    grams: set[tuple[str, ...]] = set()
    for path in conll_files:
        for sentence in path.read_text(encoding="utf-8").split("\n\n"):
            grams |= _grams(" ".join(line.split("\t")[0] for line in sentence.splitlines()))
    return grams


def overlapping(kept: list[tuple[dict, str, float]], test_grams: set) -> set[str]:
    """Step 4: ids of the kept leaflets sharing a distinctive 8-gram with a test sentence."""
    shared = {doc["id"]: _grams(line) & test_grams for doc, line, _ in kept}
    leaflets_with = Counter(g for grams in shared.values() for g in grams)
    return {doc_id for doc_id, grams in shared.items() if any(leaflets_with[g] < DISTINCTIVE_BELOW for g in grams)}


def convert_leaflets(inputs: dict[str, Path], out: Path, ds) -> None:
    kept = novel_leaflets(new_leaflets(e3c_documents(inputs["archive"], ds.archive)))
    removed = overlapping(kept, sentence_grams_of([inputs[name] / "test.tsv" for name in TEST_SETS]))
    share = {doc["id"]: s for doc, _, s in kept}
    parts = shuffled_split(
        sorted(((d, line) for d, line, _ in kept), key=lambda p: p[0]["id"]), random.Random(SHUFFLE_SEED)
    )
    with (
        open(out / "doc_ids.tsv", "w", encoding="utf-8", newline="") as ids,
        open(out / "removed_for_test_overlap.tsv", "w", encoding="utf-8", newline="") as gone,
    ):
        rows, gone_rows = (csv.writer(f, delimiter="\t", lineterminator="\n") for f in (ids, gone))
        rows.writerow(["split", "id", "url", "licence", "novel_char_fraction"])
        gone_rows.writerow(["id", "url"])
        for split, docs in parts.items():
            stay = [(d, line) for d, line in docs if d["id"] not in removed]
            (out / f"{split}.txt").write_text("".join(line + "\n" for _, line in stay), encoding="utf-8")
            rows.writerows([split, d["id"], d["url"], d["licence"], f"{share[d['id']]:.2f}"] for d, _ in stay)
            gone_rows.writerows([d["id"], d["url"]] for d, _ in docs if d["id"] in removed)
