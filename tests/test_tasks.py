import json
import os
from pathlib import Path

import pytest
import yaml

from ablate.config.errors import SpecError
from ablate.evaluate.tasks import (
    FinetuneSettings,
    TaskSpec,
    list_tasks,
    load_task,
    load_task_data,
    resolve_settings,
)
from ablate.launch.data_needs import target_datasets

DATA = Path(os.environ.get("ABLATE_DATA_ROOT", "data"))
needs_data = pytest.mark.skipif(
    not (DATA / "ncbi_disease").is_dir(), reason=f"real task data not found under ABLATE_DATA_ROOT={DATA}"
)

NER_TRAIN = "Famil\tO\nadenomatous\tB-Disease\npolyposis\tI-Disease\n\nThe\tO\ngene\tO\n"
NER_DEV = "A\tO\ntumour\tB-Disease\n"


def ner_task(**over) -> dict:
    task = {
        "name": "toy",
        "language": "en",
        "type": "token_classification",
        "source": "tests",
        "data": {
            "format": "conll",
            "delimiter": "\t",
            "splits": {"train": "toy/train.tsv", "dev": "toy/dev.tsv", "test": "toy/test.tsv"},
        },
        "columns": {"text": 0, "label": 1},
        "metrics": ["entity_f1"],
    }
    task.update(over)
    return task


def cls_task(**over) -> dict:
    task = {
        "name": "toy",
        "language": "en",
        "type": "sequence_classification",
        "source": "tests",
        "data": {
            "format": "jsonl",
            "splits": {"train": "toy/train.jsonl", "dev": "toy/dev.jsonl", "test": "toy/test.jsonl"},
        },
        "columns": {"text": "text", "label": "label"},
        "metrics": ["accuracy", "macro_f1"],
    }
    task.update(over)
    return task


def write(root: Path, rel: str, text: str) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


def write_task(tmp_path: Path, task: dict) -> Path:
    return write(tmp_path, f"tasks/{task['name']}.yaml", yaml.safe_dump(task, sort_keys=False))


def ner_files(root: Path, train=NER_TRAIN, dev=NER_DEV, test=NER_DEV):
    write(root, "toy/train.tsv", train)
    write(root, "toy/dev.tsv", dev)
    write(root, "toy/test.tsv", test)


def jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def cls_files(root: Path, train=None, dev=None, test=None):
    train = train or [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}]
    for split, rows in (("train", train), ("dev", dev or train), ("test", test or train)):
        write(root, f"toy/{split}.jsonl", jsonl(rows))


# ------------------------------------------------------------------------------------------- shipped task files


def test_registry_lists_the_shipped_tasks():
    assert {"ncbi_disease", "chemprot", "e3c_fr_ner", "bc5cdr", "pubmedqa_pqal"} <= set(list_tasks())


@pytest.mark.parametrize("name", list_tasks())
def test_every_shipped_task_file_validates(name):
    task = load_task(name)
    assert task.name == name and task.source.strip()
    assert task.file.endswith(f"{name}.yaml")


@needs_data
@pytest.mark.parametrize(
    "name",
    [
        t
        for t in list_tasks()  # brought data: tests/test_paper_suites.py
        if getattr(load_task(t).access, "kind", None) != "brought"
    ],
)
def test_every_shipped_task_loads_its_real_data(name):
    task = load_task(name)
    derived = [d for d in target_datasets(name) if d.derived and not (DATA / d.name).is_dir()]
    if derived:  # no copy of the data here: tests/test_paper_data.py reads it from upstream fixtures
        pytest.skip(f"{derived[0].name} is derived from a source ablate cannot ship: `ablate data fetch {name}`")
    data = load_task_data(task)
    assert all(data.splits[s] for s in ("train", "dev", "test"))
    assert len(data.labels) >= 2 if task.type != "regression" else data.labels == ()


@needs_data
def test_ncbi_disease_real_data():
    data = load_task_data(load_task("ncbi_disease"))
    assert [len(data.splits[s]) for s in ("train", "dev", "test")] == [5424, 923, 940]
    words, tags = data.splits["train"][0].text, data.splits["train"][0].label
    assert words[:3] == ("Identification", "of", "APC2") and len(words) == len(tags)
    assert set(data.labels) == {"O", "B-Disease", "I-Disease"}


@needs_data
def test_chemprot_and_e3c_real_data():
    chem = load_task_data(load_task("chemprot"))
    assert len(chem.labels) == 13 and chem.labels == tuple(sorted(chem.labels))  # read from train, sorted
    assert isinstance(chem.splits["dev"][0].text, str) and chem.splits["dev"][0].text_pair is None
    e3c = load_task_data(load_task("e3c_fr_ner"))
    assert [len(e3c.splits[s]) for s in ("train", "dev", "test")] == [454, 50, 605]


