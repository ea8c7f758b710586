"""The task files of the paper's suite on their real data: split sizes as their SOURCE.md states, and a
fine-tune of a tiny random model on a slice of each whose reported scores equal a direct computation
(seqeval / sklearn / scipy) on the predictions it returns. Also: tasks from `datasets` datasets (a folder
saved with save_to_disk, built here from the shipped files; the hub, offline), and a task of every shipped
type added as a file alone."""

import functools
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from scipy import stats
from seqeval.metrics import f1_score as seq_f1, precision_score as seq_precision, recall_score as seq_recall
from seqeval.scheme import IOB2
from sklearn.metrics import accuracy_score, f1_score
from sklearn.preprocessing import MultiLabelBinarizer

import ablate.evaluate.finetune as ft
import ablate.evaluate.score_files as sc
from ablate.evaluate import task_types
from ablate.config.errors import SpecError
from ablate.evaluate.identity import data_hash
from ablate.evaluate.tasks import TASKS_DIR_ENV, load_task, load_task_data, resolve_settings
from bioclinical_reference import evaluate_seqeval

datasets = pytest.importorskip("datasets")
torch.set_num_threads(min(2, torch.get_num_threads()))

DATA = Path(os.environ.get("ABLATE_DATA_ROOT", "data"))
pytestmark = pytest.mark.skipif(
    not (DATA / "bc2gm").is_dir(), reason=f"the suite's task data not found under ABLATE_DATA_ROOT={DATA}"
)

SMALL = {
    "max_train_examples": 32,
    "max_eval_examples": 32,
    "epochs": 1,
    "max_length": 64,
    "batch_size": 8,
    "lr": 1e-3,
}

# train / dev / test sizes as each dataset's SOURCE.md gives them
SIZES = {
    "bc2gm": (12574, 2519, 5038),
    "jnlpba": (16807, 1739, 3856),
    "linnaeus": (11935, 4078, 7142),
    "bc5cdr_chemical": (4560, 4581, 4797),
    "bc5cdr_disease": (4560, 4581, 4797),
    "gad": (4261, 535, 534),
    "ddi": (25295, 2496, 5716),
    "hoc": (1295, 186, 371),
    "biosses": (64, 16, 20),
    "quaero_emea": (769, 745, 694),
    "quaero_medline": (833, 832, 833),
    "mantragsc_fr_emea": (70, 10, 20),
    "mantragsc_fr_medline": (70, 10, 20),
    "mantragsc_fr_patents": (35, 5, 10),
    "morfitt": (1514, 1022, 1088),
}
DDI_POSITIVE = ["DDI-mechanism", "DDI-effect", "DDI-advise", "DDI-int"]


@functools.cache
def _real(name: str):
    """A shipped task and its data, read once for the whole file."""
    task = load_task(name)
    return task, load_task_data(task)


def _finetune(model, task, data_root=None, **over):
    seen = {}
    rows = ft.finetune(
        model,
        task,
        0,
        resolve_settings(task, {**SMALL, **over}),
        data_root=data_root,
        on_predictions=lambda split, gold, pred: seen.update({split: (gold, pred)}),
    )
    return rows, seen


def _direct(task, gold, pred) -> dict[str, float]:
    """The task's metrics computed straight from the libraries, not through ablate.evaluate.metrics."""
    if task.type == "token_classification":
        kw = {"mode": "strict", "scheme": IOB2, "zero_division": 0}
        strict = [["O" if t is None else t for t in p] for p in pred]  # a word past the cut: O
        # the harness's (evaluate's seqeval, default mode), the words past the cut left out of both
        kept = [[(g, t) for g, t in zip(gs, ps) if t is not None] for gs, ps in zip(gold, pred)]
        harness = evaluate_seqeval([[t for _, t in k] for k in kept], [[g for g, _ in k] for k in kept])
        return {
            "entity_f1": seq_f1(gold, strict, **kw),
            "entity_precision": seq_precision(gold, strict, **kw),
            "entity_recall": seq_recall(gold, strict, **kw),
            "seqeval_f1": harness["overall_f1"],
            "seqeval_precision": harness["overall_precision"],
            "seqeval_recall": harness["overall_recall"],
        }
    if task.type == "regression":
        constant = len(set(gold)) < 2 or len(set(pred)) < 2
        return {
            "pearson": math.nan if constant else stats.pearsonr(gold, pred).statistic,
            "spearman": math.nan if constant else stats.spearmanr(gold, pred).statistic,
        }
    if task.type == "multi_label_classification":
        # the labels of gold or predictions (a label absent from both is no class of this sample)
        mlb = MultiLabelBinarizer().fit([set(g) | set(p) for g, p in zip(gold, pred)])
        y, z = mlb.transform(gold), mlb.transform(pred)
        return {
            avg + "_f1": f1_score(y, z, average=avg, zero_division=0) for avg in ("micro", "macro", "weighted")
        }
    out = {"accuracy": accuracy_score(gold, pred)}
    if task.name == "ddi":  # BLURB: micro F1 over the four interaction types
        present = [lab for lab in DDI_POSITIVE if lab in set(gold) | set(pred)]
        out["micro_f1"] = f1_score(gold, pred, labels=DDI_POSITIVE, average="micro", zero_division=0)
        out["macro_f1"] = (
            f1_score(gold, pred, labels=present, average="macro", zero_division=0) if present else 0.0
        )
    else:
        out.update(
            {f"{a}_f1": f1_score(gold, pred, average=a, zero_division=0) for a in ("micro", "macro", "weighted")}
        )
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=1e-12)


