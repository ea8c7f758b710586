"""`ablate calibrate GRID`: the throughput of a grid's steps on this machine, stored with the sweep.

For each distinct (model, objective, sequence length, batch) of the grid: the engine's own setup and train
step (ablate.train.loop.setup / train_step, as bench/pretrain_step.py runs them), `warmup` untimed steps
then `steps` timed ones, nothing frozen (a frozen phase only goes faster), on the device the spec picks.
With fine-tuning: for each distinct (model, task, fine-tuning settings) the engine's own fine-tuning
(ablate.evaluate.finetune) on the task's first batches, one pass (a max_steps task too: the cost plan counts
its steps), timed between its per-step progress reports (train examples/s) and across its dev evaluation (eval
examples/s). For each model with fine-tuning, whether or not fine-tuning is timed: its step floor, the seconds
of a fine-tuning step at FLOOR_TOKENS tokens per example (what the cost plan prices an unmeasured fine-tuning's
steps at).

The result goes to <sweep>/calibration.json (atomically) with the hardware, the torch version and the
date; `ablate sweep --dry-run` and `ablate status` read it (ablate.launch.estimates).

May import: config, store, models, plan, train, evaluate, launch.estimates.
"""

from __future__ import annotations

import datetime
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Callable

from ablate.config.errors import SpecError
from ablate.config.objectives.base import OBJECTIVE_FIELDS
from ablate.config.spec import PhaseSpec, RunSpec
from ablate.launch.estimates import finetune_plan
from ablate.plan.cost import Calibration, Combo, FinetuneRate, PretrainRate, StepFloor, pretraining_combos
from ablate.store import atomic
from ablate.store.sweep import SweepFolder

Print = Callable[[str], None]
FLOOR_TOKENS = 16  # tokens per example of the step-floor timing: next to no FLOPs


def check_steps(steps: int, warmup: int) -> None:
    if steps < 1:
        raise SpecError("at least one timed step is needed", key="--steps", value=steps, allowed="an integer >= 1")
    if warmup < 1:  # fine-tuning is timed from the report of the last untimed step
        raise SpecError(
            "at least one untimed step comes first", key="--warmup", value=warmup, allowed="an integer >= 1"
        )


def hardware(device: str) -> dict:
    """What the numbers were measured on."""
    import torch

    info = {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
    }
    if device.startswith("cuda"):
        info.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count())
    try:
        info["load_avg"] = [round(x, 2) for x in os.getloadavg()]  # > the cores: the machine was shared
    except OSError:
        pass
    return info


def _one_phase(spec: RunSpec, objective: str, steps: int) -> RunSpec:
    """The spec with one phase of `objective` (with the objective fields of its longest such phase: the mask
    rate, a mixture's members), nothing frozen, `steps` long."""
    lengths = spec.phase_steps()
    longest = max((i for i, p in enumerate(spec.phases) if p.objective == objective), key=lambda i: lengths[i])
    fields = spec.phases[longest].model_dump(include={"objective", *OBJECTIVE_FIELDS})
    phase = PhaseSpec.model_validate({**fields, "name": objective.replace("-", "_"), "steps": steps})
    return spec.model_copy(update={"phases": (phase,), "budget_tokens": None})


def time_pretraining(spec: RunSpec, objective: str, steps: int, warmup: int) -> PretrainRate:
    """tokens/s of `steps` train steps of `objective` after `warmup` untimed ones, through the engine's loop."""
    import torch

    from ablate.train.freezing import apply_freeze
    from ablate.train.loop import Optimizer, fused_adamw, setup, train_step

    one = _one_phase(spec, objective, warmup + steps)
    ctx, _tokenizer, [plan] = setup(one)
    opt = Optimizer(ctx.model, one, fused=fused_adamw(ctx.device))
    apply_freeze(ctx.model, ctx.family, plan.frozen)
    opt.set_trainable()
    ctx.model.train()
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    times = []
    for step in range(warmup + steps):
        idx = ctx.order.take(step * one.batch_size, one.batch_size)
        sync()
        start = time.perf_counter()
        train_step(ctx, plan, ctx.sequences[idx], ctx.doc_ids[idx], step, opt, one.optim.lr)
        sync()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    return PretrainRate(
        model=spec.model,
        objective=objective,
        seq_len=spec.data.seq_len,
        batch_size=spec.batch_size,
        tokens_per_s=one.tokens_per_step * len(times) / sum(times),
        device=str(ctx.device),
        warmup=warmup,
        step_s=tuple(round(t, 4) for t in times),
    )


def _rates_from_reports(
    reports: list[tuple[float, int]], warmup: int, batch: int, n_train: int, n_dev: int
) -> tuple[float, float, int]:
    """(train examples/s, eval examples/s, timed steps) from fine-tuning's progress reports (time, step): the
    reports whose step moved on are training steps; the one after the last step, at the same step, comes
    after the dev evaluation."""
    moved = [(t, s) for i, (t, s) in enumerate(reports) if i == 0 or s > reports[i - 1][1]]
    timed = [(t, s) for t, s in moved if s >= warmup]
    after_eval = [t for t, s in reports if s == moved[-1][1]][-1] if moved else None
    if len(timed) < 2 or after_eval is None or after_eval <= timed[-1][0]:
        raise RuntimeError(f"fine-tuning reported too few steps to time ({[s for _, s in reports]})")
    (t0, s0), (t1, s1) = timed[0], timed[-1]
    examples = min(n_train, s1 * batch) - s0 * batch
    return examples / (t1 - t0), n_dev / (after_eval - t1), s1 - s0


