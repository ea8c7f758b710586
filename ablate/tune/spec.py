"""Loading a tune file: the schema (ablate.tune.schema), every parameter parsed and checked, and the runs the
trials could give built at each parameter's bounds (and each choice), so that a file whose trials would
give an invalid run is refused before anything runs. Nothing is run or submitted.

May import: config, plan, train.preflight, evaluate, launch.trackers, tune.schema, tune.sampling, tune.trials, tune.rdb,
tune.secrets.
"""

from __future__ import annotations

from pathlib import Path

from ablate.config.base import read_yaml, validate
from ablate.config.errors import SpecError
from ablate.config.grid import RESERVED_AXES
from ablate.config.spec import RunSpec
from ablate.plan.grid import PlannedRun, resolve_layers
from ablate.tune.rdb import check_storage_driver, in_file
from ablate.tune.sampling import check_sampler, make_pruner
from ablate.tune.secrets import resolve, written_reference
from ablate.tune.schema import KEY_FORMS, SPECIAL_PREFIXES, Tune, TuneSpec, check_key, parse_param
from ablate.tune.trials import objective_tasks, trial_run


def load_tune(path: str | Path, storage: str | None = None) -> Tune:
    """Read and check a tune file: every parameter's bounds and every choice give a valid run (against the
    model's depth, too), the objective is one the runs can provide. Nothing is run or submitted."""
    file = str(path)
    spec = validate(TuneSpec, read_yaml(path), file, "tune file")
    try:
        spec = spec.model_copy(update={"storage": written_reference(storage or spec.storage, file)})
        url = resolve(spec.storage)
    except SpecError as exc:
        raise in_file(exc, file) from None
    check_storage_driver(url, file)
    if not spec.schedules:
        raise SpecError(
            "at least one schedule is needed", file=file, key="schedules", allowed="schedules: {NAME: [phases]}"
        )
    for name in RESERVED_AXES:  # the trial's run writes these: a value in base would be dropped
        if name in spec.base:
            raise SpecError(
                f"not a base setting: {RESERVED_AXES[name]}",
                file=file,
                key=f"base.{name}",
                allowed="the other run-spec keys",
            )
    if not spec.search_space:
        raise SpecError(
            "the search space is empty",
            file=file,
            key="search_space",
            allowed="at least one parameter: " + KEY_FORMS,
        )
    params = {k: parse_param(k, v, file) for k, v in spec.search_space.items()}
    for p in params.values():
        check_key(p, spec, file)
    tune = Tune(spec, file, params)
    check_sampler(tune)
    make_pruner(spec.pruner, file)
    for i, fixed in enumerate(spec.enqueue):
        if not isinstance(fixed, dict):
            raise SpecError(
                "an enqueued trial is a mapping of parameters",
                file=file,
                key=f"enqueue[{i}]",
                allowed="{parameter: value, ...}",
            )
        for k, v in fixed.items():
            if k not in params:
                raise SpecError(
                    "not a search-space parameter",
                    file=file,
                    key=f"enqueue[{i}].{k}",
                    value=k,
                    allowed=", ".join(params),
                )
            if not params[k].contains(v):
                raise SpecError(
                    "outside the parameter's range",
                    file=file,
                    key=f"enqueue[{i}].{k}",
                    value=v,
                    allowed="a value in the parameter's range",
                )
    _check_runs(tune)
    return tune