# ------------------------------------------------------------------------------------------- reading data


def test_conll_reading_and_labels_from_train(tmp_path):
    ner_files(tmp_path, test="-DOCSTART-\tO\n\nX\tO\n\n\n")
    data = load_task_data(TaskSpec.model_validate(ner_task()), data_root=tmp_path)
    assert data.splits["train"] == [
        (("Famil", "adenomatous", "polyposis"), ("O", "B-Disease", "I-Disease"), None),
        (("The", "gene"), ("O", "O"), None),
    ]
    assert data.splits["test"] == [(("X",), ("O",), None)]
    assert data.labels == ("B-Disease", "I-Disease", "O")


def test_conll_whitespace_delimiter(tmp_path):
    ner_files(tmp_path, train="l' O\nasthme B-ety\n", dev="x O\n", test="y  O\n")
    task = ner_task(
        data={
            "format": "conll",
            "delimiter": None,
            "splits": {"train": "toy/train.tsv", "dev": "toy/dev.tsv", "test": "toy/test.tsv"},
        }
    )
    data = load_task_data(TaskSpec.model_validate(task), data_root=tmp_path)
    assert data.splits["train"][0].text == ("l'", "asthme")
    assert data.splits["test"][0].label == ("O",)


def test_pair_csv_regression_and_dotted_fields(tmp_path):
    write(tmp_path, "toy/train.csv", "a;b;score\nA man;A person;4.5\nA cat;A car;0.5\n")
    task = {
        "name": "toy",
        "language": "en",
        "type": "regression",
        "source": "tests",
        "data": {
            "format": "csv",
            "delimiter": ";",
            "splits": {"train": "toy/train.csv", "dev": "toy/train.csv", "test": "toy/train.csv"},
        },
        "columns": {"text": "a", "text_pair": "b", "label": "score"},
        "metrics": ["spearman", "pearson"],
    }
    data = load_task_data(TaskSpec.model_validate(task), data_root=tmp_path)
    assert data.splits["dev"] == [("A man", 4.5, "A person"), ("A cat", 0.5, "A car")]
    assert data.labels == ()

    write(
        tmp_path,
        "toy/q.json",
        json.dumps(
            [
                {"q": "Q1", "answers": {"a": "x", "b": "y"}, "ok": ["b", "a"]},
                {"q": "Q2", "answers": {"a": "z", "b": "w"}, "ok": []},
            ]
        ),
    )
    task = {
        "name": "toy",
        "language": "fr",
        "type": "multi_label_classification",
        "source": "tests",
        "data": {"format": "json", "splits": {"train": "toy/q.json", "dev": "toy/q.json", "test": "toy/q.json"}},
        "columns": {"text": "q", "text_pair": ["answers.a", "answers.b"], "label": "ok"},
        "metrics": ["micro_f1"],
    }
    data = load_task_data(TaskSpec.model_validate(task), data_root=tmp_path)
    assert data.splits["train"][0] == ("Q1", ("a", "b"), "x y")
    assert data.splits["train"][1].label == ()
    assert data.labels == ("a", "b")


# ------------------------------------------------------------------------------------------- label-set checks


def test_label_in_dev_missing_from_train_is_an_error(tmp_path):
    cls_files(tmp_path, dev=[{"text": "meh", "label": "neutral"}])
    with pytest.raises(SpecError) as e:
        load_task_data(TaskSpec.model_validate(cls_task()), data_root=tmp_path)
    assert e.value.key == "data.splits.dev" and e.value.value == ["neutral"]
    assert "allow_unseen_eval_labels" in str(e.value)


def test_unseen_eval_labels_allowed_are_appended(tmp_path):
    cls_files(tmp_path, test=[{"text": "meh", "label": "neutral"}])
    task = TaskSpec.model_validate(cls_task(labels={"allow_unseen_eval_labels": True}))
    assert load_task_data(task, data_root=tmp_path).labels == ("neg", "pos", "neutral")


def test_declared_label_values_fix_order_and_reject_others(tmp_path):
    cls_files(tmp_path)
    task = TaskSpec.model_validate(cls_task(labels={"values": ["pos", "neg", "neutral"]}))
    assert load_task_data(task, data_root=tmp_path).labels == ("pos", "neg", "neutral")
    with pytest.raises(SpecError) as e:
        load_task_data(TaskSpec.model_validate(cls_task(labels={"values": ["pos"]})), data_root=tmp_path)
    assert e.value.key == "labels.values" and e.value.value == ["neg"]


