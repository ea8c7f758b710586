"""The paper's suites (grids/suites/fr_paper, en_paper, fr_decay) and grids (freeze, decay, decay_large): the
task lists are the paper's; a suite task whose data the data root lacks is skipped, named with how to get it
(dry run and `ablate evaluate`) and recorded in the scores folder; a task a grid names directly without its
data is exit 2; `ablate evaluate --suite NAME` is `--task suite:NAME`.

The dry-run tests read a registry in a temporary folder: grids/tasks plus stand-in task files for the tasks other
files add (their data absent, one stand-in with a tiny data set of its own); the registry tests read the
shipped one as it is once every task file is there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.data.catalog import catalog
from ablate.evaluate import suites
from ablate.evaluate.access import Access, how_to_get, missing_paths
from ablate.evaluate.score_files import read_skipped, record_skipped
from ablate.evaluate.tasks import list_tasks, load_task
from ablate.plan.grid import expand
from ablate.config.grid import load_grid

REPO = Path(__file__).resolve().parents[1]
FR_PAPER = [
    "fracco_30",
    "fracco_100",
    "cantemist",
    "distemist",
    "meddialog_fr",
    "diamed",
    "quaero_emea_spans",
    "quaero_medline_spans",
]
EN_PAPER = [
    "chemprot_blue",
    "phenotyping",
    "cos",
    "social_history",
    "deid",
    "anatem",
    "bc5cdr",
    "jnlpba",
    "ncbi_disease",
    "gad",
    "hoc",
]
FR_DECAY = ["diamed", "fracco_30", "fracco_100"]
BROUGHT = ("meddialog_fr", "phenotyping")


def _suite_file(name: str) -> dict:
    return yaml.safe_load((REPO / "grids" / "suites" / f"{name}.yaml").read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------- the shipped files


def test_the_paper_suites_hold_exactly_the_papers_tasks_and_seeds():
    for name, tasks, seeds in (
        ("fr_paper", FR_PAPER, range(9)),
        ("en_paper", EN_PAPER, range(5)),
        ("fr_decay", FR_DECAY, range(9)),
    ):
        suite = suites.SuiteSpec.model_validate(_suite_file(name))
        assert [e.task for e in suite.entries()] == tasks and suite.seeds == tuple(seeds), name
        assert not suite.finetune and all(e.seeds is None for e in suite.entries())  # the task files' protocol
    assert [e.task for e in suites.SuiteSpec.model_validate(_suite_file("fr_public")).entries()] == [
        "quaero_emea",
        "quaero_medline",
        "mantragsc_fr_emea",
        "mantragsc_fr_medline",
        "mantragsc_fr_patents",
        "morfitt",
        "e3c_fr_ner",
        "frenchmedmcqa_nbr",
    ]


def test_every_task_of_the_paper_suites_has_its_task_file():
    """Registry level: true once every engineer's task files are in grids/tasks."""
    for name in ("fr_paper", "en_paper", "fr_decay"):
        assert [e.task for e in suites.load_suite(name).entries()] == [
            t if isinstance(t, str) else t["task"] for t in _suite_file(name)["tasks"]
        ]


def test_every_task_whose_data_no_catalogued_dataset_holds_says_how_to_get_it():
    for name in list_tasks():
        task = load_task(name)
        how = how_to_get(task)
        if task.access is None:
            assert how.startswith("`ablate data fetch "), f"{name}: no catalogued dataset and no access block"
        elif task.access.kind == "fetch":
            assert task.access.dataset in catalog(), name
    for name in BROUGHT:
        access = load_task(name).access
        assert access.kind == "brought" and f"{name}/{{train,dev,test}}.jsonl" in access.place
        assert '{"id", "text", "labels"}' in access.place


def test_an_access_block_needs_what_its_kind_reads():
    with pytest.raises(ValueError, match="access of kind brought needs obtain"):
        Access.model_validate({"kind": "brought", "source": "s", "place": "p"})
    with pytest.raises(ValueError, match="never read with kind fetch"):
        Access.model_validate({"kind": "fetch", "dataset": "ncbi_disease", "place": "p"})


