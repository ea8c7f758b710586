"""The English half held against BioClinical-ModernBERT's harness itself (its functions kept as they run there:
tests/bioclinical_reference.py): COS, Social History and De-identification derived by ablate's converters equal
what the harness's own classes derive from the same files in their upstream formats (BRAT with overlapping,
discontinuous and CRLF annotations, a .txt without its .ann; id.text / id.res records); the words kept after
truncation are labelled as the harness labels them; and the same predictions score the same under ablate's
metrics and the harness's (evaluate's seqeval in its default mode; scikit-learn's weighted F1)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import bioclinical_reference as harness
from ablate.config.errors import SpecError
from ablate.data.converters import deid, uw_brat
from ablate.evaluate import metrics as m
from ablate.evaluate.task_types import compute, task_type
from ablate.evaluate.task_types.token_ner import decode_tags
from ablate.evaluate.tasks import load_task, load_task_data


def _as_harness(examples) -> list[dict]:
    return [{"tokens": list(tokens), "ner_tags": list(tags)} for tokens, tags in examples]


def _write(folder: Path, files: dict[str, str], newline: str = "\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_bytes(text.replace("\n", newline).encode("utf-8"))
    return folder


def _zipped(folder: Path, top: str) -> zipfile.ZipFile:
    path = folder.parent / f"{top}.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for f in sorted(folder.iterdir()):
            archive.write(f, f"{top}/{f.name}")
    return zipfile.ZipFile(path)


# ------------------------------------------------------------------------------------------------ COS

COS_ANN = {
    # overlapping annotations (Attr inside Cos: the later one in the file overwrites), an annotation crossing
    # the snippet's end (left out), an unread type with a discontinuous span, events/relations/attributes
    "snippet1_100.ann": "T1\tSnippet 0 41\tSlight increase in left basilar opacity.\n"
    "T2\tCos 0 15\tSlight increase\n"
    "T3\tLoc 19 31\tleft basilar\n"
    "T4\tRef 32 39\topacity\n"
    "T5\tAttr 0 6\tSlight\n"
    "T6\tNegation 19 23;24 31\tleft basilar\n"
    "T7\tSnippet 42 68\tNo change in the effusion.\n"
    "T8\tCos 42 51\tNo change\n"
    "T9\tRef 59 67\teffusion\n"
    "T10\tVal 60 75\tffusion. Next\n"
    "E1\tCos:T2 Theme:T4\n"
    "A1\tNegation E1\n"
    "R1\tLocation Arg1:T2 Arg2:T3\n",
    # sorted before snippet1_100.ann by name, as the harness lists the folder
    "snippet101_200.ann": "T1\tSnippet 0 31\tOpacity 2 is stable, size 2cm.\n"
    "T2\tRef 0 9\tOpacity 2\n"
    "T3\tCos 13 19\tstable\n"
    "T4\tVal 26 29\t2cm\n",
    "annotation.conf": "[entities]\nCos\n",
}


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_cos_examples_equal_the_harness_classes(tmp_path, newline):
    folder = _write(tmp_path / "COS", COS_ANN, newline)
    ours = uw_brat.read_cos(_zipped(folder, "data"), "cos")
    theirs = harness.cos_examples(str(folder))
    assert _as_harness(ours) == theirs
    assert len(theirs) == 3 and theirs[1]["ner_tags"][:2] == ["B-Attr", "I-Cos"]  # the overlap, resolved alike


def test_a_discontinuous_cos_entity_is_refused_where_the_harness_crashes(tmp_path):
    files = {"s.ann": "T1\tSnippet 0 15\tSlight increase\nT2\tCos 0 6;7 15\tSlight increase\n"}
    folder = _write(tmp_path / "COS", files)
    with pytest.raises(ValueError):
        harness.cos_examples(str(folder))
    with pytest.raises(SpecError, match="without integer offsets"):
        uw_brat.read_cos(_zipped(folder, "data"), "cos")


# -------------------------------------------------------------------------------------- Social History

SOCIAL = {
    # CRLF text (offsets count a line break as one character, as open() reads it), overlapping annotations
    # of two types, a discontinuous one (skipped by both), annotations out of start order
    "note01.txt": "He drinks beer\ndaily and smokes 1 pack.\n",
    "note01.ann": "T4\tAmount 32 38\t1 pack\n"
    "T1\tAlcohol 3 14\tdrinks beer\n"
    "T2\tFrequency 15 20\tdaily\n"
    "T3\tTobacco 25 38\tsmokes 1 pack\n"
    "T5\tDrug 3 9;10 14\tdrinks beer\n"
    "E1\tAlcohol:T1 Frequency:T2\n"
    "A1\tStatus E1 current\n",
    "note02.txt": "Lives with wife.\nNo drugs.\n",
    "note02.ann": "T1\tLivingStatus 0 15\tLives with wife\nT2\tDrug 17 25\tNo drugs\nT3\tStatus 17 19\tNo\n",
    "note03.txt": "No .ann beside this one: skipped by both.\n",
    "README.txt": "Social history corpus\n",
}


def test_social_history_examples_equal_the_harness_classes(tmp_path):
    folder = _write(tmp_path / "SocialHistory", SOCIAL, "\r\n")
    ours = uw_brat.read_social_history(_zipped(folder, "SocialHistoryMTSamples"), "social_history")
    theirs = harness.social_examples(str(folder))
    assert _as_harness(ours) == theirs
    assert len(theirs) == 2 and theirs[0]["ner_tags"][5:] == ["B-Tobacco", "B-Amount", "O"]


# ------------------------------------------------------------------------------------ De-identification


def _record(n: int, body: str) -> str:
    return f"START_OF_RECORD={n}||||{n}||||\n{body}\n||||END_OF_RECORD\n"


DEID_NOTES = [
    # (original, masked): every category, a mask at the record's end, one over two lines, adjacent masks
    (
        "Patient John Smith seen on 2/14 by\nDr. Brown at Mercy Hospital , call 555-1234 .",
        "Patient [**Known patient firstname **] [**Known patient lastname **] seen on [**2-14**] by\n"
        "Dr. [**Doctor Last Name **] at [**Hospital 12**] , call [**Telephone/Fax (1) 55**] .",
    ),
    (
        "Age 92 , lives at 12 Elm St in 2101 .",
        "Age [**Age over 90 **] , lives at [**Street Address 3**] in [**2101**] .",
    ),
    ("Email jo@x.org from Acme Corp today", "Email [**E-mail address 1**] from [**Company 7**] today"),
    ("Seen 1999-01-02 and 03-04 , ok", "Seen [**1999-01-02**] and [**03-04**] , ok"),
]


def test_deid_examples_equal_the_harness_classes(tmp_path):
    text = "".join(_record(i, original) for i, (original, _) in enumerate(DEID_NOTES, 1))
    res = "".join(_record(i, masked) for i, (_, masked) in enumerate(DEID_NOTES, 1))
    folder = _write(tmp_path / "DEID", {"id.text": text, "id.res": res}, "\r\n")
    ours = deid.deid_examples(
        deid.read_note_file(folder / "id.text"), deid.read_note_file(folder / "id.res"), "deid"
    )
    theirs = harness.deid_examples(str(folder / "id.text"), str(folder / "id.res"))
    assert _as_harness(ours) == theirs
    tags = {t for ex in theirs for t in ex["ner_tags"]}
    assert {f"B-{c}" for c in ("age", "date", "location", "name", "other", "phone_nb")} <= tags


def test_an_unmapped_deid_mask_is_refused_where_the_harness_tags_it_bare(tmp_path):
    folder = _write(
        tmp_path / "DEID", {"id.text": _record(1, "Seen by x ."), "id.res": _record(1, "Seen by [**X**] .")}
    )
    [example] = harness.deid_examples(str(folder / "id.text"), str(folder / "id.res"))
    assert example["ner_tags"] == ["O", "O", "B", "O"]  # a tag of no type, outside the harness's own label set
    with pytest.raises(SpecError, match="maps to none"):
        deid.deid_examples(_record(1, "Seen by x ."), _record(1, "Seen by [**X**] ."))


# --------------------------------------------------------------------------------------- NER scoring


def test_kept_words_are_labelled_and_scored_as_the_harness_does(minilm_tokenizer):
    """Real NCBI test sentences cut at 24 tokens: ablate's labels per sub-token are the harness's, and the same
    logits score the same seqeval F1 / precision / recall as the harness's compute_metrics (evaluate's seqeval,
    the words past the cut left out); strict entity F1 differs where the default mode repairs an I-."""
    task = load_task("ncbi_disease")
    data = load_task_data(task)
    examples, labels = data.splits["test"][:40], data.labels
    label_id = {lab: i for i, lab in enumerate(labels)}
    encoded = task.entry.encode(minilm_tokenizer, examples, labels, 24)
    theirs = harness.tokenize_and_align_labels(
        minilm_tokenizer,
        24,
        {
            "tokens": [list(ex.text) for ex in examples],
            "ner_tags": [[label_id[t] for t in ex.label] for ex in examples],
        },
    )
    assert [item.label for item in encoded] == theirs["labels"]
    assert any(len(set(filter(None, it.word_ids))) < len(ex.text) - 1 for it, ex in zip(encoded, examples))  # cut

    rng = np.random.default_rng(0)
    width = max(len(it.input_ids) for it in encoded)
    logits = rng.normal(size=(len(encoded), width, len(labels))).astype(np.float32)
    logits[..., label_id["O"]] += 1.5  # mostly O, some entities (and stray I- tags)
    padded = np.full((len(encoded), width), -100)
    for r, it in enumerate(encoded):
        padded[r, : len(it.label)] = it.label
    expected = harness.compute_metrics_token_classification((logits, padded), dict(enumerate(labels)))

    pred = [
        decode_tags(torch.from_numpy(logits[r, : len(it.input_ids)]), it, labels, len(ex.text))
        for r, (it, ex) in enumerate(zip(encoded, examples))
    ]
    gold = [list(ex.label) for ex in examples]
    ours = compute(
        "token_classification", ["seqeval_f1", "seqeval_precision", "seqeval_recall", "entity_f1"], gold, pred
    )
    assert (ours["seqeval_f1"], ours["seqeval_precision"], ours["seqeval_recall"]) == pytest.approx(
        (expected["f1"], expected["precision"], expected["recall"]), abs=1e-12
    )
    assert 0 < expected["f1"] < 1 and ours["entity_f1"] != expected["f1"]  # the two modes differ here


def test_weighted_f1_is_the_harness_computation():
    """sklearn's weighted F1 as the harness calls it (src/metrics/metrics.py:14-21, :35-40): single-label on
    argmax, multi-label on logits > 0 over the whole label matrix; ablate's on label names the same numbers."""
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(1)
    names = ("a", "b", "c", "d", "e")
    gold = rng.integers(0, 5, 60)
    logits = rng.normal(size=(60, 5)) + np.eye(5)[gold]
    expected = f1_score(gold, np.argmax(logits, -1), average="weighted", zero_division=0)
    assert m.weighted_f1([names[g] for g in gold], [names[p] for p in np.argmax(logits, -1)]) == pytest.approx(
        expected, abs=1e-12
    )

    y = (rng.random((60, 5)) < 0.3).astype(int)
    y[:, 4] = 0  # a label no example has
    multi = rng.normal(size=(60, 5)) + y
    expected = f1_score(y, (multi > 0).astype(int), average="weighted", zero_division=0)
    decode = task_type("multi_label_classification").decode
    pred = decode(type("Out", (), {"logits": torch.from_numpy(multi)}), [None] * 60, names, [None] * 60)
    gold_sets = [tuple(n for n, on in zip(names, row) if on) for row in y]
    assert m.multilabel_weighted_f1(gold_sets, pred) == pytest.approx(expected, abs=1e-12)


def test_every_family_has_the_heads_the_harness_builds():
    """`pooling: model` and token tasks take AutoModelFor{Sequence,Token}Classification as transformers builds
    them: every registered family has both classes (a family without one would have to say which head it uses
    instead)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as SEQUENCE,
        MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES as TOKEN,
    )

    from ablate.models.families import FAMILIES

    missing = [t for f in FAMILIES.values() for t in f.model_types if t not in SEQUENCE or t not in TOKEN]
    assert not missing, missing