def test_token_label_in_test_missing_from_train(tmp_path):
    ner_files(tmp_path, test="Aspirin\tB-Chemical\n")
    with pytest.raises(SpecError, match="test that train lacks") as e:
        load_task_data(TaskSpec.model_validate(ner_task()), data_root=tmp_path)
    assert e.value.value == ["B-Chemical"]


# ------------------------------------------------------------------------------------------- bad input


def test_missing_data_file(tmp_path):
    ner_files(tmp_path)
    (tmp_path / "toy/dev.tsv").unlink()
    task = load_task(write_task(tmp_path, ner_task()))
    with pytest.raises(SpecError) as e:
        load_task_data(task, data_root=tmp_path)
    assert e.value.file == str(tmp_path / "tasks/toy.yaml")
    assert e.value.key == "data.splits.dev" and "not found" in str(e.value)


def test_unknown_column(tmp_path):
    cls_files(tmp_path)
    task = load_task(write_task(tmp_path, cls_task(columns={"text": "text", "label": "gold"})))
    with pytest.raises(SpecError) as e:
        load_task_data(task, data_root=tmp_path)
    assert e.value.file.endswith("toy.yaml") and e.value.key == "columns.label"
    assert e.value.value == "gold" and e.value.allowed == "label, text"
    assert "line 1" in str(e.value)


def test_empty_split(tmp_path):
    ner_files(tmp_path, dev="\n\n")
    with pytest.raises(SpecError, match="no examples") as e:
        load_task_data(TaskSpec.model_validate(ner_task()), data_root=tmp_path)
    assert e.value.key == "data.splits.dev"


@pytest.mark.parametrize(
    "bad_line, problem",
    [
        ("polyposis", "expected at least 2 columns"),
        ("polyposis\tDisease", "malformed IOB2 tag"),
        ("polyposis\tB-", "malformed IOB2 tag"),
    ],
)
def test_malformed_iob_line_names_its_line_number(tmp_path, bad_line, problem):
    ner_files(tmp_path, train=f"Famil\tO\n\nThe\tO\n{bad_line}\ngene\tO\n")
    with pytest.raises(SpecError, match=problem) as e:
        load_task_data(TaskSpec.model_validate(ner_task()), data_root=tmp_path)
    assert e.value.file == str(tmp_path / "toy/train.tsv") and e.value.key == "line 4"


def test_malformed_json_line(tmp_path):
    cls_files(tmp_path)
    write(tmp_path, "toy/test.jsonl", '{"text": "a", "label": "pos"}\n{"text": \n')
    with pytest.raises(SpecError, match="not valid JSON") as e:
        load_task_data(TaskSpec.model_validate(cls_task()), data_root=tmp_path)
    assert e.value.key == "line 2" and e.value.file.endswith("test.jsonl")


def test_unknown_metric_names_file_and_key(tmp_path):
    path = write_task(tmp_path, cls_task(metrics=["accuracy", "entity_f1"]))
    with pytest.raises(SpecError) as e:
        load_task(path)
    assert e.value.file == str(path) and e.value.key == "metrics.1" and e.value.value == "entity_f1"
    assert "macro_f1" in e.value.allowed


@pytest.mark.parametrize(
    "over, key",
    [
        ({"colums": {}}, "colums"),  # unknown key (typo)
        ({"type": "ner"}, "type"),
        ({"max_length": 2}, "max_length"),
        ({"finetune": {"lr": -1}}, "finetune.lr"),
        ({"finetune": {"method": "qlora"}}, "finetune.method"),
        ({"columns": {"text": "tok", "label": 1}}, "columns.text"),  # conll columns are indexes
        ({"data": {"format": "jsonl", "splits": {"train": "a", "dev": "b", "test": "c"}}}, "data.format"),
        ({"metric_options": {"negative_label": "O"}}, "metric_options.negative_label"),  # not for NER
        ({"labels": {"keep_entity_types": []}}, "labels.keep_entity_types"),
        (
            {"data": {"format": "conll", "dataset": "x", "splits": {"train": "a", "dev": "b", "test": "c"}}},
            "data.dataset",
        ),  # dataset is for format hf
        (
            {
                "data": {
                    "format": "hf",
                    "dataset": "hf:org/name",
                    "delimiter": ",",
                    "splits": {"train": "a", "dev": "b", "test": "c"},
                },
                "columns": {"text": "t", "label": "l"},
            },
            "data.delimiter",
        ),
    ],
)
def test_bad_task_file_keys(tmp_path, over, key):
    path = write_task(tmp_path, ner_task(**over))
    with pytest.raises(SpecError) as e:
        load_task(path)
    assert e.value.file == str(path) and e.value.key == key