def test_the_brought_task_files_read_the_stated_format(tmp_path):
    """meddialog_fr and phenotyping read {"id","text","labels"} lines at their stated paths."""
    from ablate.evaluate.tasks import load_task_data

    rows = {
        "meddialog_fr": [("Question: q1\n\nRéponse: a1", ["C001", "C002"]), ("Question: q2", ["C002"])],
        "phenotyping": [("note one", ["OBESITY", "DEPRESSION"]), ("note two", [])],
    }
    for name, examples in rows.items():
        task = load_task(name)
        assert missing_paths(task, tmp_path) == [f"{name}/{s}.jsonl" for s in ("train", "dev", "test")]
        for split in ("train", "dev", "test"):
            path = tmp_path / name / f"{split}.jsonl"
            path.parent.mkdir(exist_ok=True)
            path.write_text(
                "".join(
                    json.dumps({"id": str(i), "text": t, "labels": labels}) + "\n"
                    for i, (t, labels) in enumerate(examples)
                ),
                encoding="utf-8",
            )
        assert missing_paths(task, tmp_path) == []
        data = load_task_data(task, tmp_path)
        assert [(e.text, e.label) for e in data.splits["test"]] == [(t, tuple(sorted(l))) for t, l in examples]
    assert len(load_task_data(load_task("phenotyping"), tmp_path).labels) == 14


# ------------------------------------------------------------------------------------------- a temp registry

STAND_IN = {
    "language": "fr",
    "type": "multi_label_classification",
    "source": "a stand-in for the real task file",
    "columns": {"text": "text", "label": "labels"},
    "metrics": ["micro_f1"],
}


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """grids/tasks plus stand-ins for the other engineers' tasks (data absent), and `present_task`, a stand-in
    whose tiny data lies in the temporary folder (absolute paths), as the one task of fr_paper the root has."""
    tasks = tmp_path / "tasks"
    shutil.copytree(REPO / "grids" / "tasks", tasks)
    for name in dict.fromkeys(FR_PAPER + EN_PAPER):
        if not (tasks / f"{name}.yaml").exists():
            splits = {s: f"{name}/{s}.jsonl" for s in ("train", "dev", "test")}
            (tasks / f"{name}.yaml").write_text(
                yaml.safe_dump({"name": name, **STAND_IN, "data": {"format": "jsonl", "splits": splits}})
            )
    for name in (
        "quaero_emea_spans",
        "quaero_medline_spans",
    ):  # the data root has QUAERO's BRAT files: here absent
        task = yaml.safe_load((tasks / f"{name}.yaml").read_text())
        task["data"]["splits"] = {s: f"absent_quaero_brat/{s}" for s in ("train", "dev", "test")}
        (tasks / f"{name}.yaml").write_text(yaml.safe_dump(task, allow_unicode=True))
    data = tmp_path / "present"
    data.mkdir()
    for split in ("train", "dev", "test"):
        (data / f"{split}.jsonl").write_text(
            "".join(json.dumps({"text": f"texte {i}", "labels": [f"L{i % 2}"]}) + "\n" for i in range(6))
        )
    splits = {s: str(data / f"{s}.jsonl") for s in ("train", "dev", "test")}
    (tasks / "present_task.yaml").write_text(
        yaml.safe_dump({"name": "present_task", **STAND_IN, "data": {"format": "jsonl", "splits": splits}})
    )
    suites_dir = tmp_path / "suites"
    shutil.copytree(REPO / "grids" / "suites", suites_dir)
    fr = _suite_file("fr_paper")
    (suites_dir / "fr_paper_one_present.yaml").write_text(
        yaml.safe_dump({**fr, "name": "fr_paper_one_present", "tasks": fr["tasks"] + ["present_task"]})
    )
    # the causal preflight builds and runs the whole model (tests/test_grid.py checks it on these grids): these
    # tests are about the evaluation's part of the checks
    monkeypatch.setattr("ablate.launch.checks.check_models", lambda specs, file=None: {})
    monkeypatch.setenv("ABLATE_TASKS_DIR", str(tasks))
    monkeypatch.setenv(suites.SUITES_DIR_ENV, str(suites_dir))
    suites._read_suite.cache_clear()
    return tmp_path