def timed_settings(settings, n_train: int, n_dev: int):
    """The fine-tuning settings the calibration runs: one pass over `n_train` examples then one dev evaluation of
    `n_dev` (a max_steps task's steps and evaluation interval dropped, so that it stops there too)."""
    return settings.model_copy(
        update={
            "epochs": 1,
            "patience": None,
            "max_train_examples": n_train,
            "max_eval_examples": n_dev,
            "max_steps": None,
            "eval_every": None,
        }
    )


def time_finetuning(
    spec: RunSpec, task_name: str, settings, key_settings: str, model_dir: Path, steps: int, warmup: int
) -> FinetuneRate:
    """Train and eval examples/s of the engine's fine-tuning of `model_dir` on the task's first
    (warmup + steps) batches, one epoch, a dev set of two evaluation batches."""
    from ablate.evaluate.finetune import finetune
    from ablate.evaluate.tasks import load_task, load_task_data
    from ablate.config.device import pick_device

    task = load_task(task_name)
    splits = load_task_data(task, spec.data.data_root).splits
    n_train = min(len(splits["train"]), settings.batch_size * (warmup + steps))
    n_dev = min(len(splits["dev"]), 2 * settings.eval_batch_size)
    short = timed_settings(settings, n_train, n_dev)
    device = str(pick_device(spec.device))
    reports: list[tuple[float, int]] = []
    finetune(
        str(model_dir),
        task,
        0,
        short,
        data_root=spec.data.data_root,
        device=device,
        progress=lambda p: reports.append((time.perf_counter(), int(p["step"]))),
    )
    train_rate, eval_rate, timed = _rates_from_reports(reports, warmup, settings.batch_size, n_train, n_dev)
    return FinetuneRate(
        model=spec.model,
        task=task.name,
        settings=key_settings,
        train_examples_per_s=train_rate,
        eval_examples_per_s=eval_rate,
        device=device,
        warmup=warmup,
        steps=timed,
    )


def time_step_floor(
    spec: RunSpec, task_name: str, settings, model_dir: Path, steps: int, warmup: int
) -> StepFloor:
    """Seconds of one fine-tuning step of the model at its batch with FLOOR_TOKENS tokens per example: what a
    step costs when its FLOPs are next to nothing (kernel launches, the optimizer), the floor the cost plan
    prices a fine-tuning at where its examples/s were not measured (ablate.plan.cost.finetune_time)."""
    short = settings.model_copy(update={"max_length": FLOOR_TOKENS})
    rate = time_finetuning(spec, task_name, short, "", model_dir, steps, warmup)
    return StepFloor(
        model=spec.model,
        batch_size=settings.batch_size,
        step_s=settings.batch_size / rate.train_examples_per_s,
        device=rate.device,
        tokens=FLOOR_TOKENS,
    )


def _model_folder(spec: RunSpec, root: Path) -> Path:
    """The spec's model saved as a run saves its final model: what fine-tuning starts from."""
    from ablate.models.loading import load_masked_lm, load_tokenizer
    from ablate.train.checkpoint import save_final_model

    out = root / "model"
    save_final_model(
        load_masked_lm(spec.model, spec.attn_implementation, spec.seed),
        load_tokenizer(spec.tokenizer or spec.model),
        out,
    )
    return out


def calibrate(
    sweep: str,
    grid_file: Path,
    specs: list[RunSpec],
    results_root: Path,
    steps: int,
    warmup: int,
    finetune: bool = True,
    out: Print = print,
) -> tuple[Path, Calibration]:
    """Time every combination of the grid's specs and write <results>/<sweep>/calibration.json."""
    import torch

    check_steps(steps, warmup)
    # the fine-tuning plan reads every task's data and settings: checked before anything is timed or cached
    jobs = finetune_plan(specs).jobs if any(s.eval.tasks for s in specs) else {}
    first: dict[Combo, RunSpec] = {}
    for spec in specs:
        for combo in pretraining_combos([spec]):
            first.setdefault(combo, spec)
    pretraining = []
    for combo, spec in first.items():
        rate = time_pretraining(spec, combo.objective, steps, warmup)
        out(
            f"{combo.describe()}: {rate.tokens_per_s:,.0f} tokens/s on {rate.device} "
            f"({steps} steps after {warmup} untimed)"
        )
        pretraining.append(rate)
    finetuning, floors = [], []
    folders: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="ablate-calibrate-") as tmp:
        for key, (spec, settings) in jobs.items():
            if key.model in folders:
                continue
            folders[key.model] = _model_folder(spec, Path(tmp) / str(len(folders)))
            floor = time_step_floor(spec, key.task, settings, folders[key.model], steps, warmup)
            out(
                f"fine-tuning step floor {key.model}: {floor.step_s * 1000:,.1f} ms per step of "
                f"{floor.batch_size} x {floor.tokens} tokens on {floor.device}"
            )
            floors.append(floor)
        for key, (spec, settings) in jobs.items() if finetune else ():
            rate = time_finetuning(spec, key.task, settings, key.settings, folders[key.model], steps, warmup)
            out(
                f"fine-tuning {key.model} {key.task}: {rate.train_examples_per_s:,.1f} train examples/s, "
                f"{rate.eval_examples_per_s:,.1f} eval examples/s on {rate.device}"
            )
            finetuning.append(rate)
    device = pretraining[0].device
    calibration = Calibration(
        sweep=sweep,
        grid_file=str(Path(grid_file).resolve()),
        created=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        hardware=hardware(device),
        torch=torch.__version__,
        pretraining=tuple(pretraining),
        finetuning=tuple(finetuning),
        step_floors=tuple(floors),
    )
    path = SweepFolder(Path(results_root) / sweep).calibration
    atomic.write_json(path, calibration.model_dump(mode="json"))
    return path, calibration