# ------------------------------------------------------------------------------------------- the suite's tasks


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SIZES))
def test_task_reads_its_real_splits_and_scores_as_computed_directly(name, tiny_bert):
    task, data = _real(name)
    assert tuple(len(data.splits[s]) for s in ("train", "dev", "test")) == SIZES[name]
    rows, seen = _finetune(tiny_bert, task)
    assert set(seen) == {"dev", "test"}
    for split in ("dev", "test"):
        gold, pred = seen[split]
        first = data.splits[split][: SMALL["max_eval_examples"]]
        assert gold == [list(ex.label) if task.type == "token_classification" else ex.label for ex in first]
        assert len(pred) == len(gold)
        reported = {r["metric"]: r["value"] for r in rows if r["split"] == split}
        assert list(reported) == task.metrics
        direct = _direct(task, gold, pred)
        assert all(_same(reported[m], direct[m]) for m in task.metrics), (split, reported, direct)


def _wrong_in_places(task, gold: list, labels: tuple[str, ...]) -> list:
    """Predictions right on some examples, wrong on others: NER misses every third sentence's entities and
    tags the first word of another third; the other types take the next example's label."""
    if task.type != "token_classification":
        return gold[1:] + gold[:1]
    first = next(lab for lab in labels if lab.startswith("B-"))
    return [["O"] * len(g) if i % 3 == 0 else g if i % 3 == 1 else [first] + g[1:] for i, g in enumerate(gold)]


@pytest.mark.parametrize("name", sorted(SIZES))
def test_task_metrics_on_its_real_labels_equal_a_direct_computation(name):
    task, data = _real(name)
    examples = data.splits["test"][:300]
    gold = [list(ex.label) if task.type == "token_classification" else ex.label for ex in examples]
    pred = _wrong_in_places(task, gold, data.labels)
    ours = task_types.compute(task.type, task.metrics, gold, pred, task.metric_options.negative_label)
    direct = _direct(task, gold, pred)
    assert all(_same(ours[m], direct[m]) for m in task.metrics), (ours, direct)
    assert 0 < abs(ours[task.primary_metric]) < 1  # neither all right nor all wrong: the check has teeth


def test_the_reported_metric_of_each_task_is_the_fields():
    first = {n: load_task(n).primary_metric for n in SIZES}
    assert first == {
        **{n: "seqeval_f1" for n in SIZES if load_task(n).type == "token_classification"},
        "gad": "weighted_f1",
        "ddi": "micro_f1",
        "hoc": "weighted_f1",
        "biosses": "pearson",
        "morfitt": "weighted_f1",
    }
    assert load_task("ddi").metric_options.negative_label == "DDI-false"
    assert load_task("gad").metric_options.negative_label is None  # weighted F1 over both labels, as the harness


def test_bc5cdr_per_type_keeps_one_type_of_the_joint_files():
    joint = _real("bc5cdr")[1].splits
    for kept, dropped in (("Chemical", "Disease"), ("Disease", "Chemical")):
        one = _real(f"bc5cdr_{kept.lower()}")[1]
        assert one.labels == ("O", f"B-{kept}", f"I-{kept}")
        for split in ("train", "dev", "test"):
            for a, b in zip(joint[split], one.splits[split]):
                assert a.text == b.text
                assert b.label == tuple("O" if t.endswith(dropped) else t for t in a.label)
    # the counts of BC5CDR's mentions in its train split
    chem = _real("bc5cdr_chemical")[1].splits["train"]
    assert (
        sum(t == "B-Chemical" for ex in chem for t in ex.label)
        == sum(t == "B-Chemical" for ex in joint["train"] for t in ex.label)
        > 0
    )