def test_a_suite_runs_the_tasks_it_has_and_names_the_others_with_how_to_get_them(registry):
    items = suites.eval_items(["suite:fr_paper_one_present"], (0,))
    present, skipped = suites.present_items(items)
    assert [i.task for i in present] == ["present_task"] and [s.task for s in skipped] == FR_PAPER
    by_task = {s.task: s for s in skipped}
    assert (
        by_task["meddialog_fr"].how.startswith("brought: MedDialog-FR")
        and "place: meddialog_fr/" in by_task["meddialog_fr"].how
    )
    assert by_task["diamed"].missing == ("diamed/train.jsonl", "diamed/dev.jsonl", "diamed/test.jsonl")
    lines = suites.skipped_lines(skipped)
    assert lines[0].startswith("suite:fr_paper_one_present: 8 task(s) skipped, the data root lacks them")
    assert "partial" in lines[0] and lines[1:] == [f"  {s.task}: {s.how}" for s in skipped]


def test_the_freeze_dry_run_lists_fr_papers_tasks_and_names_the_missing_ones(registry, capsys):
    assert (
        main(
            [
                "sweep",
                str(REPO / "grids" / "freeze.yaml"),
                "--dry-run",
                "--tokens-per-s",
                "300000",
                "--results",
                str(registry / "r"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"  suite:fr_paper: 8 tasks ({', '.join(FR_PAPER)}), fine-tuning seeds 0-8" in out
    assert (
        "  suite:fr_paper: 8 task(s) skipped, the data root lacks them (the suite's average will be partial)"
        in out
    )
    assert "    meddialog_fr: brought: MedDialog-FR women" in out and "access: ask the MedDialog-FR" in out
    assert "5 runs, 7 transplants;" in out


def test_a_grid_naming_a_missing_task_directly_is_exit_2_with_file_key_value_and_the_way(registry, capsys):
    tiny = yaml.safe_load((REPO / "tests" / "grids" / "tiny.yaml").read_text())
    grid = {
        **{k: v for k, v in tiny.items() if k != "exclude"},
        "axes": {"schedule": ["mlm"], "freeze": ["none"]},
        "base": {**tiny["base"], "eval": {"tasks": ["ncbi_disease", "phenotyping"]}},
    }
    (path := registry / "insists.yaml").write_text(yaml.safe_dump(grid))
    assert main(["sweep", str(path), "--dry-run", "--results", str(registry / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: {path}: base.eval.tasks: eval task 'phenotyping' is named directly but the "
        "data root lacks phenotyping/train.jsonl"
    )
    assert "got 'phenotyping'" in err and "brought: PhysioNet" in err and "PhysioNet credentialed" in err
    with pytest.raises(SpecError) as exc:  # through a suite the same task is skipped, not an error
        suites.present_items(suites.eval_items(["phenotyping"], (0,)), key="eval.tasks", file="g.yaml")
    assert (exc.value.file, exc.value.key, exc.value.value) == ("g.yaml", "eval.tasks", "phenotyping")


def test_evaluate_suite_is_task_suite_and_records_the_skipped_tasks(registry, capsys):
    """The README's first GPU check, its dry part: nothing of fr_paper is here, so nothing loads a model."""
    results = registry / "results"
    assert (
        main(
            [
                "evaluate",
                "--base",
                "hub:almanach/ModernCamemBERT-bio-base",
                "--base-only",
                "--suite",
                "fr_paper",
                "--results",
                str(results),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "suite:fr_paper: 8 task(s) skipped" in out and "  diamed: `ablate data fetch diamed`" in out
    scores = results / "base" / "base-ModernCamemBERT-bio-base" / "scores"
    assert f"base model scores in {scores}" in out
    held = read_skipped(scores)
    assert sorted(held) == sorted(FR_PAPER) and held["meddialog_fr"]["suite"] == "suite:fr_paper"
    assert held["fracco_30"]["missing"] == [f"fracco_30/{s}.jsonl" for s in ("train", "dev", "test")]
    assert (
        main(
            [
                "evaluate",
                "--base",
                "hub:almanach/ModernCamemBERT-bio-base",
                "--base-only",
                "--task",
                "suite:fr_paper",
                "--results",
                str(results),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.splitlines()[0] == out.splitlines()[0]  # --suite NAME = --task suite:NAME
    assert main(["evaluate", "--base-only", "--results", str(results)]) == 2  # nothing named
    assert "nothing to evaluate" in capsys.readouterr().err


def test_a_task_scored_later_leaves_the_skipped_record(tmp_path):
    skipped = [suites.Skipped("a", "s", ("a/train.jsonl",), "how a"), suites.Skipped("b", "s", ("b/x",), "how b")]
    assert set(record_skipped(tmp_path, [], skipped)) == {"a", "b"}
    assert set(record_skipped(tmp_path, ["a"], [])) == {"b"}
    assert read_skipped(tmp_path)["b"] == {"task": "b", "suite": "suite:s", "missing": ["b/x"], "how": "how b"}
    assert record_skipped(tmp_path, ["b"], []) == {} and not (tmp_path / "skipped.json").exists()


# ------------------------------------------------------------------------------------------- the decay grids


def _decay_shares(grid_file: str) -> dict[str, tuple[int, float]]:
    runs = expand(load_grid(str(REPO / "grids" / grid_file)))
    shares = {}
    for run in runs:
        main_phase, decay = run.spec.phases
        shares[run.axes["schedule"]] = (main_phase.tokens, round(decay.tokens / main_phase.tokens, 4))
        assert decay.objective == "mlm" and run.spec.seed == 17
    return shares


def test_the_decay_grids_are_the_papers_lengths_objectives_and_tasks():
    base = _decay_shares("decay.yaml")
    assert set(base) == {f"{o}_{d}" for o in ("mlm", "clm") for d in ("d025", "d10", "d20", "d30", "d50")}
    assert {share for _, share in base.values()} == {0.025, 0.1, 0.2, 0.3, 0.5}
    assert {tokens for tokens, _ in base.values()} == {10_000_000_000}
    large = _decay_shares("decay_large.yaml")
    assert {share for _, share in large.values()} == {0.04, 0.1, 0.2} and len(large) == 6
    assert {tokens for tokens, _ in large.values()} == {25_000_000_000}
    for grid_file, model in (("decay.yaml", "base"), ("decay_large.yaml", "large")):
        grid = load_grid(str(REPO / "grids" / grid_file))
        assert grid.base["eval"]["tasks"] == ["suite:fr_decay"] and grid.branching
        assert grid.base["model"] == f"hub:almanach/moderncamembert-{model}"


def test_the_decay_dry_run_lists_the_papers_ratios_and_its_three_tasks(registry, capsys):
    assert (
        main(
            [
                "sweep",
                str(REPO / "grids" / "decay.yaml"),
                "--dry-run",
                "--tokens-per-s",
                "300000",
                "--results",
                str(registry / "r"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "  suite:fr_decay: 3 tasks (diamed, fracco_30, fracco_100), fine-tuning seeds 0-8" in out
    phase_rows = [line.split() for line in out.splitlines() if " mlm_decay " in line]
    # each length's decay phase, MLM and CLM twins alike: 2.5 / 10 / 20 / 30 / 50 % of 10B, in whole steps
    for share, decay_tokens in (
        ("d025", "248,512,512"),
        ("d10", "997,195,776"),
        ("d20", "1,997,537,280"),
        ("d30", "2,997,878,784"),
        ("d50", "5,001,707,520"),
    ):
        assert {row[1] for row in phase_rows if row[-1] == decay_tokens} == {f"mlm_{share}", f"clm_{share}"}
    assert "10 runs, 2 transplants;" in out
    assert "model hub:almanach/moderncamembert-base (modernbert, 22 layers)" in out


def test_moderncamembert_large_ships_its_config():
    from ablate.models.loading import load_config

    config = load_config("config:moderncamembert-large")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (28, 1024, 16)
    assert (config.vocab_size, config.pad_token_id, config.cls_token_id, config.sep_token_id) == (32768, 0, 1, 2)
