"""The sampler and the pruner a tune file names (`sampler: tpe` or `{name: tpe, seed: 0}`, likewise
`pruner:`), built as Optuna objects, with bad names and options reported as SpecErrors.

May import: config, tune.schema.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ablate.config.errors import SpecError
from ablate.tune.schema import Tune

SAMPLERS = ("tpe", "random", "grid", "cmaes")
PRUNERS = ("none", "median", "successive_halving", "threshold")


def _named(raw: str | dict, what: str, names: tuple[str, ...], file) -> tuple[str, dict]:
    if isinstance(raw, str):
        name, opts = raw, {}
    else:
        opts = dict(raw)
        name = opts.pop("name", None)
    if name not in names:
        raise SpecError(
            f"unknown {what}",
            file=file,
            key=f"{what}.name" if isinstance(raw, dict) else what,
            value=name,
            allowed=", ".join(names),
        )
    return name, opts


def check_sampler(tune: Tune) -> None:
    name, _ = _named(tune.spec.sampler, "sampler", SAMPLERS, tune.file)
    if name == "grid":
        for p in tune.params.values():
            if p.kind == "float":
                raise SpecError(
                    "the grid sampler needs categorical or int parameters",
                    file=tune.file,
                    key=f"search_space.{p.key}",
                    allowed="choices: [...] or type: int",
                )
    if name == "cmaes" and importlib.util.find_spec("cmaes") is None:
        raise SpecError(
            "the cmaes sampler needs the `cmaes` package (pip install cmaes)",
            file=tune.file,
            key="sampler",
            value=name,
            allowed="tpe, random, grid",
        )
    make_sampler(tune)


def make_sampler(tune: Tune, n_existing: int = 0):
    """The sampler; a seed is offset by the trials already in the study, so a resumed seeded study does
    not propose its first points again."""
    import optuna

    name, opts = _named(tune.spec.sampler, "sampler", SAMPLERS, tune.file)
    if isinstance(opts.get("seed"), int) and n_existing:
        opts["seed"] += n_existing
    try:
        if name == "tpe":
            return optuna.samplers.TPESampler(**opts)
        if name == "random":
            return optuna.samplers.RandomSampler(**opts)
        if name == "cmaes":
            return optuna.samplers.CmaEsSampler(**opts)
        space = {}
        for p in tune.params.values():
            space[p.key] = (
                list(p.choices) if p.kind == "categorical" else list(range(p.low, p.high + 1, p.step or 1))
            )
        return optuna.samplers.GridSampler(space, **opts)
    except TypeError as exc:
        raise SpecError(f"bad sampler option: {exc}", file=tune.file, key="sampler") from None


def make_pruner(raw: str | dict[str, Any], file: str | None = None):
    """The pruner `raw` (a tune file's `pruner:` value) names; `file` is where the value came from."""
    import optuna

    name, opts = _named(raw, "pruner", PRUNERS, file)
    cls = {
        "none": optuna.pruners.NopPruner,
        "median": optuna.pruners.MedianPruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "threshold": optuna.pruners.ThresholdPruner,
    }[name]
    try:
        return cls(**opts)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"bad pruner option: {exc}", file=file, key="pruner") from None