def test_missing_key_and_pair_task_without_pair(tmp_path):
    task = ner_task()
    del task["source"]
    with pytest.raises(SpecError, match="missing") as e:
        load_task(write_task(tmp_path, task))
    assert e.value.key == "source"
    with pytest.raises(SpecError) as e:
        load_task(write_task(tmp_path, cls_task(type="sequence_pair_classification")))
    assert e.value.key == "columns.text_pair"


def test_yaml_syntax_error_has_line(tmp_path):
    path = write(tmp_path, "tasks/toy.yaml", "name: toy\nlanguage: [en\ntype: x\n")
    with pytest.raises(SpecError, match="not valid YAML") as e:
        load_task(path)
    assert e.value.file == str(path) and e.value.key.startswith("line ")


def test_unknown_task_name_lists_the_known_ones():
    with pytest.raises(SpecError) as e:
        load_task("ncbi_diseas")
    assert e.value.key == "task" and "ncbi_disease" in e.value.allowed


def test_name_must_match_file_name(tmp_path):
    path = write(tmp_path, "tasks/other.yaml", yaml.safe_dump(ner_task()))
    with pytest.raises(SpecError) as e:
        load_task(path)
    assert e.value.key == "name" and e.value.allowed == "other"


def test_task_file_is_a_mapping(tmp_path):
    with pytest.raises(SpecError, match="mapping"):
        load_task(write(tmp_path, "tasks/toy.yaml", "- a\n- b\n"))


def test_settings_overrides_are_validated_on_top_of_task_defaults():
    task = TaskSpec.model_validate(ner_task(finetune={"lr": 3e-5, "epochs": 4}))
    s = resolve_settings(task, {"epochs": 2, "method": "lora", "lora_target_modules": ["query"]})
    assert (s.lr, s.epochs, s.method, s.lora_target_modules) == (3e-5, 2, "lora", ("query",))
    assert resolve_settings(task) == task.finetune and isinstance(s, FinetuneSettings)
    with pytest.raises(SpecError) as e:
        resolve_settings(task, {"batch_size": 0})
    assert e.value.key == "finetune.batch_size"
    with pytest.raises(SpecError) as e:
        resolve_settings(task, {"learning_rate": 1e-4})
    assert e.value.key == "finetune.learning_rate" and "unknown key" in str(e.value)


def test_task_spec_is_frozen():
    task = TaskSpec.model_validate(ner_task())
    with pytest.raises(Exception):
        task.max_length = 64


# ---------------------------------------------------------------------------------------------------- protocol


@pytest.mark.parametrize("name", list_tasks())
def test_every_task_file_states_the_papers_protocol(name):
    task = load_task(name)
    assert resolve_settings(task) == resolve_settings(task, protocol="paper")
    assert task.finetune.max_length is None  # the length is the task file's max_length alone: no second copy
    if "pooling" in task.entry.reads:
        assert "pooling" in task.finetune.model_fields_set, "a sequence task states its pooling"


def test_the_papers_numbers():
    from ablate.evaluate.protocol import paper_settings

    en_ner, en_cls = paper_settings("en", "token_classification"), paper_settings("en", "sequence_classification")
    fr_cls = paper_settings("fr", "multi_label_classification")
    assert {k: en_cls[k] for k in ("lr", "weight_decay", "batch_size", "epochs", "patience")} == {
        "lr": 5e-5,
        "weight_decay": 0.01,
        "batch_size": 16,
        "epochs": 10,
        "patience": None,
    }
    # BioClinical-ModernBERT's harness: the Trainer's defaults, the head transformers builds, plain BCE
    assert {k: en_cls[k] for k in ("warmup_ratio", "grad_clip", "precision", "pooling")} == {
        "warmup_ratio": 0.0,
        "grad_clip": 1.0,
        "precision": "fp32",
        "pooling": "model",
    }
    assert paper_settings("en", "multi_label_classification")["multi_label_pos_weight"] is False
    assert en_cls["data_seed"] == 42 and en_cls["group_by_length"] is False
    assert en_ner["epochs"] == 20 and paper_settings("fr", "token_classification") == en_ner
    assert (fr_cls["lr"], fr_cls["batch_size"], fr_cls["epochs"], fr_cls["multi_label_pos_weight"]) == (
        2e-5,
        4,
        15,
        True,
    )
    assert (fr_cls["warmup_ratio"], fr_cls["pooling"], fr_cls["data_seed"]) == (0.1, "cls", None)
    assert paper_settings("de", "sequence_classification") == en_cls  # a language the paper lacks: English rules
    # no profile sets a length: the task files hold the paper's (its harness's) lengths, one place each
    assert all(
        "max_length" not in paper_settings(lang, t) for lang in ("en", "fr") for t in ("regression", "span_ner")
    )
    assert load_task("fracco_30").max_length == 4096 and load_task("diamed").max_length == 2048
    assert load_task("deid").max_length == 8192 and load_task("cos").max_length == 8192


