"""The tune file's schema and its search space: what each key may be (TuneSpec, Objective), each parameter
parsed from its entry (Param), and the checks of a parameter's key against the file's schedules and the
RunSpec. load_tune (ablate.tune.spec) puts these together with the checks that build runs.

    study: lr_freeze                       # results/<study>/ (run folders, tables, optuna.db)
    base: {...}  prelude: [...]  schedules: {...}  freeze_masks: {...}   # as in a grid
    search_space:
      optim.lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}    # any dotted RunSpec key
      schedule: {choices: [mlm, clm_detour]}                            # a named schedule
      freeze: {choices: [none, low_clm]}                                # a named freeze mask
      phases.mlm_decay.lr.final_fraction: {low: 0.0, high: 0.5}         # a field of the phase so named
      phases.mlm_decay.mask_rate: {low: 0.1, high: 0.4}
      share.clm.mlm_decay: {low: 0.5, high: 0.9}   # clm's share of the two phases' summed fractions
      freeze_layers.clm: {type: int, low: -1, high: 2}   # freeze layers 0-K of phase clm (-1: none)
    objective: {metric: loss, last_n: 10}        # or {metric: downstream, split: test, name: f1}
    direction: minimize
    sampler: tpe                                 # or {name: tpe|random|grid|cmaes, seed: 0}
    pruner: {name: median, n_startup_trials: 2}  # none | median | successive_halving | threshold
    n_trials: 20
    parallel: 2                                  # trials in flight
    storage: sqlite                              # sqlite | journal | any RDB URL
    enqueue: [{optim.lr: 1.0e-4}]                # trials to run first (the rest of their params sampled)
    launcher: {executor: local, local: {...}, slurm: {...}}

May import: config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from ablate.config.base import Located, Strict
from ablate.config.errors import SpecError
from ablate.config.launcher import Launcher
from ablate.config.spec import RunSpec

SPECIAL_PREFIXES = ("phases.", "freeze_layers.", "share.")
KEY_FORMS = (
    "a dotted RunSpec key (optim.lr, seed, data.data_seed, ...), schedule, freeze, "
    "phases.<phase>.<field>, freeze_layers.<phase>, share.<phase>.<phase>"
)


class Objective(Strict):
    metric: Literal["loss", "downstream"] = Field(
        default="loss", description="what a trial is scored by: its final pretraining loss, or a fine-tuning score"
    )
    last_n: int = Field(default=10, gt=0, description="loss: mean over the final phase's last N steps")
    tasks: tuple[str, ...] | None = Field(default=None, description="downstream: default the base's eval.tasks")
    split: Literal["test", "dev"] = Field(default="test", description="downstream: the split whose score counts")
    name: str | None = Field(default=None, description="downstream metric; default each task's primary one")

    @model_validator(mode="after")
    def _fields_of_the_metric(self):
        # each metric reads only its own fields: the other metric's would be dropped without a word
        if self.metric == "loss":
            other = {"tasks": self.tasks, "split": None if self.split == "test" else self.split, "name": self.name}
        else:
            other = {"last_n": None if self.last_n == 10 else self.last_n}
        given = next((k for k, v in other.items() if v is not None), None)
        if given is not None:
            raise Located(
                f"metric {self.metric} does not read {given}",
                given,
                other[given],
                "loss: last_n; downstream: tasks, split, name",
            )
        return self


class TuneSpec(Strict):
    study: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="the study's name: its folder results/<study>/")
    base: dict[str, Any] = Field(description="settings every trial's run shares, as a grid's base")
    prelude: tuple[dict[str, Any], ...] = Field(default=(), description="phases every schedule starts with")
    schedules: dict[str, tuple[dict[str, Any], ...]] = Field(description="named lists of phases")
    freeze_masks: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {"none": {}}, description="named masks, as in a grid"
    )
    search_space: dict[str, Any] = Field(
        default_factory=dict,
        description=f"parameter -> its range ({{low, high, "
        f"log, step, type}}) or {{choices}}; a parameter is {KEY_FORMS}",
    )
    objective: Objective = Field(default=Objective(), description="what a trial is scored by")
    direction: Literal["minimize", "maximize"] | None = Field(
        default=None, description="null: minimize a loss, maximize a downstream score"
    )
    sampler: str | dict[str, Any] = Field(default="tpe", description="tpe, random, grid or cmaes, or {name, seed}")
    pruner: str | dict[str, Any] = Field(
        default="none",
        description="none, median, successive_halving or "
        "threshold, or {name, its options}: stops poor trials inside their run",
    )
    n_trials: int = Field(
        default=10, gt=0, description="finished trials the study holds at its end (a re-run resumes)"
    )
    parallel: int = Field(default=1, gt=0, description="trials in flight at once")
    storage: str = Field(
        default="sqlite",
        description="sqlite, journal (a shared file system), an RDB URL, or "
        "env:NAME / file:PATH holding a server's URL",
    )
    enqueue: tuple[dict[str, Any], ...] = Field(
        default=(), description="trials run first: parameter -> value (the rest sampled)"
    )
    launcher: Launcher = Field(default=Launcher(), description="where the trials' runs go, as in a grid")

    @property
    def effective_direction(self) -> str:
        return self.direction or ("minimize" if self.objective.metric == "loss" else "maximize")


@dataclass(frozen=True)
class Param:
    key: str
    kind: str  # float | int | categorical
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "categorical":
            return CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)

    def extremes(self) -> list:
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]

    def contains(self, value: Any) -> bool:
        dist = self.distribution()
        try:
            return bool(dist._contains(dist.to_internal_repr(value)))
        except (ValueError, TypeError):
            return False


@dataclass
class Tune:
    spec: TuneSpec
    file: str | None
    params: dict[str, Param]

    @property
    def study(self) -> str:
        return self.spec.study


def _number(value: Any, file, key) -> float:
    """A finite number, or a string that reads as one ("1e-4" quoted); anything else is refused."""
    if isinstance(value, bool):
        raise SpecError("expected a number", file=file, key=key, value=value, allowed="a finite number")
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if isinstance(number, (int, float)) and math.isfinite(number):
        return number
    raise SpecError(
        "expected a finite number",
        file=file,
        key=key,
        value=value if isinstance(value, (str, float)) else type(value).__name__,
        allowed="a finite number, e.g. 1.0e-4",
    )


def parse_param(key: str, raw: Any, file: str | None) -> Param:
    where = f"search_space.{key}"
    if isinstance(raw, list):
        raw = {"choices": raw}
    if not isinstance(raw, dict):
        raise SpecError(
            "a search-space entry must be a mapping (type, low, high, log, step) or a list of choices",
            file=file,
            key=where,
            value=raw if isinstance(raw, (str, int, float)) else None,
            allowed="{low, high} (with type, log, step), or [choices]",
        )
    allowed = {"type", "low", "high", "log", "step", "choices"}
    for k in raw:
        if k not in allowed:
            raise SpecError("unknown key", file=file, key=f"{where}.{k}", allowed=", ".join(sorted(allowed)))
    kind = raw.get("type") or ("categorical" if "choices" in raw else None)
    if kind is None:
        lo, hi = raw.get("low"), raw.get("high")
        kind = "int" if isinstance(lo, int) and isinstance(hi, int) and not isinstance(lo, bool) else "float"
    if kind not in ("float", "int", "categorical"):
        raise SpecError(
            "unknown parameter type", file=file, key=f"{where}.type", value=kind, allowed="float, int, categorical"
        )
    if kind == "categorical":
        return _categorical(key, raw, where, file)
    return _numeric_range(key, kind, raw, where, file)


def _categorical(key: str, raw: dict, where: str, file: str | None) -> Param:
    """A list of choices (numbers, strings, booleans, null), and nothing else."""
    choices = raw.get("choices")
    if not isinstance(choices, list) or not choices:
        raise SpecError(
            "a categorical parameter needs a non-empty list of choices", file=file, key=f"{where}.choices"
        )
    for c in choices:
        if c is not None and not isinstance(c, (bool, int, float, str)):
            raise SpecError(
                "choices must be numbers, strings, booleans or null",
                file=file,
                key=f"{where}.choices",
                value=str(c),
            )
    extra = set(raw) - {"type", "choices"}
    if extra:
        raise SpecError(
            "a categorical parameter takes only choices",
            file=file,
            key=f"{where}.{sorted(extra)[0]}",
            allowed="choices: [...]",
        )
    return Param(key, "categorical", choices=tuple(choices))


def _numeric_range(key: str, kind: str, raw: dict, where: str, file: str | None) -> Param:
    """low <= high (whole numbers for an int), log (positive bounds) or a step that divides high - low."""
    if "choices" in raw:
        raise SpecError(
            f"a {kind} parameter takes low/high, not choices",
            file=file,
            key=f"{where}.choices",
            allowed="low, high, log, step",
        )
    for bound in ("low", "high"):
        if bound not in raw:
            raise SpecError(
                f"a {kind} parameter needs {bound}",
                file=file,
                key=f"{where}.{bound}",
                allowed=f"{bound}: a number",
            )
    low, high = _number(raw["low"], file, f"{where}.low"), _number(raw["high"], file, f"{where}.high")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise SpecError(
            "log must be true or false", file=file, key=f"{where}.log", value=log, allowed="true, false"
        )
    step = raw.get("step")
    if step is not None:
        step = _number(step, file, f"{where}.step")
        if step <= 0:
            raise SpecError(
                "step must be positive", file=file, key=f"{where}.step", value=step, allowed="a step > 0"
            )
        if log:
            raise SpecError(
                "log scale and step cannot be combined",
                file=file,
                key=f"{where}.step",
                value=step,
                allowed="step without log: true",
            )
    if kind == "int":
        low, high, step = _whole_numbers(low, high, step, where, file)
    else:
        low, high = float(low), float(high)
    if low > high:
        raise SpecError(
            f"low > high ({low} > {high})", file=file, key=f"{where}.low", value=low, allowed=f"a value <= {high}"
        )
    if log and low <= 0:
        raise SpecError(
            "a log-scale parameter needs positive bounds",
            file=file,
            key=f"{where}.low",
            value=low,
            allowed="low > 0 (or log: false)",
        )
    if step is not None and not _whole(round((high - low) / step, 9)):
        top = low + math.floor((high - low) / step + 1e-9) * step
        raise SpecError(
            f"high - low ({high - low:g}) is not a multiple of step {step:g}: Optuna would lower high to "
            f"{top:g} without a word",
            file=file,
            key=f"{where}.step",
            value=step,
            allowed=f"a step that divides {high - low:g}, or high: {top:g}",
        )
    return Param(key, kind, low=low, high=high, log=log, step=step)


def _whole_numbers(low, high, step, where: str, file: str | None) -> tuple[int, int, int | None]:
    """An int parameter's bounds and step, each a whole number (1.0 is 1)."""
    for name, v in (("low", low), ("high", high)):
        if float(v) != int(v):
            raise SpecError(
                "an int parameter needs whole-number bounds",
                file=file,
                key=f"{where}.{name}",
                value=v,
                allowed="a whole number",
            )
    if step is not None and float(step) != int(step):
        raise SpecError(
            "an int parameter needs a whole-number step",
            file=file,
            key=f"{where}.step",
            value=step,
            allowed="a whole number",
        )
    return int(low), int(high), (int(step) if step is not None else None)


