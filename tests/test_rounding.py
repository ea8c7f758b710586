"""Lengths the harness rounds to whole optimizer steps are said (a warning naming the value and what it
becomes); seeds listed twice are refused (exit 2), in a grid, a suite and on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ablate.config.errors import SpecError
from ablate.config.spec import parse_run_spec
from ablate.plan.rounding import rounding_notes
from builders import detour_spec

# detour_spec: batch_size 4 x seq_len 32 = 128 tokens a step


def _lines(specs) -> list[str]:
    """The notes, then the warnings, rounding_notes gives."""
    notes, warnings = rounding_notes(specs)
    return notes + warnings


def test_a_phase_in_tokens_that_is_not_whole_steps_says_what_it_trains():
    spec = parse_run_spec(
        detour_spec(
            phases=[
                {"name": "a", "objective": "mlm", "tokens": 1000},
                {"name": "b", "objective": "mlm", "tokens": 256},
            ]
        )
    )
    assert spec.phase_steps() == [8, 2]
    assert _lines([spec]) == [
        "phase lengths in tokens round up to whole steps of 128 tokens "
        "(batch_size x data.seq_len): a 1,000 -> 8 steps (1,024 tokens)"
    ]


def test_fractions_under_one_step_and_a_budget_no_phase_reads_are_said():
    tiny = parse_run_spec(
        detour_spec(
            budget_tokens=12_800,
            phases=[
                {"name": "a", "objective": "mlm", "fraction": 0.995},
                {"name": "b", "objective": "mlm", "fraction": 0.005},
            ],
        )
    )
    assert tiny.phase_steps()[1] == 1
    unused = parse_run_spec(detour_spec(budget_tokens=5000))
    fine = parse_run_spec(detour_spec())
    assert _lines([tiny, unused, fine]) == [
        "phase b: fraction 0.005 of budget_tokens is 64 tokens, under one step of 128: it trains 1 step (1 of 3 runs)",
        "budget_tokens 5,000 is read by no phase (none gives its length as a fraction): the phases' own steps or "
        "tokens decide the length (1 of 3 runs)",
    ]
    odd = parse_run_spec(
        detour_spec(budget_tokens=1000, phases=[{"name": "a", "objective": "mlm", "fraction": 1.0}])
    )
    assert _lines([odd]) == [
        "budget_tokens 1,000 is 7.81 steps of 128 tokens: the fractions' phases "
        "train 8 steps in all (1,024 tokens)"
    ]
    assert _lines([fine]) == []


def test_the_dry_run_prints_the_rounding(tmp_path, capsys, data_root):
    from ablate.cli import main

    grid = yaml.safe_load((Path(__file__).parent / "grids" / "tiny.yaml").read_text())
    grid["schedules"]["mlm"][0] = {"name": "mlm", "objective": "mlm", "tokens": 300}
    grid["axes"] = {"schedule": ["mlm"]}
    grid.pop("exclude")
    (path := tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    assert main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "note: phase lengths in tokens round up to whole steps of 128 tokens" in err
    assert "mlm 300 -> 3 steps (384 tokens)" in err


@pytest.mark.parametrize("evaluation", [{"tasks": ["chemprot"], "seeds": [0, 1, 0]}])
def test_a_seed_listed_twice_is_refused(evaluation):
    with pytest.raises(SpecError) as exc:
        parse_run_spec(detour_spec(eval=evaluation), file="g.yaml")
    assert str(exc.value) == (
        "g.yaml: eval.seeds: fine-tuning seed 0 is listed twice; allowed: each fine-tuning seed once"
    )


def test_a_suite_or_the_command_line_listing_a_seed_twice_is_refused(tmp_path, monkeypatch):
    from ablate.evaluate import suites

    (tmp_path / "twice.yaml").write_text(yaml.safe_dump({"name": "twice", "seeds": [1, 1], "tasks": ["chemprot"]}))
    (tmp_path / "task.yaml").write_text(
        yaml.safe_dump({"name": "task", "seeds": [1], "tasks": [{"task": "chemprot", "seeds": [2, 3, 2]}]})
    )
    monkeypatch.setenv(suites.SUITES_DIR_ENV, str(tmp_path))
    with pytest.raises(SpecError, match="seeds: fine-tuning seed 1 is listed twice") as exc:
        suites.eval_items(["suite:twice"], (0,))
    assert exc.value.file == str(tmp_path / "twice.yaml")
    with pytest.raises(SpecError, match=r"tasks\[0\].*seeds: fine-tuning seed 2 is listed twice"):
        suites.eval_items(["suite:task"], (0,))
    with pytest.raises(SpecError) as exc:
        suites.eval_items(["chemprot"], (0,), seeds_override=(4, 4))
    assert exc.value.key == "--seeds" and "fine-tuning seed 4 is listed twice" in exc.value.message


def test_fine_tuning_caps_past_a_tasks_data_are_said_in_the_dry_run(tmp_path, capsys, data_root):
    from ablate.cli import main
    from ablate.evaluate.tasks import load_task, load_task_data

    grid = yaml.safe_load((Path(__file__).parent / "grids" / "tiny.yaml").read_text())
    grid["axes"] = {"schedule": ["mlm"]}
    grid.pop("exclude")
    grid["base"]["eval"] = {"tasks": ["biosses"], "finetune": {"max_train_examples": 8, "max_eval_examples": 500}}
    (path := tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    assert main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    splits = load_task_data(load_task("biosses")).splits
    for split in ("dev", "test"):
        n = len(splits[split])
        assert (
            f"warning: biosses: max_eval_examples 500 is more than its {n:,} {split} examples: all {n:,} are used"
            in out
        ), out
    assert "max_train_examples 8 is more" not in out


def test_a_label_listed_twice_in_a_task_file_is_refused(tmp_path):
    from ablate.evaluate.tasks import load_task

    spec = yaml.safe_load(Path(load_task("chemprot").file).read_text())
    spec["labels"] = {"values": ["CPR:3", "CPR:4", "CPR:3"]}
    (path := tmp_path / "chemprot_twice.yaml").write_text(yaml.safe_dump({**spec, "name": "chemprot_twice"}))
    with pytest.raises(SpecError) as exc:
        load_task(str(path))
    assert str(exc.value) == f"{path}: labels.values: label 'CPR:3' is listed twice; allowed: each label once"


def test_max_documents_past_the_corpus_is_said_when_it_is_prepared(tmp_path, capsys, minilm_tokenizer):
    from ablate.config.spec import DataSpec
    from ablate.data.prepare import prepare

    text = tmp_path / "small.txt"
    text.write_text("one document\n\nanother one\na third\n")
    prepare(
        DataSpec(corpus=str(text), max_documents=10, prepared_root=str(tmp_path / "p")),
        minilm_tokenizer,
        workers=1,
        show=False,
    )
    err = capsys.readouterr().err
    assert f"warning: data.max_documents 10 is more than the corpus's 3 documents ({text}): all 3 are used" in err
    prepare(
        DataSpec(corpus=str(text), max_documents=3, prepared_root=str(tmp_path / "q")),
        minilm_tokenizer,
        workers=1,
        show=False,
    )
    assert "max_documents" not in capsys.readouterr().err


def test_a_warmup_longer_than_its_phase_or_rounding_to_nothing_is_said():
    spec = parse_run_spec(
        detour_spec(
            phases=[
                {"name": "a", "objective": "mlm", "steps": 3, "lr": {"warmup_steps": 5}},
                {"name": "b", "objective": "mlm", "steps": 4, "lr": {"warmup_fraction": 0.1}},
                {"name": "c", "objective": "mlm", "steps": 20, "lr": {"warmup_fraction": 0.1}},
            ]
        )
    )
    assert _lines([spec]) == [
        "phase a: lr.warmup_steps 5 is more than its 3 steps: it warms up over all 3 and reaches the peak LR at its "
        "last step",
        "phase b: lr.warmup_fraction 0.1 of its 4 steps rounds to 0 steps: it has no warmup",
    ]
