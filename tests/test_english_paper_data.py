"""The paper's English clinical tasks (BioClinical-ModernBERT's suite): each converter on a small fixture in its
upstream's exact layout, written here (BLUE's ChemProt TSVs in bert_data.zip, the UW BioNLP BRAT zips, PhysioNet's
id.text / id.res records), checked against the harness's rules (tags, labels, masked entities, split sizes and
membership with seed 42), and each task file reading the converted files."""

import csv
import io
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from ablate.config.errors import SpecError
from ablate.data.converters import CONVERTERS
from ablate.data.converters import deid, uw_brat
from ablate.evaluate.tasks import load_task, load_task_data


def _zip(path: Path, files: dict[str, str | bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return path


def _convert(converter: str, inputs: dict[str, Path], root: Path, name: str) -> Path:
    out = root / name
    out.mkdir(parents=True)
    CONVERTERS[converter](inputs, out, SimpleNamespace(name=name))
    return out


def _conll(path: Path) -> list[list[tuple[str, str]]]:
    return [
        [tuple(line.split("\t")) for line in block.splitlines()]
        for block in path.read_text(encoding="utf-8").split("\n\n")
        if block.strip()
    ]


# ------------------------------------------------------------------------------------------------ ChemProt (BLUE)


def _blue_tsv(rows) -> str:
    f = io.StringIO()
    writer = csv.writer(f, delimiter="\t", lineterminator="\n")  # as BLUE's create_chemprot_bert.py writes
    writer.writerow(["index", "sentence", "label"])
    writer.writerows(rows)
    return f.getvalue()


CHEMPROT_TRAIN = [
    ("10064839.T1.T22", "@CHEMICAL$ inhibits the @GENE$ kinase .", "CPR:4"),
    ("10064839.T1.T22", "@CHEMICAL$ inhibits the @GENE$ kinase .", "CPR:9"),  # one pair, two relations
    ("10064839.T2.T22", 'The "active" @CHEMICAL$ binds @GENE$ .', "false"),  # a quote: BLUE's csv quotes it
    ("10076535.T3.T9", "@CHEM-GENE$ levels rose .", "CPR:3"),
    ("10076535.T4.T9", "@GENE$ is activated by @CHEMICAL$ .", "CPR:5"),
    ("10076535.T5.T9", "@CHEMICAL$ antagonises @GENE$ .", "CPR:6"),
]
CHEMPROT_EVAL = [
    ("1.T1.T2", "@CHEMICAL$ and @GENE$ .", "false"),
    ("1.T3.T2", "@CHEMICAL$ blocks @GENE$ .", "CPR:4"),
]


def test_blue_chemprot_keeps_every_row_its_masks_and_labels_and_the_task_reads_it(tmp_path):
    corpus = _zip(
        tmp_path / "bert_data.zip",
        {
            "bert_data/ChemProt/train.tsv": _blue_tsv(CHEMPROT_TRAIN),
            "bert_data/ChemProt/dev.tsv": _blue_tsv(CHEMPROT_EVAL),
            "bert_data/ChemProt/test.tsv": _blue_tsv(CHEMPROT_EVAL),
            "bert_data/ddi2013-type/train.tsv": _blue_tsv(CHEMPROT_EVAL),
        },
    )
    _convert("blue_chemprot", {"corpus": corpus}, tmp_path / "root", "chemprot_blue")

    data = load_task_data(load_task("chemprot_blue"), data_root=tmp_path / "root")
    train = data.splits["train"]
    assert [(e.text, e.label) for e in train] == [(s, label) for _, s, label in CHEMPROT_TRAIN]
    assert train[2].text == 'The "active" @CHEMICAL$ binds @GENE$ .'  # unquoted as pandas reads it
    assert [len(data.splits[s]) for s in ("train", "dev", "test")] == [6, 2, 2]
    assert data.labels == ("CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9", "false")
    ids = [
        line.split('"id": "')[1].split('"')[0]
        for line in (tmp_path / "root/chemprot_blue/train.jsonl").read_text().splitlines()
    ]
    assert ids[:2] == ["10064839.T1.T22", "10064839.T1.T22#1"] and len(set(ids)) == len(ids)


def test_blue_chemprot_archive_without_a_split_names_it(tmp_path):
    corpus = _zip(tmp_path / "bert_data.zip", {"bert_data/ChemProt/train.tsv": _blue_tsv(CHEMPROT_TRAIN)})
    with pytest.raises(SpecError) as e:
        _convert("blue_chemprot", {"corpus": corpus}, tmp_path, "chemprot_blue")
    assert e.value.key == "dev" and "ChemProt/dev.tsv" in e.value.message


# ------------------------------------------------------------------------------------------------ UW BRAT: COS


def _cos_file(snippets: list[str], entities: list[list[tuple[str, str]]]) -> tuple[str, str]:
    """A COS snippet file and its .ann: a Snippet annotation per line, then each snippet's (type, phrase)
    annotations at absolute offsets, plus an event, an attribute, a relation and an unread type."""
    txt, ann, start, t = "", [], 0, 1
    for snippet, spans in zip(snippets, entities):
        ann.append(f"T{t}\tSnippet {start} {start + len(snippet)}\t{snippet}")
        t += 1
        for kind, phrase in spans:
            at = start + snippet.index(phrase)
            ann.append(f"T{t}\t{kind} {at} {at + len(phrase)}\t{phrase}")
            t += 1
        txt += snippet + "\n"
        start += len(snippet) + 1
    ann += ["E1\tCos:T2 Theme:T3", "A1\tNegation E1", "R1\tLocation Arg1:T2 Arg2:T3"]
    return txt, "\n".join(ann) + "\n"


def _cos_corpus(tmp_path: Path) -> Path:
    first = _cos_file(
        ["Slight increase in left basilar opacity.", "No change in the effusion."],
        [
            [("Cos", "Slight increase"), ("Loc", "left basilar"), ("Ref", "opacity"), ("Attr", "Slight")],
            [("Cos", "No change"), ("Negation", "No"), ("Ref", "effusion")],
        ],
    )
    second = _cos_file(
        [f"Opacity {i} is stable, size 2cm." for i in range(8)],
        [[("Ref", "Opacity"), ("Cos", "stable"), ("Val", "2cm")]] * 8,
    )
    base = "events-COS-corpus/release_Jan_1_2015/"
    return _zip(
        tmp_path / "events-COS-corpus.zip",
        {
            base + "README.txt": "UW BHI BIONLP Change of State Event Corpus\n",
            base + "data/annotation.conf": "[entities]\nCos\n",
            base + "data/snippet1_100.txt": first[0],
            base + "data/snippet1_100.ann": first[1],
            base + "data/snippet101_200.txt": second[0],
            base + "data/snippet101_200.ann": second[1],
            "__MACOSX/" + base + "data/._snippet1_100.ann": b"\x00\x05\x16\x07",
        },
    )


def test_cos_examples_are_snippets_tagged_as_the_harness_tags_them():
    txt, ann = _cos_file(
        ["Slight increase in left basilar opacity."],
        [
            [
                ("Cos", "Slight increase"),
                ("Loc", "left basilar"),
                ("Ref", "opacity"),
                ("Negation", "left"),
                ("Attr", "Slight"),
            ]
        ],
    )
    [(tokens, tags)] = uw_brat.cos_examples(ann)
    assert tokens == ["Slight", "increase", "in", "left", "basilar", "opacity", "."]
    # Attr comes after Cos in the file: it overwrites the first tag; Negation is not one of the five types
    assert tags == ["B-Attr", "I-Cos", "O", "B-Loc", "I-Loc", "B-Ref", "O"]


def test_cos_converts_in_file_name_order_and_splits_as_datasets_does(tmp_path):
    datasets = pytest.importorskip("datasets")
    _convert("uw_brat", {"corpus": _cos_corpus(tmp_path)}, tmp_path / "root", "cos")
    out = tmp_path / "root/cos"
    splits = {s: _conll(out / f"{s}.tsv") for s in ("train", "dev", "test")}
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [7, 1, 2]  # 10 snippets: 70/15/15

    # the harness's order: snippet101_200.ann before snippet1_100.ann (sorted names), snippets in file order
    with zipfile.ZipFile(tmp_path / "events-COS-corpus.zip") as archive:
        examples = uw_brat.read_cos(archive, "cos")
    assert examples[0][0][:2] == ["Opacity", "0"] and examples[8][0][0] == "Slight"
    ds = datasets.Dataset.from_list([{"tokens": t, "ner_tags": g} for t, g in examples])
    first = ds.train_test_split(test_size=0.3, seed=42)
    second = first["test"].train_test_split(test_size=0.5, seed=42)
    expected = {"train": first["train"], "dev": second["train"], "test": second["test"]}
    for split, rows in expected.items():
        assert splits[split] == [list(zip(r["tokens"], r["ner_tags"])) for r in rows]

    data = load_task_data(load_task("cos"), data_root=tmp_path / "root")
    assert sum(len(data.splits[s]) for s in ("train", "dev", "test")) == 10
    assert {"B-Attr", "I-Cos", "B-Val"} <= {
        t for e in data.splits["train"] + data.splits["dev"] + data.splits["test"] for t in e.label
    }


def test_the_split_rule_matches_datasets_for_many_sizes():
    datasets = pytest.importorskip("datasets")
    for n in (4, 7, 10, 33, 100, 101):
        ds = datasets.Dataset.from_dict({"i": list(range(n))})
        first = ds.train_test_split(test_size=0.3, seed=42)
        second = first["test"].train_test_split(test_size=0.5, seed=42)
        assert uw_brat.hf_split(n) == {
            "train": first["train"]["i"],
            "dev": second["train"]["i"],
            "test": second["test"]["i"],
        }


def test_too_few_examples_to_split_is_a_clear_error():
    with pytest.raises(SpecError, match="cannot be split"):
        uw_brat.hf_split(2)


# ----------------------------------------------------------------------------------------- UW BRAT: Social History

SOCIAL = {
    "note01": (
        "He drinks beer\r\ndaily and smokes 1 pack.\r\n",
        [
            "T1\tAlcohol 3 14\tdrinks beer",
            "T2\tFrequency 15 20\tdaily",
            "T3\tTobacco 25 31\tsmokes",
            "T4\tAmount 32 38\t1 pack",
            "T5\tDrug 3 9;10 14\tdrinks beer",
            "E1\tAlcohol:T1 Frequency:T2",
            "A1\tStatus E1 current",
        ],
    ),
}


def _social_corpus(tmp_path: Path) -> Path:
    files = {"SocialHistoryMTSamples/README.txt": "Social history corpus\n"}
    for name, (text, ann) in SOCIAL.items():
        files[f"SocialHistoryMTSamples/{name}.txt"] = text.encode()
        files[f"SocialHistoryMTSamples/{name}.ann"] = "\n".join(ann) + "\n"
    for i in range(2, 11):
        files[f"SocialHistoryMTSamples/note{i:02d}.txt"] = f"Lives with wife {i} years."
        files[f"SocialHistoryMTSamples/note{i:02d}.ann"] = "T1\tLivingStatus 0 15\tLives with wife\n"
    return _zip(tmp_path / "SocialHistoryMTSamples.zip", files)


def test_social_history_tags_whitespace_tokens_on_text_read_with_universal_newlines():
    text, ann = SOCIAL["note01"]
    tokens, tags = uw_brat.social_history_example(text.replace("\r\n", "\n"), "\n".join(ann) + "\n")
    assert tokens == ["He", "drinks", "beer", "daily", "and", "smokes", "1", "pack."]
    # offsets count \r\n as one character; the discontinuous Drug annotation is skipped; "pack." ends after
    # "1 pack": not wholly inside it, O
    assert tags == ["O", "B-Alcohol", "I-Alcohol", "B-Frequency", "O", "B-Tobacco", "B-Amount", "O"]


def test_social_history_converts_pairs_only_and_the_task_reads_it(tmp_path):
    _convert("uw_brat", {"corpus": _social_corpus(tmp_path)}, tmp_path / "root", "social_history")
    out = tmp_path / "root/social_history"
    splits = {s: _conll(out / f"{s}.tsv") for s in ("train", "dev", "test")}
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [7, 1, 2]  # README.txt has no .ann: skipped
    by_position = uw_brat.hf_split(10)
    note01 = [s for s, rows in splits.items() if any(r[0] == ("He", "O") for r in rows)]
    assert note01 == [s for s, positions in by_position.items() if 0 in positions]  # note01 is first by name
    assert ("daily", "B-Frequency") in [pair for s in splits.values() for rows in s for pair in rows]

    data = load_task_data(load_task("social_history"), data_root=tmp_path / "root")
    assert [len(data.splits[s]) for s in ("train", "dev", "test")] == [7, 1, 2]


def test_uw_brat_refuses_a_dataset_it_has_no_reading_for(tmp_path):
    with pytest.raises(SpecError) as e:
        _convert("uw_brat", {"corpus": _social_corpus(tmp_path)}, tmp_path, "mimic")
    assert e.value.key == "converter" and "cos" in e.value.allowed


# ------------------------------------------------------------------------------------------------ PhysioNet deid


def _record(n: int, body: str) -> str:
    return f"START_OF_RECORD={n}||||1||||\n{body}\n||||END_OF_RECORD\n"


FIRST_TEXT = "Patient John Smith seen on 2-14.\nCall 555-1234 at Boston General."
FIRST_RES = (
    "Patient [**Known patient firstname**] [**Known patient lastname**] seen on [**2-14**].\n"
    "Call [**Telephone/Fax (1) 1234**] at [**Hospital 1**]."
)


def _deid_files(tmp_path: Path, extra_res: str = "[**Doctor Last Name**]") -> dict[str, Path]:
    text = _record(1, FIRST_TEXT) + "".join(_record(n, f"Note {n} by Dr Jones, age 91.") for n in range(2, 11))
    res = _record(1, FIRST_RES) + "".join(
        _record(n, f"Note {n} by {extra_res}, age [**Age over 90 **].") for n in range(2, 11)
    )
    (tmp_path / "id.text").write_text(text, encoding="utf-8")
    (tmp_path / "id.res").write_text(res, encoding="utf-8")
    return {"id.text": tmp_path / "id.text", "id.res": tmp_path / "id.res"}


def test_deid_record_tags_each_mask_span_of_the_original_by_its_category():
    tokens, tags = deid.record_example(_record(1, FIRST_TEXT), _record(1, FIRST_RES))
    assert tokens == [
        "Patient",
        "John",
        "Smith",
        "seen",
        "on",
        "2-14",
        ".",
        "Call",
        "555-1234",
        "at",
        "Boston",
        "General",
        ".",
    ]
    assert tags == [
        "O",
        "B-name",
        "B-name",
        "O",
        "O",
        "B-date",
        "O",
        "O",
        "B-phone_nb",
        "O",
        "B-location",
        "I-location",
        "O",
    ]


@pytest.mark.parametrize(
    "mask, category",
    [
        ("[**E-mail address 12**]", "other"),
        ("[**Pager number 3**]", "phone_nb"),
        ("[**Location (un) 5**]", "location"),
        ("[**Street Address 1**]", "location"),
        ("[**1959**]", "date"),
        ("[**2101-12-16**]", "date"),
        ("[**Date range (1) 7**]", "date"),
        ("[**Month/Year 2**]", "date"),
        ("[****]", "other"),
        ("[**Company 4**]", "other"),
        ("[**Hospital Unit Name 2**]", "name"),
        ("[**Serial Number 3**]", None),
    ],
)
def test_deid_mask_categories_follow_the_harness_rules_in_order(mask, category):
    assert deid.mask_category(mask) == category


def test_deid_converts_70_15_15_with_sklearn_seed_42_and_the_task_reads_it(tmp_path):
    from sklearn.model_selection import train_test_split

    _convert("physionet_deid", _deid_files(tmp_path), tmp_path / "root", "deid")
    out = tmp_path / "root/deid"
    splits = {s: _conll(out / f"{s}.tsv") for s in ("train", "dev", "test")}
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [7, 1, 2]
    notes = {s: sorted(int(rows[1][0]) if rows[0][0] == "Note" else 1 for rows in splits[s]) for s in splits}
    train, rest = train_test_split(list(range(1, 11)), test_size=0.30, random_state=42)
    dev, test = train_test_split(rest, test_size=0.50, random_state=42)
    assert notes == {"train": sorted(train), "dev": sorted(dev), "test": sorted(test)}
    [note2] = [rows for s in splits.values() for rows in s if rows[:2] == [("Note", "O"), ("2", "O")]]
    assert note2 == [
        ("Note", "O"),
        ("2", "O"),
        ("by", "O"),
        ("Dr", "B-name"),
        ("Jones", "I-name"),
        (",", "O"),
        ("age", "O"),
        ("91", "B-age"),
        (".", "O"),
    ]  # a mask ends where id.res's text resumes

    data = load_task_data(load_task("deid"), data_root=tmp_path / "root")
    assert {"B-name", "I-name", "B-age", "B-date", "B-phone_nb", "B-location", "I-location"} <= {
        t for s in data.splits.values() for e in s for t in e.label
    }


def test_deid_unmapped_mask_and_unpaired_records_are_clear_errors(tmp_path):
    with pytest.raises(SpecError) as e:
        _convert("physionet_deid", _deid_files(tmp_path, "[**Serial Number 3**]"), tmp_path / "a", "deid")
    assert e.value.value == "[**Serial Number 3**]" and "record 2" in e.value.file
    files = _deid_files(tmp_path)
    files["id.res"].write_text(files["id.res"].read_text().split("START_OF_RECORD=10")[0])
    with pytest.raises(SpecError, match="10 records and id.res 9"):
        _convert("physionet_deid", files, tmp_path / "b", "deid")


def test_deid_command_converts_downloaded_files_and_exits_2_on_a_missing_one(tmp_path, capsys):
    files = _deid_files(tmp_path)
    assert deid.main([str(files["id.text"]), str(files["id.res"]), str(tmp_path / "root/deid")]) == 0
    assert all((tmp_path / "root/deid" / f"{s}.tsv").is_file() for s in ("train", "dev", "test"))
    assert deid.main([str(tmp_path / "nothing"), str(files["id.res"]), str(tmp_path / "x")]) == 2
    assert "no such file" in capsys.readouterr().err
