"""The needle in a haystack as ablate generates it (ablate/data/needle, converter needle): the same seed gives
the same bytes (those the manifest records), every (length, position) cell equally filled with both labels and
split 70/15/15, a distractor is the needle's template with every slot changed, the needle sits where its record
says, haystacks hold their word budget, no train split is read, and the task files and `ablate data fetch` read
and build it from the data root's corpora."""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from pathlib import Path

import pytest
import yaml

from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.data.catalog import dataset, dataset_problems, sha256_of, with_requirements
from ablate.data.converters.needle import convert_needle, held_out_documents, needle_settings
from ablate.data.needle.generate import POSITIONS, TOKENS_PER_WORD, TOLERANCE, generate, read_settings, word_budget
from ablate.data.needle.templates import TEMPLATES, Template
from ablate.evaluate.tasks import load_task, load_task_data

SPLITS = ("train", "dev", "test")
CPU = "needle_fr_cpu"


def _generated(root: Path, name: str, data_root: Path) -> Path:
    ds = dataset(name)
    out = root / name
    out.mkdir(parents=True)
    convert_needle({req: data_root / req for req in ds.requires}, out, ds)
    return out


def _records(folder: Path) -> dict[str, list[dict]]:
    return {s: [json.loads(line) for line in (folder / f"{s}.jsonl").open(encoding="utf-8")] for s in SPLITS}


@pytest.fixture(scope="module")
def cpu_set(tmp_path_factory, data_root) -> Path:
    return _generated(tmp_path_factory.mktemp("needle"), CPU, data_root)


@pytest.fixture(scope="module")
def cpu_records(cpu_set) -> dict[str, list[dict]]:
    return _records(cpu_set)


def _pattern(template: Template) -> re.Pattern:
    """The template's sentence with each slot a named group of its lexicon's values."""
    lexicon = dict(template.slots)
    parts = [
        re.escape(text) + (f"(?P<{slot}>{'|'.join(map(re.escape, lexicon[slot]))})" if slot else "")
        for text, slot, _, _ in string.Formatter().parse(template.text)
    ]
    return re.compile("".join(parts))


def _needle(record: dict, language: str = "fr") -> re.Match:
    """The one sentence of the record's template in its text (the needle)."""
    template = next(t for t in TEMPLATES[language] if t.name == record["template"])
    found = list(_pattern(template).finditer(record["text"]))
    assert len(found) == 1, record["id"]
    return found[0]


def test_the_same_seed_gives_the_manifests_bytes_and_another_seed_other_records(tmp_path, cpu_set, data_root):
    again = _generated(tmp_path, CPU, data_root)
    assert all((again / f"{s}.jsonl").read_bytes() == (cpu_set / f"{s}.jsonl").read_bytes() for s in SPLITS)
    assert dataset_problems(cpu_set, dataset(CPU)) == []  # size and sha256 as manifest.tsv has them
    settings = needle_settings(CPU)
    documents = held_out_documents([data_root / req for req in dataset(CPU).requires])
    other = generate(documents, settings.model_copy(update={"seed": settings.seed + 1}), CPU)
    shipped = _records(cpu_set)
    assert [r["text"] for r in other["test"]] != [r["text"] for r in shipped["test"]]
    assert {len(v) for v in other.values()} == {len(v) for v in shipped.values()}


def test_every_cell_holds_both_labels_equally_split_70_15_15(cpu_records):
    cells = Counter(
        (r["length"], r["position"], r["label"], split) for split, records in cpu_records.items() for r in records
    )
    assert {(length, position) for length, position, _, _ in cells} == {
        (n, p) for n in (512, 1024) for p in POSITIONS
    }
    for length in (512, 1024):
        for position in POSITIONS:
            by_label = {
                label: sum(cells[(length, position, label, s)] for s in SPLITS) for label in ("present", "absent")
            }
            assert by_label == {"present": 50, "absent": 50}
            assert [sum(cells[(length, position, label, s)] for label in by_label) for s in SPLITS] == [70, 15, 15]
            assert cells[(length, position, "present", "train")] == 35
    assert [len(cpu_records[s]) for s in SPLITS] == [420, 90, 90]
    assert Counter(r["label"] for r in cpu_records["dev"]) == {"present": 45, "absent": 45}
    assert len({r["template"] for r in cpu_records["train"]}) == 8
    assert len({r["id"] for records in cpu_records.values() for r in records}) == 600


def test_the_query_is_the_needle_or_its_template_with_every_slot_changed(cpu_records):
    for record in (r for records in cpu_records.values() for r in records):
        needle = _needle(record)
        if record["label"] == "present":
            assert record["text_pair"] == needle.group(0)
            continue
        template = next(t for t in TEMPLATES["fr"] if t.name == record["template"])
        query = _pattern(template).fullmatch(record["text_pair"])
        assert query is not None and record["text_pair"] not in record["text"]
        assert all(query.group(slot) != needle.group(slot) for slot, _ in template.slots), record["id"]


def test_the_needle_sits_at_its_position_on_a_sentence_boundary_and_lengths_hold_their_budget(cpu_records):
    for record in (r for records in cpu_records.values() for r in records):
        needle, text, words = _needle(record), record["text"], record["words"]
        assert len(text[: needle.start()].split()) == record["needle_word"]
        assert words == len(text.split())
        budget = word_budget(record["length"], "fr")
        assert (1 - TOLERANCE) * budget <= words <= budget
        if record["position"] == "start":
            assert needle.start() == 0
        elif record["position"] == "end":
            assert needle.end() == len(text) and text[needle.start() - 2] in ".!?"
        else:
            assert 1 / 3 <= record["needle_word"] / words <= 2 / 3
            assert text[needle.start() - 2] in ".!?" and text[needle.end()] == " "


