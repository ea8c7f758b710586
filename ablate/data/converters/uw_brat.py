"""The University of Washington BioNLP BRAT corpora of BioClinical-ModernBERT's English suite -> IOB2 CoNLL
train/dev/test.tsv ("token<TAB>tag", a blank line between examples), read and split exactly as that harness does
(lindvalllab/BioClinical-ModernBERT at fb40fb6, src/dataloader/dataloader.py):

- `cos` (events-COS-corpus.zip, release_Jan_1_2015/data/snippet*.ann): `COS.process_ann_only` and
  `COS.load_brat_as_dataset`. Only the .ann files are read, in name order. Each text-bound `Snippet` annotation is
  one example: its text is the one the .ann line copies (stripped), cut into `\\w+|[^\\w\\s]` tokens; every
  text-bound Cos, Ref, Loc, Attr or Val annotation inside the snippet's span tags the tokens wholly inside it
  (B- then I-; a later annotation overwrites an earlier one's tags, in file order). Events, relations and
  attributes (E, R, A lines) add no tags: the harness reads text-bound (T) lines only.
- `social_history` (SocialHistoryMTSamples.zip): `SocialHistory.parse_ann_file`, `process_pair` and
  `load_brat_as_dataset`. Each .txt with a .ann beside it is one example, in name order (a .txt without one is
  skipped), cut at whitespace; every text-bound annotation of any type with integer offsets (a discontinuous one
  is skipped) tags the tokens wholly inside it, annotations taken by start offset (ties in file order), later ones
  overwriting earlier ones.

Text is read as Python's text mode reads it (UTF-8, \\r\\n and \\r become \\n), as the harness's open() does. The
split is `datasets.Dataset.train_test_split(test_size=0.3, seed=42)`, then the 30% split again with
test_size=0.5, seed 42: its first half dev, its second test (`hf_split`, the same numpy permutations). Members
under __MACOSX/ and AppleDouble `._*` files are not corpus files. An example without any token cannot be written
as CoNLL: it is dropped after the split (it holds no entity, so entity F1 is the same).

May import: config, data.
"""

from __future__ import annotations

import io
import math
import re
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

import numpy as np

from ablate.config.errors import SpecError

SPLIT_SEED = 42
COS_TYPES = ("Attr", "Cos", "Loc", "Ref", "Val")
COS_TOKEN = re.compile(r"\w+|[^\w\s]")

Example = tuple[list[str], list[str]]  # tokens, IOB2 tags


# ------------------------------------------------------------------------------------------------ tagging


def bio_tags(spans: Sequence[tuple[int, int]], entities: Iterable[tuple[str, int, int]]) -> list[str]:
    """Tags of tokens at `spans` (start, end): each entity (type, start, end), in order, tags B-/I- the tokens
    wholly inside it, overwriting what an earlier entity set."""
    tags = ["O"] * len(spans)
    for kind, start, end in entities:
        inside = [i for i, (s, e) in enumerate(spans) if s >= start and e <= end]
        for n, i in enumerate(inside):
            tags[i] = f"{'B' if n == 0 else 'I'}-{kind}"
    return tags


def cos_examples(ann: str, where: str = "") -> list[Example]:
    """One example per Snippet annotation of a COS .ann file."""
    bound = []  # (type, start, end, the annotation's text field and after), file order
    for n, line in enumerate(io.StringIO(ann), 1):
        if not line.startswith("T"):
            continue
        rest = line.split("\t", 1)[1]
        fields = rest.split()
        if len(fields) < 4 or (fields[0] != "Snippet" and fields[0] not in COS_TYPES):
            continue
        try:
            bound.append((fields[0], int(fields[1]), int(fields[2]), rest))
        except ValueError:
            raise SpecError(
                "a COS annotation without integer offsets", file=where, key=f"line {n}", value=line.rstrip("\n")
            ) from None
    examples = []
    for kind, s_start, s_end, rest in bound:
        if kind != "Snippet":
            continue
        text = rest.split(None, 3)[-1].strip()
        matches = list(COS_TOKEN.finditer(text))
        inside = [
            (k, s - s_start, e - s_start) for k, s, e, _ in bound if k != "Snippet" and s >= s_start and e <= s_end
        ]
        examples.append(([m.group() for m in matches], bio_tags([m.span() for m in matches], inside)))
    return examples


