"""What a grid, a run spec, a suite or a task reads from the data root, as catalogued datasets
(ablate/data/catalog.yaml): what `ablate data fetch TARGET` fetches, and, before anything runs, the corpora
the data root lacks named with the command that fetches them (eval tasks: ablate.evaluate.suites.present_items);
the tasks a layer probe reads its texts from (probe.texts task:NAME): how they are read, and those whose data
is missing (a dry run's warning, a submission's error naming `ablate data fetch NAME`).

May import: config, data, evaluate, launch.preparation.
"""

from __future__ import annotations

import fnmatch
import glob
from pathlib import Path, PurePosixPath

from ablate.config.errors import SpecError
from ablate.config.spec import PROBE_TASK
from ablate.config.paths import resolve_data_path
from ablate.data.mixture import phase_data
from ablate.data.catalog import Dataset, catalog, dataset, dataset_of_path, dataset_sets
from ablate.evaluate.suites import PREFIX, eval_items, spec_items
from ablate.evaluate.tasks import list_tasks, load_task

TARGETS = "a dataset name, a set of datasets (tests), a task name, suite:NAME, or a grid / run spec file (YAML)"


def task_paths(task_names, lenient: bool = False) -> list[str]:
    """The data-root-relative split files of these tasks (`datasets` tasks read no file of the data root);
    `lenient`: a task that does not load is left out (check_eval says what is wrong with it)."""
    paths = []
    for name in dict.fromkeys(task_names):
        try:
            task = load_task(name)
        except SpecError:
            if lenient:
                continue
            raise
        if task.data.format != "hf":
            paths += [task.data.splits.train, task.data.splits.dev, task.data.splits.test]
    return paths


def probe_tasks(spec) -> list[str]:
    """The tasks whose texts the run's layer probe reads (probe.texts task:NAME[:SPLIT] sources)."""
    if spec.probe.n_texts <= 0 or not spec.probe.texts:
        return []
    return [s[len(PROBE_TASK) :].partition(":")[0] for s in spec.probe.texts if s.startswith(PROBE_TASK)]


def probe_task_paths(spec, lenient: bool = False, file: str | None = None) -> list[str]:
    """The split files of the tasks the run's layer probe reads; an unknown task is a SpecError at
    `probe.texts` of `file` (the grid or run spec), listing the tasks."""
    try:
        return task_paths(probe_tasks(spec), lenient)
    except SpecError as exc:
        if exc.file is not None:  # an error inside a task file names that file
            raise
        raise SpecError(
            exc.message,
            file=file,
            key="probe.texts",
            value=f"{PROBE_TASK}{exc.value}",
            allowed=exc.allowed,
        ) from None


def missing_probe_data(specs, file: str | None = None) -> list[SpecError]:
    """Per probe task whose split files the data root lacks, the SpecError a submission raises (it names
    `ablate data fetch NAME`); a dry run warns of them. An unknown task is a SpecError here."""
    missing: dict[str, SpecError] = {}
    for spec in specs:
        probe_task_paths(spec, file=file)  # every name a task
        for name in probe_tasks(spec):
            if name in missing:
                continue
            absent = [p for p in task_paths([name]) if not resolve_data_path(p, spec.data.data_root).exists()]
            if absent:
                missing[name] = SpecError(
                    f"the layer probe reads task {name}'s texts, whose data the data root lacks "
                    f"({', '.join(absent)}): fetch it with `ablate data fetch {name}` (or set ABLATE_DATA_ROOT, or data.data_root, to "
                    "a folder that holds it)",
                    file=file,
                    key="probe.texts",
                    value=f"{PROBE_TASK}{name}",
                )
    return list(missing.values())


def require_probe_data(specs, file: str | None = None) -> None:
    """missing_probe_data, raised: what a submission checks before anything is written (exit 2)."""
    missing = missing_probe_data(specs, file)
    if missing:
        raise missing[0]


def absent_probe_sources(specs) -> set[str]:
    """The probe.texts sources of the runs whose task data is missing (check_probe_texts leaves them)."""
    gone = {e.value[len(PROBE_TASK) :] for e in missing_probe_data(specs)}
    return {
        s
        for spec in specs
        for s in (spec.probe.texts or ())
        if s.startswith(PROBE_TASK) and s[len(PROBE_TASK) :].partition(":")[0] in gone
    }