def test_settings_resolve_task_file_then_profile_then_overrides():
    task = TaskSpec.model_validate(ner_task(finetune={"lr": 3e-5, "epochs": 4, "eval_batch_size": 7}))
    s = resolve_settings(task, {"epochs": 2}, protocol="paper")
    assert (s.lr, s.epochs, s.eval_batch_size, s.max_length, s.patience) == (5e-5, 2, 7, None, None)
    s = resolve_settings(task, {"lr": 1e-3}, protocol="smoke")
    assert (s.lr, s.epochs, s.max_train_examples, s.max_eval_examples, s.max_length) == (1e-3, 2, 1000, 300, 128)
    assert resolve_settings(task).lr == 3e-5
    with pytest.raises(SpecError) as e:
        resolve_settings(task, protocol="fast")
    assert e.value.key == "--protocol" and e.value.value == "fast" and e.value.allowed.startswith("paper, smoke")


def test_the_smoke_grid_fine_tunes_ncbi_as_before():
    """grids/smoke.yaml switched from its own overrides to the smoke profile: the settings that decide its
    NCBI numbers are those it had (patience, now null, never acts within 2 epochs)."""
    from ablate.config.grid import load_grid
    from ablate.plan.grid import expand

    spec = expand(load_grid(Path(__file__).resolve().parents[1] / "grids" / "smoke.yaml"))[0].spec
    task = load_task("ncbi_disease")
    s = resolve_settings(task, spec.eval.finetune, spec.eval.protocol)
    before = {
        "method": "full",
        "lr": 1e-4,
        "batch_size": 16,
        "eval_batch_size": 64,
        "epochs": 2,
        "max_length": 128,
        "max_train_examples": 1000,
        "max_eval_examples": 300,
        "warmup_ratio": 0.1,
        "weight_decay": 0.01,
        "grad_clip": 1.0,
    }
    assert {k: getattr(s, k) for k in before} == before and (s.patience is None or s.patience >= s.epochs)


def test_negative_label_must_be_one_of_the_declared_labels(tmp_path):
    path = write_task(
        tmp_path, cls_task(labels={"values": ["neg", "pos"]}, metric_options={"negative_label": "0"})
    )
    with pytest.raises(SpecError) as e:
        load_task(path)
    assert (
        e.value.key == "metric_options.negative_label" and e.value.value == "0" and e.value.allowed == "neg, pos"
    )


def test_keep_entity_types_turns_the_other_types_into_o(tmp_path):
    train = "Aspirin\tB-Chemical\ncauses\tO\nulcers\tB-Disease\n"
    ner_files(tmp_path, train=train, dev=train, test=train)
    task = load_task(write_task(tmp_path, ner_task(labels={"keep_entity_types": ["Disease"]})))
    data = load_task_data(task, data_root=tmp_path)
    assert data.splits["test"][0].label == ("O", "O", "B-Disease") and data.labels == ("B-Disease", "O")


def test_a_spread_subset_of_a_label_sorted_split_sees_every_class_and_the_default_keeps_score_ids():
    from ablate.evaluate.identity import settings_hash
    from ablate.evaluate.tasks import capped

    test = load_task_data(load_task("gad")).splits["test"]  # GAD's files are sorted by label
    assert {ex.label for ex in capped(test, 200, "first")} == {"1"}
    spread = capped(test, 200, "spread")
    assert len(spread) == 200 and {ex.label for ex in spread} == {"0", "1"}
    where = {id(ex): i for i, ex in enumerate(test)}
    positions = [where[id(ex)] for ex in spread]
    assert positions == sorted(set(positions))  # file order kept, no example twice
    assert capped(test, None, "spread") == test and capped(test, 10_000, "spread") == test
    first = FinetuneSettings(max_train_examples=200)
    assert settings_hash(first) == settings_hash(FinetuneSettings(max_train_examples=200, subset="first"))
    assert settings_hash(first) != settings_hash(FinetuneSettings(max_train_examples=200, subset="spread"))