def brat_entities(ann: str) -> list[tuple[str, int, int]]:
    """A Social History .ann file's text-bound annotations with integer offsets, by start offset."""
    entities = []
    for line in io.StringIO(ann):
        if not line.startswith("T"):
            continue
        parts = line.strip().split("\t")
        if len(parts) < 2 or len(meta := parts[1].split()) < 3:
            continue
        try:
            entities.append((meta[0], int(meta[1]), int(meta[2])))
        except ValueError:  # a discontinuous span, "10 15;20 25"
            continue
    return sorted(entities, key=lambda entity: entity[1])


def social_history_example(text: str, ann: str) -> Example:
    matches = list(re.finditer(r"\S+", text))
    return [m.group() for m in matches], bio_tags([m.span() for m in matches], brat_entities(ann))


# ------------------------------------------------------------------------------------------------ the archive


def corpus_files(archive: zipfile.ZipFile, where: str) -> dict[str, str]:
    """File name -> member of every corpus file in the archive (the folder the harness lists, flattened)."""
    files: dict[str, str] = {}
    for member in archive.namelist():
        path = PurePosixPath(member)
        if member.endswith("/") or "__MACOSX" in path.parts or path.name.startswith("._"):
            continue
        if path.name in files:
            raise SpecError(
                "two files of one name in the archive",
                file=where,
                key=path.name,
                value=f"{files[path.name]}, {member}",
            )
        files[path.name] = member
    return files


def read_text(archive: zipfile.ZipFile, member: str) -> str:
    with io.TextIOWrapper(archive.open(member), encoding="utf-8") as f:  # universal newlines, as open()
        return f.read()


def read_cos(archive: zipfile.ZipFile, where: str) -> list[Example]:
    files = corpus_files(archive, where)
    return [
        example
        for name in sorted(files)
        if name.endswith(".ann")
        for example in cos_examples(read_text(archive, files[name]), f"{where}:{files[name]}")
    ]


def read_social_history(archive: zipfile.ZipFile, where: str) -> list[Example]:
    files = corpus_files(archive, where)
    return [
        social_history_example(read_text(archive, files[name]), read_text(archive, files[name[:-4] + ".ann"]))
        for name in sorted(files)
        if name.endswith(".txt") and name[:-4] + ".ann" in files
    ]


READERS = {"cos": read_cos, "social_history": read_social_history}


# ------------------------------------------------------------------------------------------------ split, files


def train_test_positions(n: int, test_size: float, seed: int = SPLIT_SEED) -> tuple[list[int], list[int]]:
    """What datasets.Dataset.train_test_split(test_size=..., seed=...) keeps of n rows: (train, test) positions,
    in the order it selects them."""
    n_test = math.ceil(test_size * n)
    n_train = n - n_test
    if n_train <= 0 or n_test <= 0:
        raise SpecError(f"{n} examples cannot be split {1 - test_size:g}/{test_size:g}", key="split", value=n)
    permutation = np.random.default_rng(seed).permutation(n)
    return permutation[n_test : n_test + n_train].tolist(), permutation[:n_test].tolist()


def hf_split(n: int, seed: int = SPLIT_SEED) -> dict[str, list[int]]:
    """70/15/15 as the harness splits: 30% off for test, that 30% halved into dev (first) and test."""
    train, rest = train_test_positions(n, 0.3, seed)
    dev, test = train_test_positions(len(rest), 0.5, seed)
    return {"train": train, "dev": [rest[i] for i in dev], "test": [rest[i] for i in test]}


def conll_text(examples: Iterable[Example]) -> str:
    return "".join(
        "".join(f"{token}\t{tag}\n" for token, tag in zip(tokens, tags)) + "\n"
        for tokens, tags in examples
        if tokens
    )


def write_splits(examples: Sequence[Example], positions: dict[str, list[int]], out: Path) -> None:
    for split, indexes in positions.items():
        (out / f"{split}.tsv").write_text(conll_text(examples[i] for i in indexes), encoding="utf-8")


def convert_uw_brat(inputs: dict[str, Path], out: Path, ds) -> None:
    if ds.name not in READERS:
        raise SpecError(
            "no UW BRAT reading for this dataset", key="converter", value=ds.name, allowed=", ".join(READERS)
        )
    with zipfile.ZipFile(inputs["corpus"]) as archive:
        examples = READERS[ds.name](archive, str(inputs["corpus"]))
    write_splits(examples, hf_split(len(examples)), out)