def _whole(x: float) -> bool:
    return math.isclose(x, round(x), rel_tol=0, abs_tol=1e-6)


def phase_names(spec: TuneSpec) -> list[str]:
    names = [p.get("name") for p in spec.prelude] + [p.get("name") for s in spec.schedules.values() for p in s]
    return list(dict.fromkeys(n for n in names if isinstance(n, str)))


def check_key(param: Param, spec: TuneSpec, file: str | None) -> None:
    key, where = param.key, f"search_space.{param.key}"
    phases = phase_names(spec)
    if key in ("schedule", "freeze"):
        table = spec.schedules if key == "schedule" else spec.freeze_masks
        if param.kind != "categorical":
            raise SpecError(
                f"{key} picks named entries: give choices", file=file, key=where, allowed=", ".join(table)
            )
        for c in param.choices:
            if not isinstance(c, str) or c not in table:
                raise SpecError(
                    f"unknown {key} name", file=file, key=f"{where}.choices", value=c, allowed=", ".join(table)
                )
        return
    if key.startswith(SPECIAL_PREFIXES):
        parts = key.split(".")
        prefix = parts[0]
        names = parts[1:2] if prefix != "share" else parts[1:3]
        if (
            (prefix == "phases" and len(parts) < 3)
            or (prefix == "freeze_layers" and len(parts) != 2)
            or (prefix == "share" and len(parts) != 3)
        ):
            raise SpecError("malformed key", file=file, key=where, value=key, allowed=KEY_FORMS)
        for n in names:
            if n not in phases:
                raise SpecError(
                    "names a phase that no schedule (or the prelude) has",
                    file=file,
                    key=where,
                    value=n,
                    allowed=", ".join(phases),
                )
        if prefix == "phases" and parts[2] == "name":
            raise SpecError("a phase's name cannot be searched", file=file, key=where, allowed="another field")
        if prefix == "share" and (
            param.kind == "categorical"
            and not all(isinstance(c, (int, float)) and 0 < c < 1 for c in param.choices)
            or param.kind != "categorical"
            and not (0 < param.low and param.high < 1)
        ):
            raise SpecError(
                "a share is a fraction strictly between 0 and 1",
                file=file,
                key=where,
                allowed="0 < low <= high < 1",
            )
        return
    top = key.split(".")[0]
    if top in ("phases", "labels"):
        raise SpecError("this key cannot be searched directly", file=file, key=where, allowed=KEY_FORMS)
    if top not in RunSpec.model_fields:
        raise SpecError(
            "unknown field",
            file=file,
            key=where,
            value=key,
            allowed=KEY_FORMS
            + "; RunSpec fields: "
            + ", ".join(k for k in RunSpec.model_fields if k not in ("phases", "labels")),
        )
