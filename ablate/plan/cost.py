"""The cost of a sweep before it runs: per arm and in total, the optimizer steps, the tokens and, given a
throughput, the hours of pretraining, the hours of fine-tuning (from the examples/s `ablate calibrate` measured,
else estimated from its FLOPs at the pretraining's FLOP rate: ablate.plan.finetune_flops; marked so) and the
GPU-hours; and, once runs have finished, the estimate against what they took. Pure arithmetic over RunSpecs and
numbers, plus the calibration file's schema and whether a calibration fits a grid.

Timing steps and reading or writing the calibration file is ablate.launch.calibrate; gathering what the
estimate needs from a grid, a sweep folder and the task files is ablate.launch.estimates.

The throughput of a pretraining phase is the tokens/s of one process (one GPU) for its (model, objective,
sequence length, batch); a run of N data-parallel ranks is taken to go N times as fast (linear scaling, an
optimistic bound). Only the training steps are counted: not loading, checkpoints or phase-end probes.
A job holds its GPUs through pretraining and fine-tuning, so GPU-hours = (both) x GPUs per run.

May import: config, store, plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from pydantic import Field

from ablate.config.base import Strict
from ablate.config.errors import SpecError
from ablate.config.spec import RunSpec
from ablate.store.sweep import format_duration

# The launch-bound floor of one fine-tuning step where `ablate calibrate` has not measured it: a fixed part (the
# optimizer, clipping, the loss and head, the batch's copy) and a part per encoder layer (eager PyTorch launches
# about 75 kernels per layer per training step, forward and backward, at ~15 us of host time each). A step of
# 16 short sequences through 22 layers is bound by these launches, not by its FLOPs. docs/performance.md.
DEFAULT_FLOOR_FIXED_S = 0.003
DEFAULT_FLOOR_PER_LAYER_S = 0.0011
FORWARD_SHARE = 1 / 3  # an evaluation batch's floor, of a training step's

HOW_TO_GET_HOURS = (
    "for hours and GPU-hours, run `ablate calibrate {grid}` on the target hardware (it stores the "
    "measured tokens/s with the sweep) or pass --tokens-per-s N"
)


class Combo(NamedTuple):
    """What one pretraining throughput is measured for."""

    model: str
    objective: str
    seq_len: int
    batch_size: int

    def describe(self) -> str:
        return f"{self.model} {self.objective} {self.batch_size}x{self.seq_len}"


def combo_of(spec: RunSpec, objective: str) -> Combo:
    return Combo(spec.model, objective, spec.data.seq_len, spec.batch_size)


def phase_combo(spec: RunSpec, index: int, objective: str) -> Combo:
    """The combo of phase `index`, at its own seq_len (a phase's data may set one)."""
    return combo_of(spec, objective)._replace(seq_len=spec.phase_seq_len(index))


def pretraining_combos(specs: list[RunSpec]) -> list[Combo]:
    """Each distinct (model, objective, sequence length, batch) of the specs' phases, in first-seen order."""
    return list(dict.fromkeys(phase_combo(s, i, p.objective) for s in specs for i, p in enumerate(s.phases)))


class FinetuneKey(NamedTuple):
    """What one fine-tuning throughput is measured for: the model, the task and the settings that set its
    speed (JSON, from ablate.launch.estimates)."""

    model: str
    task: str
    settings: str

    def describe(self) -> str:
        return f"{self.model} {self.task} {self.settings}"


@dataclass(frozen=True)
class FinetuneWork:
    """The fine-tuning of one run on one task, `seeds` times: `epochs` passes over `train` examples with a dev
    evaluation after each, or with `max_steps` (the span model) that many steps of `batch` examples with a dev
    evaluation every `eval_every` steps (null: every pass over train), as ablate.evaluate.finetune runs them;
    then one test evaluation. Early stopping can only make it shorter. `flops`: the executed FLOPs of one
    example (a training step on train, a forward on dev, on test: ablate.plan.finetune_flops), for an
    estimate where no throughput was measured; None when not counted."""

    key: FinetuneKey
    seeds: int
    epochs: int
    train: int
    dev: int
    test: int
    max_steps: int | None = None
    batch: int = 1
    eval_every: int | None = None
    flops: tuple[float, float, float] | None = None
    eval_batch: int = 1

    @property
    def trained(self) -> int:
        """Training examples of one fine-tuning: epochs x train, or steps x the batch (a pass's last batch may
        be short: an upper bound)."""
        if self.max_steps is None:
            return self.epochs * self.train
        return self.max_steps * min(self.batch, self.train)

    @property
    def evaluations(self) -> int:
        """Dev evaluations of one fine-tuning: one per epoch, or ceil(max_steps / eval_every) (finetune._rounds)."""
        if self.max_steps is None:
            return self.epochs
        every = min(self.eval_every or math.ceil(self.train / self.batch), self.max_steps)
        return math.ceil(self.max_steps / every)

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps of one fine-tuning: max_steps, or epochs x the batches of a pass."""
        if self.max_steps is None:
            return self.epochs * math.ceil(self.train / self.batch)
        return self.max_steps

    @property
    def eval_batches(self) -> int:
        """Forward batches of one fine-tuning's evaluations: each dev evaluation, then the test one."""
        return self.evaluations * math.ceil(self.dev / self.eval_batch) + math.ceil(self.test / self.eval_batch)

    def floor_seconds(self, step_s: float) -> float:
        """Seconds of one fine-tuning where every step costs its floor (`step_s` a training step, a third of it
        an evaluation batch: a forward alone launches about a third of a step's kernels)."""
        return self.optimizer_steps * step_s + self.eval_batches * step_s * FORWARD_SHARE

    def describe_training(self) -> str:
        if self.max_steps is None:
            return f"{self.train:,} x {self.epochs}"
        return f"{self.max_steps:,} steps x {min(self.batch, self.train)}"

    def seconds_at(self, train_rate: float, eval_rate: float) -> float:
        """Seconds of one fine-tuning at measured examples/s (train, eval)."""
        return self.trained / train_rate + (self.evaluations * self.dev + self.test) / eval_rate

    def executed_flops(self) -> float | None:
        """Executed FLOPs of one fine-tuning; None when its examples' FLOPs were not counted."""
        if self.flops is None:
            return None
        train, dev, test = self.flops
        return self.trained * train + self.evaluations * self.dev * dev + self.test * test


# ---------------------------------------------------------------- the calibration file (<sweep>/calibration.json)


class PretrainRate(Strict):
    model: str
    objective: str = Field(description="a registered objective (ablate.config.objectives)")
    seq_len: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    tokens_per_s: float = Field(gt=0)
    device: str
    warmup: int = Field(ge=0)
    step_s: tuple[float, ...] = Field(min_length=1, description="the timed steps' seconds")

    @property
    def combo(self) -> Combo:
        return Combo(self.model, self.objective, self.seq_len, self.batch_size)


class FinetuneRate(Strict):
    model: str
    task: str
    settings: str
    train_examples_per_s: float = Field(gt=0)
    eval_examples_per_s: float = Field(gt=0)
    device: str
    warmup: int = Field(ge=0)
    steps: int = Field(gt=0, description="timed training steps")

    @property
    def key(self) -> FinetuneKey:
        return FinetuneKey(self.model, self.task, self.settings)


class StepFloor(Strict):
    model: str
    batch_size: int = Field(gt=0)
    step_s: float = Field(gt=0, description="seconds of one fine-tuning step at a few tokens per example")
    device: str
    tokens: int = Field(gt=0, description="tokens per example of the timed steps")


class Calibration(Strict):
    sweep: str
    grid_file: str
    created: str = Field(description="ISO date and time of the measurement")
    hardware: dict[str, Any]
    torch: str
    pretraining: tuple[PretrainRate, ...]
    finetuning: tuple[FinetuneRate, ...] = ()
    step_floors: tuple[StepFloor, ...] = ()


# ---------------------------------------------------------------- throughput


@dataclass(frozen=True)
class Throughput:
    """What the estimate divides by: tokens/s per process for each combo (or `default` for every combo),
    (train, eval) examples/s measured for each fine-tuning key, and for fine-tuning not measured, the executed
    FLOP/s of one process per model (ablate.plan.finetune_flops) and the floor of one of its fine-tuning steps
    (`estimate_basis` says how both are made); `source` says where they come from."""

    source: str
    per_combo: dict[Combo, float] = field(default_factory=dict)
    default: float | None = None
    finetune: dict[FinetuneKey, tuple[float, float]] = field(default_factory=dict)
    flop_rates: dict[str, float] = field(default_factory=dict)
    step_floors: dict[str, float] = field(default_factory=dict)  # model -> seconds of a fine-tuning step, at least
    estimate_basis: tuple[str, ...] = ()

    def tokens_per_s(self, combo: Combo) -> float | None:
        return self.per_combo.get(combo, self.default)


def default_step_floor(layers: int) -> float:
    """Seconds of one fine-tuning step of an encoder of `layers` layers where none was measured."""
    return DEFAULT_FLOOR_FIXED_S + DEFAULT_FLOOR_PER_LAYER_S * layers


def check_tokens_per_s(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise SpecError(
            "not a throughput",
            key="--tokens-per-s",
            value=value,
            allowed="a number > 0: training tokens per second of one process (one GPU)",
        )
    return value


def given_throughput(tokens_per_s: float) -> Throughput:
    return Throughput(
        f"--tokens-per-s {tokens_per_s:,g} for every phase", default=check_tokens_per_s(tokens_per_s)
    )


def calibrated_throughput(calibration: Calibration, where: str) -> Throughput:
    """The calibration's measurements as they are (no check against a grid: ablate status uses what fits)."""
    hw = calibration.hardware
    machine = hw.get("gpu") or hw.get("cpu") or "?"
    return Throughput(
        f"calibrated {calibration.created} on {hw.get('host', '?')} ({machine}; torch "
        f"{calibration.torch}), {where}",
        per_combo={r.combo: r.tokens_per_s for r in calibration.pretraining},
        finetune={r.key: (r.train_examples_per_s, r.eval_examples_per_s) for r in calibration.finetuning},
    )


def matching_throughput(
    calibration: Calibration,
    where: str,
    sweep: str,
    specs: list[RunSpec],
    finetune_keys: list[FinetuneKey],
    grid_file: str,
) -> Throughput:
    """The calibration as the throughput of this grid; a SpecError when it was made for another grid (another
    sweep name, or a model / objective / length / batch, or with fine-tuning timed, a task or fine-tuning
    setting this grid has and it did not measure)."""
    again = f"re-run `ablate calibrate {grid_file}`"
    if calibration.sweep != sweep:
        raise SpecError(
            f"this calibration is of sweep {calibration.sweep!r} (grid {calibration.grid_file}), not of "
            f"this grid's sweep {sweep!r}; {again}",
            file=where,
            key="sweep",
            value=calibration.sweep,
            allowed=sweep,
        )
    throughput = calibrated_throughput(calibration, where)
    missing = [c.describe() for c in pretraining_combos(specs) if c not in throughput.per_combo]
    if calibration.finetuning:
        missing += [
            f"fine-tuning {k.describe()}" for k in dict.fromkeys(finetune_keys) if k not in throughput.finetune
        ]
    if missing:
        raise SpecError(
            f"the calibration was made for another grid (or an older version of {grid_file}): it "
            f"measured nothing for {'; '.join(missing)}; {again}",
            file=where,
            key="pretraining",
            value=missing[0],
            allowed="; ".join(c.describe() for c in throughput.per_combo),
        )
    return throughput


# ---------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class ArmCost:
    run_id: str
    axes: dict
    steps: int
    tokens: int
    hours: float | None  # pretraining; None without a throughput
    gpus: int
    finetune_hours: float | None  # None: not estimated (or no task: see has_finetuning)
    has_finetuning: bool = False
    finetune_estimated: float = 0.0  # the hours of finetune_hours estimated from FLOPs, not measured

    @property
    def gpu_hours(self) -> float | None:
        if self.hours is None:
            return None
        return (self.hours + (self.finetune_hours or 0.0)) * self.gpus


def pretraining_seconds(
    spec: RunSpec, throughput: Throughput | None, ranks: int = 1, phase_steps: list[int] | None = None
) -> float | None:
    """Seconds of the spec's training steps (or of `phase_steps`, per phase: a branched run's): each phase's
    tokens over its combo's throughput x ranks."""
    if throughput is None:
        return None
    seconds = 0.0
    for index, (phase, steps) in enumerate(
        zip(spec.phases, spec.phase_steps() if phase_steps is None else phase_steps)
    ):
        rate = throughput.tokens_per_s(phase_combo(spec, index, phase.objective))
        if rate is None:
            return None
        seconds += steps * spec.phase_tokens_per_step()[index] / (rate * ranks)
    return seconds


class FinetuneTime(NamedTuple):
    seconds: float
    estimated: float  # the seconds of it estimated from FLOPs (0: all measured)


def finetune_time(work: list[FinetuneWork], throughput: Throughput | None) -> FinetuneTime | None:
    """Seconds of fine-tuning, per task and seed: its training examples / the train rate + (its dev evaluations
    x dev + test) / the eval rate, at the examples/s measured for its key; else (estimated) the longer of its
    executed FLOPs at the FLOP rate of its model and its steps at the model's step floor (a step of a few
    short sequences is bound by kernel launches, not FLOPs). None when a task has neither."""
    measured = estimated = 0.0
    for w in work:
        rates = throughput.finetune.get(w.key) if throughput is not None else None
        if rates is not None:
            measured += w.seeds * w.seconds_at(*rates)
            continue
        rate = throughput.flop_rates.get(w.key.model) if throughput is not None else None
        flops = w.executed_flops()
        if rate is None or flops is None:
            return None
        floor = throughput.step_floors.get(w.key.model)
        estimated += w.seeds * max(flops / rate, 0.0 if floor is None else w.floor_seconds(floor))
    return FinetuneTime(measured + estimated, estimated)


def arm_cost(
    run_id: str,
    axes: dict,
    spec: RunSpec,
    throughput: Throughput | None,
    ranks: int,
    gpus: int,
    finetune: list[FinetuneWork] | None = None,
) -> ArmCost:
    """The cost of one run; `finetune` is its fine-tuning work (None: not estimated)."""
    steps = sum(spec.phase_steps())
    pre = pretraining_seconds(spec, throughput, ranks)
    ft = finetune_time(finetune, throughput) if finetune is not None else None
    return ArmCost(
        run_id,
        dict(axes),
        steps,
        spec.planned_tokens(),
        None if pre is None else pre / 3600,
        gpus,
        None if ft is None else ft.seconds / 3600,
        bool(spec.eval.tasks),
        0.0 if ft is None else ft.estimated / 3600,
    )


# ---------------------------------------------------------------- shared prefixes (ablate.plan.branching)


def steps_after(spec: RunSpec, start: int) -> list[int]:
    """Each phase's steps after global step `start`: what a run that branches there trains."""
    out, begin = [], 0
    for steps in spec.phase_steps():
        out.append(max(0, min(steps, begin + steps - start)))
        begin += steps
    return out


def branched_cost(cost: ArmCost, spec: RunSpec, start: int, throughput: Throughput | None, ranks: int) -> ArmCost:
    """The cost of a run that starts from another run's checkpoint at global step `start`: its steps after it."""
    if not start:
        return cost
    after = steps_after(spec, start)
    seconds = pretraining_seconds(spec, throughput, ranks, after)
    return replace(
        cost,
        steps=sum(after),
        tokens=sum(a * t for a, t in zip(after, spec.phase_tokens_per_step())),
        hours=None if seconds is None else seconds / 3600,
    )


def branching_lines(planned: list[ArmCost], trained: list[ArmCost], n_branched: int) -> list[str]:
    """The dry run's savings: tokens (and GPU-hours, when estimated) trained against planned."""
    if not n_branched:
        return []
    p_tokens, t_tokens = sum(c.tokens for c in planned), sum(c.tokens for c in trained)
    line = (
        f"branching: {n_branched} runs start from another run's checkpoint; the plan below counts what is "
        f"trained: {t_tokens:,} of {p_tokens:,} tokens ({t_tokens / p_tokens:.2f}x), {p_tokens - t_tokens:,} "
        "saved"
    )
    p_gpu, t_gpu = _total([c.gpu_hours for c in planned]), _total([c.gpu_hours for c in trained])
    if p_gpu is not None and t_gpu is not None:
        line += f", {_hours(p_gpu - t_gpu)} GPU-hours saved ({_hours(t_gpu)} of {_hours(p_gpu)})"
    return [line, "  (`branching: false` in the grid trains every run from step 0; the tree is printed above)"]


def _total(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(values)


def _hours(h: float | None) -> str:
    if h is None:
        return "-"
    return f"{h:.3g}" if h < 10 else f"{h:,.1f}"


def finetune_hours_cell(hours: float | None, estimated: float = 0.0) -> str:
    """Fine-tuning hours as the tables print them: measured as they are, "(estimated)" after hours estimated
    from FLOPs, "(N estimated)" after hours of which N are; "not estimated" for None."""
    if hours is None:
        return "not estimated"
    if not estimated:
        return _hours(hours)
    if estimated >= hours:
        return f"{_hours(hours)} (estimated)"
    return f"{_hours(hours)} ({_hours(estimated)} estimated)"


def _finetune_cell(cost: ArmCost) -> str:
    if not cost.has_finetuning:
        return "-"
    return finetune_hours_cell(cost.finetune_hours, cost.finetune_estimated)


def cost_rows(costs: list[ArmCost], epochs: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per arm and a total row: steps, tokens, with `epochs` (run id -> its cell: ablate.plan.epochs)
    the epochs over its corpus, and when estimated, hours, fine-tuning hours, GPU-hours."""
    timed = any(c.hours is not None for c in costs)
    rows = []
    for c in costs:
        row = {"run_id": c.run_id, **c.axes, "steps": c.steps, "tokens": f"{c.tokens:,}"}
        if epochs is not None:
            row["epochs"] = epochs.get(c.run_id, "unknown")
        if timed:
            row.update(
                {
                    "hours": _hours(c.hours),
                    "fine-tuning h": _finetune_cell(c),
                    "GPUs": c.gpus,
                    "GPU-hours": _hours(c.gpu_hours),
                }
            )
        rows.append(row)
    total = {
        "run_id": "total",
        **{k: "" for c in costs for k in c.axes},
        "steps": sum(c.steps for c in costs),
        "tokens": f"{sum(c.tokens for c in costs):,}",
        **({"epochs": ""} if epochs is not None else {}),
    }
    if timed:
        with_ft = [c for c in costs if c.has_finetuning]
        ft = _total([c.finetune_hours for c in with_ft])
        estimated = sum(c.finetune_estimated for c in with_ft)
        total.update(
            {
                "hours": _hours(_total([c.hours for c in costs])),
                "fine-tuning h": "-" if not with_ft else finetune_hours_cell(ft, estimated),
                "GPUs": "",
                "GPU-hours": _hours(_total([c.gpu_hours for c in costs])),
            }
        )
    return rows + [total]


def describe_plan(
    throughput: Throughput | None,
    grid_file: str,
    executor: str,
    gpus: int,
    ranks: int,
    calibration: Calibration | None = None,
    finetuning: bool = False,
) -> list[str]:
    """The lines above the cost table: where the throughput comes from, what was measured, GPUs per run
    (`finetuning`: whether the grid fine-tunes)."""
    if throughput is None:
        return [
            "cost plan: steps and tokens (training steps, prelude included); "
            + HOW_TO_GET_HOURS.format(grid=grid_file)
        ]
    lines = [f"cost plan: throughput {throughput.source}"]
    for rate in calibration.pretraining if calibration else ():
        lines.append(f"  {rate.combo.describe()}: {rate.tokens_per_s:,.0f} tokens/s on {rate.device}")
    for floor in calibration.step_floors if calibration else ():
        lines.append(
            f"  fine-tuning step floor {floor.model}: {floor.step_s * 1000:,.1f} ms per step of {floor.batch_size} "
            f"x {floor.tokens} tokens on {floor.device}"
        )
    for ft in calibration.finetuning if calibration else ():
        lines.append(
            f"  fine-tuning {ft.model} {ft.task}: {ft.train_examples_per_s:,.1f} train, "
            f"{ft.eval_examples_per_s:,.1f} eval examples/s on {ft.device}"
        )
    where = (
        f"{executor}: {gpus} GPU{'s' if gpus != 1 else ''} per run"
        if executor == "slurm"
        else f"{executor}: one machine per run, counted as 1 GPU"
    )
    if ranks > 1:
        where += f", {ranks} data-parallel ranks (assumed {ranks}x one process's tokens/s)"
    lines.append(
        f"  hours: training steps only (not loading, checkpoints or probes); {where}; "
        "GPU-hours = (hours + fine-tuning h) x GPUs"
    )
    if finetuning and throughput.finetune:
        lines.append(
            "  fine-tuning h: measured, at the examples/s above; '(estimated)' marks hours estimated from FLOPs"
        )
    if finetuning and not throughput.finetune and throughput.estimate_basis:
        lines += [f"  {line}" for line in throughput.estimate_basis]
        lines.append(f"  (`ablate calibrate {grid_file}` measures it on the target hardware)")
    elif finetuning and not throughput.finetune:
        lines.append(
            f"  fine-tuning: not estimated (no fine-tuning throughput: `ablate calibrate {grid_file}` "
            "times it); GPU-hours count pretraining only"
        )
    return lines


# ---------------------------------------------------------------- estimate vs actual (ablate status)


@dataclass(frozen=True)
class Actual:
    """What a finished run took: pretraining wall time (records/run.json) and fine-tuning wall time (its score
    files; None when some are missing)."""

    pretraining_s: float
    finetune_s: float | None


def _ratio(actual: float | None, estimate: float | None) -> str:
    return f"{actual / estimate:.2f}x" if actual is not None and estimate else "-"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 60 else format_duration(seconds)


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def compare_rows(costs: dict[str, ArmCost], actual: dict[str, Actual]) -> tuple[list[dict], str]:
    """Per finished run with an estimate: estimated and actual pretraining and fine-tuning time and the ratio
    actual / estimate; and a line with the totals over those runs."""
    rows, pre, ft = [], [0.0, 0.0], [0.0, 0.0, 0]  # (estimate, actual) sums; fine-tuning: and its runs
    for run_id, done in actual.items():
        cost = costs.get(run_id)
        if cost is None or cost.hours is None:
            continue
        est, ft_est = cost.hours * 3600, None if cost.finetune_hours is None else cost.finetune_hours * 3600
        tuned = cost.has_finetuning
        rows.append(
            {
                "run_id": run_id,
                **cost.axes,
                "estimate": _duration(est),
                "actual": _duration(done.pretraining_s),
                "actual/estimate": _ratio(done.pretraining_s, est),
                "fine-tuning estimate": _duration(ft_est) if tuned else "-",
                "fine-tuning actual": _duration(done.finetune_s) if tuned else "-",
                "ft actual/estimate": _ratio(done.finetune_s, ft_est) if tuned else "-",
            }
        )
        pre[0], pre[1] = pre[0] + est, pre[1] + done.pretraining_s
        if ft_est is not None and done.finetune_s is not None:
            ft = [ft[0] + ft_est, ft[1] + done.finetune_s, ft[2] + 1]
    if not rows:
        return rows, "estimate vs actual: no finished run has an estimate yet"
    line = (
        f"estimate vs actual over {_runs(len(rows))} finished: pretraining estimated {_duration(pre[0])}, "
        f"took {_duration(pre[1])} ({_ratio(pre[1], pre[0])})"
    )
    if ft[2]:
        line += (
            f"; fine-tuning ({_runs(ft[2])}) estimated {_duration(ft[0])}, took {_duration(ft[1])} "
            f"({_ratio(ft[1], ft[0])})"
        )
    return rows, line