def test_label_counts_match_the_sources():
    hoc = _real("hoc")[1]
    assert sum("activating invasion and metastasis" in ex.label for ex in hoc.splits["train"]) == 201
    assert sum(ex.label == () for ex in hoc.splits["train"]) == 197
    ddi = _real("ddi")[1]
    assert sum(ex.label == "DDI-int" for ex in ddi.splits["test"]) == 96
    gad = _real("gad")[1]
    assert sum(ex.label == "1" for ex in gad.splits["dev"]) == 293
    morfitt = _real("morfitt")[1]
    assert sum(len(ex.label) for ex in morfitt.splits["train"]) == 2110


def test_keep_entity_types_must_agree_with_the_label_values(tmp_path):
    spec = yaml.safe_load((Path(load_task("bc5cdr_chemical").file)).read_text())
    spec["labels"]["values"] = ["O", "B-Chemical", "I-Chemical", "B-Disease"]
    path = tmp_path / "bc5cdr_chemical.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as e:
        load_task(str(path))
    assert e.value.key == "labels.values" and e.value.value == "B-Disease"
    spec["labels"] = {"keep_entity_types": ["Chemical"]}
    spec.update(type="sequence_classification", columns={"text": "text", "label": "label"}, metrics=["accuracy"])
    spec["data"] = {"format": "jsonl", "splits": spec["data"]["splits"]}
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as e:
        load_task(str(path))
    assert e.value.key == "labels.keep_entity_types"


# ------------------------------------------------------------------------------------------- datasets

N = 24  # examples of each split saved as a dataset


def _save_slices(root: Path) -> None:
    """ncbi_disease (tags as a list of ClassLabel) and chemprot (label a ClassLabel) as save_to_disk folders."""
    ncbi, chem = _real("ncbi_disease")[1], _real("chemprot")[1]
    tags = datasets.ClassLabel(names=list(ncbi.labels))
    ner_features = datasets.Features(
        {"tokens": datasets.Sequence(datasets.Value("string")), "ner_tags": datasets.Sequence(tags)}
    )
    datasets.DatasetDict(
        {
            hf: datasets.Dataset.from_dict(
                {
                    "tokens": [list(ex.text) for ex in ncbi.splits[s][:N]],
                    "ner_tags": [[tags.str2int(t) for t in ex.label] for ex in ncbi.splits[s][:N]],
                },
                features=ner_features,
            )
            for s, hf in (("train", "train"), ("dev", "validation"), ("test", "test"))
        }
    ).save_to_disk(root / "ncbi_hf")
    label = datasets.ClassLabel(names=list(chem.labels))
    cls_features = datasets.Features({"sentence": datasets.Value("string"), "label": label})
    datasets.DatasetDict(
        {
            hf: datasets.Dataset.from_dict(
                {
                    "sentence": [ex.text for ex in chem.splits[s][:N]],
                    "label": [label.str2int(ex.label) for ex in chem.splits[s][:N]],
                },
                features=cls_features,
            )
            for s, hf in (("train", "train"), ("dev", "validation"), ("test", "test"))
        }
    ).save_to_disk(root / "chem_hf")


def _hf_task(tmp_path: Path, base: str, dataset: str, columns: dict, **over) -> Path:
    spec = yaml.safe_load(Path(load_task(base).file).read_text())
    spec.update(name=f"{base}_hf", columns=columns, **over)
    spec["data"] = {
        "format": "hf",
        "dataset": dataset,
        "splits": {"train": "train", "dev": "validation", "test": "test"},
    }
    path = tmp_path / "tasks" / f"{base}_hf.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_root")
    _save_slices(root)
    return root