def spec_reads(
    specs, lenient: bool = False, tasks: bool = True, file: str | None = None
) -> list[tuple[str, str | None]]:
    """(path, the spec's data_root) of every corpus, held-out corpus and (`tasks`) task split file the runs
    read; `lenient`: an eval block or task that does not load is left out (check_eval reports it); `file`:
    the grid or run spec they come from."""
    reads, task_files = [], {}
    for spec in specs:
        read = [m.data.corpus for p in phase_data(spec) for m in p.members]  # every phase's corpora
        corpora = list(dict.fromkeys(read)) + ([spec.data.valid_corpus] if spec.data.valid_corpus else [])
        if not tasks:
            task_files[tuple(spec.eval.tasks)] = []
        elif tuple(spec.eval.tasks) not in task_files:  # a grid's runs mostly share their eval block
            task_files[tuple(spec.eval.tasks)] = task_paths(_eval_tasks(spec, lenient), lenient)
        probed = probe_task_paths(spec, lenient, file) if tasks else []  # fetched with the eval tasks
        reads += [(path, spec.data.data_root) for path in corpora + task_files[tuple(spec.eval.tasks)] + probed]
    return list(dict.fromkeys(reads))


def _eval_tasks(spec, lenient: bool) -> list[str]:
    try:
        return [item.task for item in spec_items(spec)]
    except SpecError:
        if lenient:
            return []
        raise


def datasets_of(paths) -> list[Dataset]:
    names = dict.fromkeys(n for p in paths if (n := dataset_of_path(p)))
    return [dataset(n) for n in names]


def target_datasets(target: str) -> list[Dataset]:
    """The catalogued datasets a fetch target stands for (TARGETS)."""
    from ablate.launch.preparation import specs_for_target

    if target.startswith(PREFIX):
        return datasets_of(task_paths(item.task for item in eval_items([target], (0,), key="target")))
    if target.endswith((".yaml", ".yml")):
        if not Path(target).is_file():
            raise SpecError("file not found", file=target)
        return datasets_of(path for path, _ in spec_reads(specs_for_target(target, None), file=target))
    if target in catalog():
        return [dataset(target)]
    if target in dataset_sets():
        return [dataset(name) for name in dataset_sets()[target]]
    if target in list_tasks():
        return datasets_of(task_paths([target]))
    raise SpecError(
        "unknown fetch target",
        key="target",
        value=target,
        allowed=f"{TARGETS}; datasets: {', '.join(sorted(catalog()))}; sets: {', '.join(sorted(dataset_sets()))}",
    )


def missing_datasets(specs, tasks: bool = True) -> dict[str, list[str]]:
    """Catalogued dataset -> the files the runs read from it (`tasks`: their eval tasks' too) that are not in
    their data root. A path no file of the dataset's manifest matches (a typo) is left to the corpus and task
    checks, which name it as not found."""
    missing: dict[str, list[str]] = {}
    for path, root in spec_reads(specs, lenient=True, tasks=tasks):
        name = dataset_of_path(path)
        where = resolve_data_path(path, root)
        if name and _catalogued(name, path) and not (where.exists() or glob.glob(str(where))):
            missing.setdefault(name, []).append(path)
    return missing


def _catalogued(name: str, path: str) -> bool:
    """Whether `path` (data-root-relative, possibly a glob) names files the manifest lists for dataset `name`."""
    inside = str(PurePosixPath(str(path).replace("\\", "/")).relative_to(name))
    return any(fnmatch.fnmatch(expected.file, inside) for expected in dataset(name).files)


def check_data_root(specs, target: str) -> None:
    """A SpecError (exit 2) naming every catalogued corpus the runs read and the data root lacks, and the
    command that fetches them. Eval tasks are check_eval's (ablate.evaluate.suites.present_items): a suite's
    task without its data is skipped and said, one named directly is an error naming its key."""
    missing = missing_datasets(specs, tasks=False)
    if not missing:
        return
    roots = sorted({str(resolve_data_path(".", s.data.data_root).resolve()) for s in specs})
    lacks = "; ".join(f"{name} ({', '.join(paths)})" for name, paths in missing.items())
    raise SpecError(
        f"the data root ({', '.join(roots)}) lacks {lacks}; fetch them from their public sources: "
        f"`ablate data fetch {target}` (or set ABLATE_DATA_ROOT, or data.data_root, to a folder that "
        "holds them)",
        file=target,
    )
