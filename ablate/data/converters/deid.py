"""PhysioNet "Deidentified Medical Text" 1.0 (id.text: the nursing notes; id.res: the same notes with each PHI
phrase replaced by a `[**...**]` mask) -> IOB2 CoNLL train/dev/test.tsv, one example per record, exactly as
BioClinical-ModernBERT reads and splits it (lindvalllab/BioClinical-ModernBERT at fb40fb6,
src/dataloader/dataloader.py, class `DEID`: `load_records`, `process_record`, `map_mask`, `preprocess_data`):

- records: every `START_OF_RECORD=...||||END_OF_RECORD` of each file, paired in file order (files whose record
  counts differ, which the harness only warns about, are an error here);
- a record: both markers removed, the leading `<patient>||||<note>||||` header removed, stripped, newlines made
  spaces; id.res cut into plain text and masks; plain text is whitespace tokens tagged O (the position in id.text
  moves on by the plain text's length); a mask covers id.text from there to where the next plain text is found
  (the end of the note when it is not found or there is none): its whitespace tokens are B-/I-<category>;
- a mask's category (`map_mask`, first rule that holds, on the mask's content, lowercased for the word tests):
  "name" -> name; "e-mail address"/"email address" -> other; "telephone/fax"/"pager number" -> phone_nb;
  "age over" -> age; "location", "hospital", "street address", "unit number" -> location; digits only, d-d or
  dd-dd, four digits, dddd-dd-dd, "date range", "month/year" -> date; empty or "company" -> other. A mask no rule
  maps is an error here (the harness would stop on its tag, which is none of its 13 labels);
- split: sklearn.model_selection.train_test_split(test_size=0.30, random_state=42), then the 30% again with
  test_size=0.50, random_state=42 (dev, then test): 70/15/15.

The data is credentialed on PhysioNet (an account, CITI training, the data use agreement): it cannot be fetched;
a user with access converts the two files they downloaded with
`python -m ablate.data.converters.deid ID_TEXT ID_RES OUT_FOLDER` (docs/tasks.md, "deid").

May import: config, data.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ablate.config.errors import SpecError
from ablate.data.converters.uw_brat import SPLIT_SEED, Example, write_splits

RECORD = re.compile(r"START_OF_RECORD=.*?\|\|\|\|END_OF_RECORD", re.DOTALL)
HEADER = re.compile(r"^\d+\|\|\|\|\d+\|\|\|\|")
MASK = re.compile(r"(\[\*\*.*?\*\*\])")
MARKERS = ("START_OF_RECORD=", "||||END_OF_RECORD")
DATE_FORMS = (
    re.compile(r"\d+"),
    re.compile(r"\d{1,2}-\d{1,2}"),
    re.compile(r"\d{4}"),
    re.compile(r"\d{4}-\d{2}-\d{2}"),
)
CATEGORIES = ("age", "date", "location", "name", "other", "phone_nb")


def records(text: str) -> list[str]:
    return RECORD.findall(text)


def mask_category(mask: str) -> str | None:
    content = mask[3:-3].strip()
    words = content.lower()
    if "name" in words:
        return "name"
    if "e-mail address" in words or "email address" in words:
        return "other"
    if "telephone/fax" in words or "pager number" in words:
        return "phone_nb"
    if "age over" in words:
        return "age"
    if any(word in words for word in ("location", "hospital", "street address", "unit number")):
        return "location"
    if any(form.fullmatch(content) for form in DATE_FORMS) or "date range" in words or "month/year" in words:
        return "date"
    if content == "" or "company" in words:
        return "other"
    return None


def note_body(record: str) -> str:
    for marker in MARKERS:
        record = record.replace(marker, "")
    return HEADER.sub("", record).strip().replace("\n", " ")


def record_example(original: str, masked: str, where: str = "") -> Example:
    """A record of id.text and the same record of id.res -> (tokens of id.text, their tags)."""
    text, segments = note_body(original), MASK.split(note_body(masked))
    tokens, tags, at = [], [], 0
    for i, segment in enumerate(segments):
        if i % 2 == 0:
            words = segment.split()
            tokens += words
            tags += ["O"] * len(words)
            at += len(segment)
            continue
        if (category := mask_category(segment)) is None:
            raise SpecError(
                "a PHI mask that maps to none of the categories",
                file=where,
                key="mask",
                value=segment,
                allowed=", ".join(CATEGORIES),
            )
        following = segments[i + 1] if i + 1 < len(segments) else ""
        end = text.find(following, at) if following else -1
        end = len(text) if end == -1 else end
        words = text[at:end].split()
        tokens += words
        tags += [f"{'B' if n == 0 else 'I'}-{category}" for n in range(len(words))]
        at = end
    return tokens, tags


def deid_examples(id_text: str, id_res: str, where: str = "") -> list[Example]:
    return [
        record_example(original, masked, f"{where} record {n}")
        for n, (original, masked) in enumerate(zip(records(id_text), records(id_res)), 1)
    ]


def deid_split(n: int) -> dict[str, list[int]]:
    from sklearn.model_selection import train_test_split  # here: importing sklearn takes a second

    train, rest = train_test_split(list(range(n)), test_size=0.30, random_state=SPLIT_SEED)
    dev, test = train_test_split(rest, test_size=0.50, random_state=SPLIT_SEED)
    return {"train": train, "dev": dev, "test": test}


def read_note_file(path: Path) -> str:
    with open(path, encoding="utf-8") as f:  # text mode, as the harness reads it
        return f.read()


def convert_physionet_deid(inputs: dict[str, Path], out: Path, ds) -> None:
    id_text, id_res = read_note_file(inputs["id.text"]), read_note_file(inputs["id.res"])
    count_text, count_res = len(records(id_text)), len(records(id_res))
    if count_text != count_res:
        raise SpecError(
            f"id.text holds {count_text} records and id.res {count_res}: they must pair one to one",
            file=str(inputs["id.res"]),
            key="records",
            value=count_res,
        )
    examples = deid_examples(id_text, id_res, str(inputs["id.res"]))
    write_splits(examples, deid_split(len(examples)), out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ablate.data.converters.deid",
        description="PhysioNet deidentifiedmedicaltext 1.0 -> the deid task's files",
    )
    parser.add_argument("id_text", type=Path, help="id.text as downloaded from PhysioNet")
    parser.add_argument("id_res", type=Path, help="id.res as downloaded from PhysioNet")
    parser.add_argument(
        "out",
        type=Path,
        help="the folder to write train/dev/test.tsv into ($ABLATE_DATA_ROOT/deid for the task file)",
    )
    args = parser.parse_args(argv)
    try:
        for path in (args.id_text, args.id_res):
            if not path.is_file():
                name = "id.text" if path is args.id_text else "id.res"
                raise SpecError("no such file", key=name, value=str(path))
        args.out.mkdir(parents=True, exist_ok=True)
        convert_physionet_deid({"id.text": args.id_text, "id.res": args.id_res}, args.out, None)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(args.out / f'{s}.tsv') for s in ('train', 'dev', 'test'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