@pytest.mark.slow
@pytest.mark.parametrize(
    "base, folder, columns",
    [
        ("ncbi_disease", "ncbi_hf", {"text": "tokens", "label": "ner_tags"}),
        ("chemprot", "chem_hf", {"text": "sentence", "label": "label"}),
    ],
)
def test_a_saved_dataset_scores_as_the_same_examples_read_from_files(
    tmp_path, saved, tiny_bert, base, folder, columns
):
    files_task, files_data = _real(base)
    # the label set of the whole files, in their order (a slice of 24 lacks some of chemprot's labels)
    labels = {"values": list(files_data.labels), "allow_unseen_eval_labels": True}
    hf_task = load_task(str(_hf_task(tmp_path, base, folder, columns, labels=labels)))
    hf_data = load_task_data(hf_task, data_root=saved)
    assert hf_data.labels == files_data.labels
    for split in ("train", "dev", "test"):
        assert hf_data.splits[split] == files_data.splits[split][:N]
    hf_rows, hf_seen = _finetune(tiny_bert, hf_task, data_root=saved, max_train_examples=N, max_eval_examples=N)
    rows, seen = _finetune(tiny_bert, files_task, max_train_examples=N, max_eval_examples=N)
    strip = [{k: v for k, v in r.items() if k not in ("task", "wall_time_s")} for r in rows]
    assert [{k: v for k, v in r.items() if k not in ("task", "wall_time_s")} for r in hf_rows] == strip
    assert hf_seen == seen


def test_a_saved_dataset_is_loaded_once_for_its_data_identity_and_fine_tuning_and_again_once_changed(
    tmp_path, saved, tiny_bert, monkeypatch
):
    from ablate.evaluate import task_readers

    task_readers._load_hf.cache_clear()
    loads, real = [], datasets.load_from_disk
    monkeypatch.setattr(
        datasets, "load_from_disk", lambda path, *a, **k: loads.append(path) or real(path, *a, **k)
    )
    labels = {"values": list(_real("chemprot")[1].labels), "allow_unseen_eval_labels": True}
    task = load_task(
        str(_hf_task(tmp_path, "chemprot", "chem_hf", {"text": "sentence", "label": "label"}, labels=labels))
    )
    data = load_task_data(task, data_root=saved)
    identity = data_hash(task, data_root=saved)
    _finetune(tiny_bert, task, data_root=saved, max_train_examples=8, max_eval_examples=8)
    assert loads == [str(saved / "chem_hf")]  # read once for all three
    copy = tmp_path / "chem_copy"
    real(str(saved / "chem_hf")).save_to_disk(copy)
    moved = load_task(
        str(_hf_task(tmp_path, "chemprot", str(copy), {"text": "sentence", "label": "label"}, labels=labels))
    )
    assert load_task_data(moved).splits == data.splits and len(loads) == 2
    real(str(saved / "chem_hf")).map(lambda r: {"sentence": r["sentence"].lower()}).save_to_disk(tmp_path / "x")
    shutil.rmtree(copy)
    shutil.move(tmp_path / "x", copy)  # the same folder, saved again: read again
    assert load_task_data(moved).splits != data.splits and len(loads) == 3
    assert data_hash(task, data_root=saved) == identity


def test_a_saved_dataset_with_string_tags_and_its_data_identity(tmp_path, saved):
    words = [["A", "colon", "cancer", "case"], ["No", "tumour"]]
    tags = [["O", "B-Disease", "I-Disease", "O"], ["O", "B-Disease"]]
    part = datasets.Dataset.from_dict({"words": words, "tags": tags})
    datasets.DatasetDict({"train": part, "validation": part, "test": part}).save_to_disk(tmp_path / "strings")
    task = load_task(
        str(_hf_task(tmp_path, "ncbi_disease", str(tmp_path / "strings"), {"text": "words", "label": "tags"}))
    )
    data = load_task_data(task)  # an absolute folder: the data root is not consulted
    assert [ex.text for ex in data.splits["dev"]] == [tuple(w) for w in words]
    assert [ex.label for ex in data.splits["test"]] == [tuple(t) for t in tags]
    before = data_hash(task)
    datasets.DatasetDict({"train": part, "validation": part.select([0]), "test": part}).save_to_disk(
        tmp_path / "strings2"
    )
    task2 = load_task(
        str(_hf_task(tmp_path, "ncbi_disease", str(tmp_path / "strings2"), {"text": "words", "label": "tags"}))
    )
    assert data_hash(task2) != before and data_hash(task) == before