def _check_runs(tune: Tune) -> None:
    """Build the run for each parameter at each bound (each choice), the others at their first value."""
    first = {k: p.extremes()[0] for k, p in tune.params.items()}
    planned: list[PlannedRun] = []
    where: list[str] = []
    spec = tune.spec
    prelude = {p.get("name") for p in spec.prelude}
    schedules = (
        list(tune.params["schedule"].choices) if "schedule" in tune.params else [next(iter(spec.schedules))]
    )
    for k, p in tune.params.items():
        point0 = dict(first)
        if k.startswith(SPECIAL_PREFIXES):  # check it where its phase(s) exist
            needed = set(k.split(".")[1:3] if k.startswith("share.") else k.split(".")[1:2]) - prelude
            having = [s for s in schedules if needed <= {ph.get("name") for ph in spec.schedules[s]}]
            if not having:
                raise SpecError(
                    "no schedule the trials can use has this parameter's phase(s)",
                    file=tune.file,
                    key=f"search_space.{k}",
                    value=", ".join(sorted(needed)),
                    allowed="schedules: " + ", ".join(schedules),
                )
            if "schedule" in tune.params:
                point0["schedule"] = having[0]
        for v in p.extremes():
            point = {**point0, k: v}
            try:
                planned.append(trial_run(tune, point, trial=None))
            except SpecError as exc:
                raise SpecError(
                    f"gives an invalid run ({exc.key}: {exc.message})",
                    file=tune.file,
                    key=f"search_space.{k}",
                    value=v,
                    allowed=exc.allowed,
                ) from None
            where.append(f"search_space.{k} (= {v!r})")
    for fixed in tune.spec.enqueue:
        planned.append(trial_run(tune, {**first, **fixed}, trial=None))
        where.append("enqueue")
    # freeze ranges against the model's depth, one run at a time so the error names the parameter
    for run, w in zip(planned, where):
        try:
            resolve_layers([run], file=tune.file)
        except SpecError as exc:
            raise SpecError(
                f"gives an invalid run: {exc.message}", file=tune.file, key=w, value=exc.value, allowed=exc.allowed
            ) from None
    _check_objective(tune, planned[0].spec)
    _check_last_n(tune, [run.spec for run in planned])
    from ablate.evaluate.runs import check_eval
    from ablate.launch.trackers import check_installed as check_trackers
    from ablate.plan.model_fit import check_model_fit

    check_model_fit([run.spec for run in planned], file=tune.file)  # lengths, attention, vocabulary
    check_trackers([run.spec for run in planned], file=tune.file)
    from ablate.train.preflight import check_models

    check_eval([planned[0].spec], file=tune.file)
    check_models([run.spec for run in planned], file=tune.file)  # tokenizer, causal preflight


def _check_last_n(tune: Tune, specs: list[RunSpec]) -> None:
    """A loss objective's last_n within the final phase of every run the trials can give (its losses, one a
    step): a longer tail would quietly be the whole phase."""
    obj = tune.spec.objective
    if obj.metric != "loss" or "last_n" not in obj.model_fields_set:  # the default: the last 10 or fewer
        return
    spec = min(specs, key=lambda s: s.phase_steps()[-1])
    final = spec.phase_steps()[-1]
    if obj.last_n > final:
        raise SpecError(
            f"the final phase {spec.phases[-1].name!r} trains {final} steps in some trial: a mean over "
            f"its last {obj.last_n} losses would be over {final}",
            file=tune.file,
            key="objective.last_n",
            value=obj.last_n,
            allowed=f"1-{final}",
        )


def _check_objective(tune: Tune, spec: RunSpec) -> None:
    obj = tune.spec.objective
    if obj.metric != "downstream":
        return
    tasks = objective_tasks(obj, spec, tune.file)
    if not tasks:
        raise SpecError(
            "a downstream objective needs tasks: give objective.tasks or base.eval.tasks",
            file=tune.file,
            key="objective.tasks",
        )
    evaluated = objective_tasks(obj.model_copy(update={"tasks": None}), spec, tune.file)  # suites expanded
    missing = [t for t in tasks if t not in evaluated]
    if missing:
        raise SpecError(
            "objective task is not evaluated by the runs (add it to base.eval.tasks)",
            file=tune.file,
            key="objective.tasks",
            value=missing[0],
            allowed=", ".join(evaluated) or "(none)",
        )
    if obj.name:
        from ablate.evaluate.tasks import load_task

        lacking = [t for t in tasks if obj.name not in load_task(t).metrics]
        if lacking:
            provided = sorted({m for t in tasks for m in load_task(t).metrics})
            raise SpecError(
                f"objective metric is not provided by task(s) {', '.join(lacking)}",
                file=tune.file,
                key="objective.name",
                value=obj.name,
                allowed=", ".join(provided),
            )