def test_only_the_valid_splits_are_read(tmp_path, cpu_set, data_root):
    """Other train.txt files change nothing and none of their text reaches the records."""
    root = tmp_path / "root"
    for req in dataset(CPU).requires:
        (root / req).mkdir(parents=True)
        (root / req / "valid.txt").write_bytes((data_root / req / "valid.txt").read_bytes())
        (root / req / "train.txt").write_text("Phrase témoin du train. " * 400 + "\n", encoding="utf-8")
    out = _generated(tmp_path / "out", CPU, root)
    assert sha256_of(out / "train.jsonl") == sha256_of(cpu_set / "train.jsonl")
    assert "témoin du train" not in (out / "train.jsonl").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "language, corpora", [("fr", ["corpus_fr_e3c", "corpus_fr_leaflets_e3c"]), ("en", ["corpus_en_e3c"])]
)
def test_tokens_per_word_is_the_default_tokenizers_on_the_held_out_corpus(
    language, corpora, data_root, minilm_tokenizer
):
    sample = held_out_documents([data_root / c for c in corpora])[::12]
    pieces = sum(len(minilm_tokenizer(d, add_special_tokens=False)["input_ids"]) for d in sample)
    assert pieces / sum(len(d.split()) for d in sample) == pytest.approx(TOKENS_PER_WORD[language], rel=0.05)


def test_the_task_reads_the_generated_set(cpu_set):
    task = load_task(CPU)
    data = load_task_data(task, data_root=cpu_set.parent)
    assert data.labels == ("absent", "present") and [len(data.splits[s]) for s in SPLITS] == [420, 90, 90]
    first = data.splits["test"][0]
    assert first.text_pair and len(first.text.split()) > 200
    assert {load_task(n).max_length for n in ("needle_fr", "needle_en")} == {8192}


def test_fetch_generates_needle_fr_from_the_data_roots_corpora_and_checks_it(tmp_path, data_root, capsys):
    root = tmp_path / "root"
    root.mkdir()
    for required in with_requirements([dataset("needle_fr")])[:-1]:  # the corpora and what they require
        (root / required.name).symlink_to(data_root / required.name)
    assert main(["data", "fetch", "needle_fr", "--data-root", str(root)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "needle_fr: NON-COMMERCIAL licence" in out and "needle_fr: 3 files in" in out
    records = _records(root / "needle_fr")
    assert [len(records[s]) for s in SPLITS] == [1050, 225, 225]
    assert sorted({r["length"] for r in records["test"]}) == [512, 1024, 2048, 4096, 8192]
    assert main(["data", "verify", "needle_fr", "--data-root", str(root)]) == 0


GOOD = {"language": "fr", "seed": 1, "pairs": 12, "lengths": [512, 1024]}


@pytest.mark.parametrize(
    "change, key, value, allowed",
    [
        ({"pairs": 1000}, "pairs", 1000, "a multiple of 12"),
        ({"pairs": "six hundred"}, "pairs", "six hundred", "a valid integer"),
        ({"pairs": 0}, "pairs", 0, "greater than 0"),
        ({"lengths": 512}, "lengths", 512, "a valid tuple"),
        ({"lengths": []}, "lengths", None, "at least 1 item"),
        ({"lengths": [512, 100]}, "lengths", 100, "at least 141 tokens"),
        ({"language": "de"}, "language", "de", "fr, en"),
        ({"seed": True}, "seed", True, None),
        ({"pair": 12}, "pair", 12, "language, seed, pairs, lengths"),
    ],
)
def test_a_bad_generate_block_names_its_key_value_and_what_is_allowed(change, key, value, allowed):
    block = {**GOOD, **change}
    with pytest.raises(SpecError) as e:
        read_settings(block, "catalog.yaml", "needle_x.generate")
    assert (e.value.file, e.value.key, e.value.value) == ("catalog.yaml", f"needle_x.generate.{key}", value)
    assert allowed is None or allowed in e.value.allowed, e.value
    assert read_settings(GOOD, "catalog.yaml", "needle_x.generate").pairs == 12


def test_a_bad_generate_block_in_the_catalogue_exits_2_before_anything_is_fetched(tmp_path, monkeypatch, capsys):
    from ablate.data import catalog as catalogue

    entries = yaml.safe_load(catalogue.CATALOG.read_text(encoding="utf-8"))
    entries[CPU]["generate"]["pairs"] = "six hundred"
    bad = tmp_path / "catalog.yaml"
    bad.write_text(yaml.safe_dump(entries, sort_keys=False), encoding="utf-8")
    monkeypatch.setattr(catalogue, "CATALOG", bad)
    catalogue.catalog.cache_clear()
    try:
        rc = main(["data", "fetch", CPU, "--data-root", str(tmp_path / "root")])
    finally:
        catalogue.catalog.cache_clear()
    err = capsys.readouterr().err
    assert rc == 2 and not (tmp_path / "root").exists()
    assert err.startswith(f"error: {bad}: {CPU}.generate.pairs: ") and "six hundred" in err, err
    assert "allowed: a valid integer" in err, err