def test_dataset_errors_name_the_key(tmp_path, saved):
    cols = {"text": "tokens", "label": "ner_tags"}
    cases = [
        ({"dataset": "no_such_folder"}, "data.dataset", "saved dataset folder not found"),
        ({"splits": {"train": "train", "dev": "dev", "test": "test"}}, "data.splits.dev", "no split 'dev'"),
        ({"config": "x"}, "data.config", "saved folder has none"),
        ({"dataset": None}, "data.dataset", "needs data.dataset"),
    ]
    for change, key, words in cases:
        path = _hf_task(tmp_path, "ncbi_disease", "ncbi_hf", cols)
        spec = yaml.safe_load(path.read_text())
        spec["data"].update(change)
        path.write_text(yaml.safe_dump(spec))
        with pytest.raises(SpecError) as e:
            load_task_data(load_task(str(path)), data_root=saved)
        assert e.value.key == key and words in e.value.message, (change, e.value)
    with pytest.raises(SpecError) as e:
        load_task_data(
            load_task(str(_hf_task(tmp_path, "ncbi_disease", "ncbi_hf", {"text": "tokens", "label": "no_tags"}))),
            saved,
        )
    assert e.value.key == "columns.label" and "ner_tags" in e.value.allowed


def test_a_hub_dataset_offline_says_the_hub_is_unreachable(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    path = _hf_task(
        tmp_path,
        "ncbi_disease",
        "hf:bigbio/ncbi_disease",
        {"text": "tokens", "label": "ner_tags"},
    )
    spec = yaml.safe_load(path.read_text())
    spec["data"]["config"] = "ncbi_disease_source"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as e:
        load_task_data(load_task(str(path)))
    assert e.value.key == "data.dataset" and e.value.value == "hf:bigbio/ncbi_disease"
    assert "hub is unreachable" in e.value.message and "save_to_disk" in e.value.message


# ------------------------------------------------------------------------------------------- a file alone

# one task of each shipped type, written as a new file over the shipped data
NEW_FILES = {
    "my_ner": {
        "type": "token_classification",
        "data": {
            "format": "conll",
            "delimiter": "\t",
            "splits": {s: f"linnaeus/{s}.tsv" for s in ("train", "dev", "test")},
        },
        "columns": {"text": 0, "label": 1},
        "metrics": ["entity_f1"],
    },
    "my_relation": {
        "type": "sequence_classification",
        "data": {"format": "jsonl", "splits": {s: f"gad/{s}.jsonl" for s in ("train", "dev", "test")}},
        "columns": {"text": "text", "label": "label"},
        "metrics": ["macro_f1", "accuracy"],
    },
    "my_pairs": {
        "type": "sequence_pair_classification",
        "data": {"format": "jsonl", "splits": {s: f"pubmedqa_pqal/{s}.jsonl" for s in ("train", "dev", "test")}},
        "columns": {"text": "question", "text_pair": "context", "label": "label"},
        "metrics": ["accuracy"],
    },
    "my_multilabel": {
        "type": "multi_label_classification",
        "data": {"format": "jsonl", "splits": {s: f"morfitt/{s}.jsonl" for s in ("train", "dev", "test")}},
        "columns": {"text": "text", "label": "labels"},
        "metrics": ["micro_f1"],
    },
    "my_similarity": {
        "type": "regression",
        "data": {"format": "jsonl", "splits": {s: f"biosses/{s}.jsonl" for s in ("train", "dev", "test")}},
        "columns": {"text": "text_a", "text_pair": "text_b", "label": "label"},
        "metrics": ["spearman"],
    },
}


@pytest.mark.slow
def test_a_task_of_every_type_added_as_a_file_alone_evaluates(tmp_path, tiny_bert, monkeypatch):
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    for name, body in NEW_FILES.items():
        (tasks_dir / f"{name}.yaml").write_text(
            yaml.safe_dump({"name": name, "language": "en", "source": "tests: the shipped files", **body})
        )
    monkeypatch.setenv(TASKS_DIR_ENV, str(tasks_dir))
    out = tmp_path / "scores"
    rows = sc.evaluate_scores(
        tiny_bert, list(NEW_FILES), [0], {**SMALL, "max_train_examples": 16, "max_eval_examples": 16}, out
    )
    for name, body in NEW_FILES.items():
        stored = json.loads((out / name / "seed-0.json").read_text())
        assert [(r["split"], r["metric"]) for r in stored["rows"]] == [
            (s, m) for s in ("dev", "test") for m in body["metrics"]
        ]
        assert all(isinstance(r["value"], float) for r in stored["rows"])
    assert {r["task"] for r in rows} == set(NEW_FILES)
