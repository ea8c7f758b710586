"""Corpora of a set of runs, prepared once before the runs start: checked (empty, unreadable: a SpecError
before anything is submitted; missing: refused by a submission, only warned of by a dry run), then tokenized
into prepared folders, each distinct (corpus, tokenizer) once. Locally in this process; on Slurm as one job
the arms depend on (afterok), and no job at all when every prepared folder is complete. Once a corpus is
prepared, its runs are checked against it (ablate.plan.epochs): a run that would read it more than
`data.max_epochs` times, or whose global batch holds more sequences than it has, is refused before it is
submitted (and, when the corpus is prepared by a job, at the run's own start: ablate.train.loop.setup).

May import: config, data, models, plan, launch.executors.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from ablate.config.errors import SpecError
from ablate.config.launcher import Launcher
from ablate.config.spec import DataSpec, RunSpec
from ablate.data.corpus import BYTES_PER_TOKEN, estimated_tokens, find_prepared, open_prepared, prepared_tokens
from ablate.data.readers import CorpusNotFound, resolve_sources
from ablate.launch.executors import make_executor
from ablate.data.mixture import READING_FIELDS, phase_data, uses_own_data
from ablate.plan.data_plan import check_source_epochs
from ablate.plan.epochs import CorpusSize, check_epochs
from ablate.plan.model_fit import local_tokenizer

Print = Callable[[str], None]


def corpus_key(spec: RunSpec) -> str:
    """Equal for runs that read the same prepared tokens (same corpus reading and tokenizer)."""
    return repr(([getattr(spec.data, f) for f in READING_FIELDS], spec.tokenizer or spec.model))


def source_specs(spec: RunSpec) -> list[RunSpec]:
    """The run itself, or (a run that reads by members: data.mixture, a phase's own data) one copy per corpus
    and length it reads, its data that corpus: what the checks and the preparation of corpora take."""
    if not uses_own_data(spec):
        return [spec]
    seen: dict[str, RunSpec] = {}
    for plan in phase_data(spec):
        for m in plan.members:
            seen.setdefault(m.stream, spec.model_copy(update={"data": m.data}))
    return list(seen.values())


def _sources(specs: list[RunSpec]) -> list[tuple[RunSpec, RunSpec]]:
    """(the run, one of its source_specs) for every corpus every run reads."""
    return [(spec, one) for spec in specs for one in source_specs(spec)]


def distinct_corpora(specs: list[RunSpec]) -> list[tuple[DataSpec, str]]:
    """(data spec, tokenizer reference) for each distinct corpus reading and tokenizer, in first-seen order."""
    seen: dict[str, tuple[DataSpec, str]] = {}
    for _, spec in _sources(specs):
        seen.setdefault(corpus_key(spec), (spec.data, spec.tokenizer or spec.model))
    return list(seen.values())


def _by_corpus(specs: list[RunSpec]) -> list[tuple[DataSpec, str, list[RunSpec], list[RunSpec]]]:
    """distinct_corpora, each with the runs that read it, and those runs' source_specs of it."""
    groups: dict[str, tuple[list[RunSpec], list[RunSpec]]] = {}
    for run, spec in _sources(specs):
        runs, ones = groups.setdefault(corpus_key(spec), ([], []))
        if run not in runs:
            runs.append(run)
        ones.append(spec)
    return [(ones[0].data, ones[0].tokenizer or ones[0].model, runs, ones) for runs, ones in groups.values()]


def written_key(run: RunSpec, corpus: str) -> str:
    """Where the run names `corpus`: data.corpus, data.mixture[i].corpus, phases[j].data(.mixture[i]).corpus."""
    places = [("data", run.data)] + [(f"phases[{j}].data", p.data) for j, p in enumerate(run.phases) if p.data]
    for at, data in places:
        if data.corpus == corpus:
            return f"{at}.corpus"
        for i, member in enumerate(data.mixture or ()):
            if member.corpus == corpus:
                return f"{at}.mixture[{i}].corpus"
    return "data.corpus"


def _reads(specs: list[RunSpec]) -> list[tuple[DataSpec, str, str]]:
    """(data spec, which field, the key it is written at) of every distinct corpus the runs read: the training
    corpus, and the held-out one of runs with layer probes."""
    seen: dict[tuple, tuple[DataSpec, str, str]] = {}
    for run, spec in _sources(specs):
        fields = ["corpus"] + (["valid_corpus"] if spec.probe.n_texts > 0 and spec.data.valid_corpus else [])
        for which in fields:
            key = written_key(run, spec.data.corpus) if which == "corpus" else f"data.{which}"
            seen.setdefault((which, getattr(spec.data, which), spec.data.data_root), (spec.data, which, key))
    return list(seen.values())


def _located(exc: SpecError, file: str | None, key: str | None = None) -> SpecError:
    """The same error (same type) naming `file` when it names none (and `key`, where the run wrote it)."""
    return type(exc)(exc.message, file=exc.file or file, key=key or exc.key, value=exc.value, allowed=exc.allowed)


def check_corpora(specs: list[RunSpec], file: str | None = None) -> list[SpecError]:
    """Every corpus (and held-out corpus of runs with probes) that exists is readable and not empty: a SpecError
    naming the grid or spec file otherwise. Returns those that are missing, as the errors a real submission
    raises (require_corpora): a dry run goes on and warns of them."""
    missing = []
    for data, which, key in _reads(specs):
        try:
            resolve_sources(data, which)
        except CorpusNotFound as exc:
            missing.append(_located(exc, file, key))
        except SpecError as exc:
            raise _located(exc, file, key if exc.key == f"data.{which}" else None) from None
    return missing


def require_corpora(specs: list[RunSpec], file: str | None = None) -> None:
    """check_corpora, and a missing corpus is a SpecError too: what a submission starts with."""
    missing = check_corpora(specs, file)
    if missing:
        raise missing[0]


def check_budgets(specs: list[RunSpec], file: str | None = None) -> list[RunSpec]:
    """Refuse (SpecError) a run that would read its prepared corpus (each source, by its share) more than
    data.max_epochs times or whose global batch holds more sequences than a corpus has. Returns the runs whose
    corpora are not all prepared yet: those are checked at their own start."""
    from ablate.models.loading import load_tokenizer

    tokens: dict[str, int | None] = {}
    for data, tok, _, ones in _by_corpus(specs):
        tokens[corpus_key(ones[0])] = prepared_tokens(data, load_tokenizer(tok))
    unchecked = []
    for spec in specs:
        counts = {one.data.corpus: tokens[corpus_key(one)] for one in source_specs(spec)}
        if any(n is None for n in counts.values()):
            unchecked.append(spec)
        elif uses_own_data(spec):
            check_source_epochs(spec, counts, file=file)
        else:
            check_epochs(spec, counts[spec.data.corpus], file=file)
    return unchecked


def _about(n: int) -> str:
    """Two significant digits: 1.5M, 420k, 11B."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{float(f'{n / scale:.2g}'):g}{unit}"
    return f"{float(f'{n:.2g}'):g}"


def _missing_line(exc: SpecError, target: str) -> str:
    return (
        f"warning: {target}: {exc.key} {exc.value}: {exc.message}; the dry run goes on, a real submission "
        "refuses it (exit 2)"
    )


def _sequences(tokens: int, seq_lens: set[int]) -> str:
    return "".join(f", {tokens // n:,} sequences of {n}" for n in sorted(seq_lens))


def known_size(
    data: DataSpec, tok: str, target: str, seq_lens: set[int], key: str | None = None
) -> tuple[CorpusSize, str]:
    """What a dry run knows of a corpus's tokens without tokenizing it, and a line saying how it knows:
    counted when prepared, else estimated from its bytes, else unknown; `target` is what `ablate prepare`
    takes to count them, `seq_lens` the runs' sequence lengths."""
    name = f"corpus {data.corpus} ({tok})"
    try:
        sources = resolve_sources(data)
    except CorpusNotFound as exc:
        return CorpusSize(None, missing=True), _missing_line(_located(exc, None, key), target)
    tokenizer = local_tokenizer(tok)
    tokens = None if tokenizer is None else prepared_tokens(data, tokenizer)
    if tokens is not None:
        return CorpusSize(
            tokens, exact=True
        ), f"{name}: {tokens:,} tokens{_sequences(tokens, seq_lens)} (prepared)"
    why = "its tokenizer is not available here" if tokenizer is None else "not prepared yet"
    exact = f"`ablate prepare {target}` counts them"
    estimate = estimated_tokens(data, sources)
    if estimate is None:
        return CorpusSize(None), (
            f"{name}: tokens unknown ({why}; its bytes say little: compressed, a dataset "
            f"or max_documents); {exact}"
        )
    size = sum(src.stat()["size"] for src in sources)
    return CorpusSize(estimate), (
        f"{name}: ~{_about(estimate)} tokens, an estimate from its {_about(size)} bytes "
        f"at ~{BYTES_PER_TOKEN:g} bytes a token ({why}); {exact}"
    )


def corpus_sizes(specs: list[RunSpec], target: str) -> tuple[dict[str, CorpusSize], list[str]]:
    """known_size of each distinct corpus, by corpus_key, and the lines of the dry run: one per corpus, and a
    warning per missing held-out corpus."""
    sizes, lines = {}, []
    for data, tok, runs, ones in _by_corpus(specs):
        sizes[corpus_key(ones[0])], line = known_size(
            data, tok, target, {s.data.seq_len for s in ones}, written_key(runs[0], data.corpus)
        )
        lines.append(line)
    held_out = [exc for exc in check_corpora(specs, target) if exc.key == "data.valid_corpus"]
    return sizes, lines + [_missing_line(exc, target) for exc in held_out]


def prepare_corpora(
    specs: list[RunSpec],
    workers: int | None = None,
    verify: bool = False,
    out: Print = print,
    shard_tokens: int | None = None,
) -> list[Path]:
    """Prepare each distinct corpus (or wait for whoever is preparing it); with verify, re-hash every prepared
    file and source and raise a SpecError on a mismatch."""
    from ablate.data.prepare import prepare
    from ablate.data.prepared import PreparedCorpus
    from ablate.models.loading import load_tokenizer

    folders = []
    for data, tok in distinct_corpora(specs):
        tokenizer = load_tokenizer(tok)
        folder = prepare(
            data, tokenizer, workers=workers, **({"shard_tokens": shard_tokens} if shard_tokens else {})
        )
        corpus = PreparedCorpus(folder)
        if verify:
            bad = corpus.verify() + _changed_content(corpus.manifest, data)
            if bad:
                raise SpecError(
                    "checksums do not match the manifest; re-prepare: delete the folder and run "
                    f"ablate prepare again ({folder})",
                    file=", ".join(bad),
                )
        out(
            f"{data.corpus} ({tok}): {corpus.n_documents:,} documents, {corpus.n_tokens:,} tokens "
            f"({corpus.manifest['dtype']}) in {folder}" + (" - verified" if verify else "")
        )
        folders.append(folder)
    return folders


def _changed_content(manifest: dict, data: DataSpec) -> list[str]:
    by_path = {str(s.path): s for s in resolve_sources(data)}
    return [
        rec["path"]
        for rec in manifest["sources"]
        if "sha256" in rec and rec["path"] in by_path and by_path[rec["path"]].content_hash() != rec["sha256"]
    ]


def unprepared(specs: list[RunSpec]) -> list[RunSpec]:
    """Runs whose corpus has no complete prepared folder yet (a changed corpus is a SpecError here)."""
    from ablate.models.loading import load_tokenizer

    missing = []
    for data, tok, group, _ in _by_corpus(specs):
        tokenizer = load_tokenizer(tok)
        if find_prepared(data, tokenizer)[1] is None:
            missing += [spec for spec in group if spec not in missing]
        else:
            open_prepared(data, tokenizer)  # refuses a corpus that changed since it was prepared
    return missing


def prepare_job(spec_dicts: list[dict]) -> str:
    """The Slurm preparation job: its CPUs are the workers."""
    prepare_corpora([RunSpec.model_validate(d) for d in spec_dicts], out=lambda line: print(line, file=sys.stderr))
    return "prepared"


def prepare_for_sweep(
    kind: str,
    launcher: Launcher,
    specs: list[RunSpec],
    folder: Path,
    name: str,
    out: Print = print,
    file: str | None = None,
) -> str | None:
    """Prepare before the first run: here for local and debug executors; on Slurm submit one preparation
    job and return its id (the arms then depend on it), or None when nothing needs preparing. Either way the
    runs of every prepared corpus are checked against it first (check_budgets; `file` names the grid)."""
    if kind != "slurm":
        prepare_corpora(specs, out=out)
        check_budgets(specs, file)
        return None
    todo = unprepared(specs)
    waiting = {spec.run_id for spec in todo}
    check_budgets([spec for spec in specs if spec.run_id not in waiting], file)
    if not todo:
        return None
    s = launcher.slurm
    one_task = launcher.model_copy(
        update={"slurm": s.model_copy(update={"gpus_per_node": 0, "nodes": 1, "tasks_per_node": 1})}
    )
    executor = make_executor("slurm", one_task, folder, f"ablate-prepare-{name}")
    job = executor.submit(prepare_job, [spec.model_dump(mode="json") for spec in todo])
    out(
        f"submitted the preparation of {len(distinct_corpora(todo))} corpora as job {job.job_id}; the runs wait "
        f"for it (afterok) and each checks its corpus's epochs (data.max_epochs) at its start"
    )
    return str(job.job_id)


def after(job_id: str, launcher: Launcher) -> dict:
    """Slurm parameters of arms that start only after the preparation job succeeded (and are cancelled if
    it fails, rather than wait forever)."""
    return {
        "slurm_additional_parameters": {
            **launcher.slurm.additional_parameters,
            "dependency": f"afterok:{job_id}",
            "kill_on_invalid_dep": "yes",
        }
    }


def specs_for_target(target: str, tokenizer: str | None) -> list:
    """The run specs a prepare target stands for: a grid's runs, one run spec, or a corpus path (with
    --tokenizer, default the default model's) read with default options."""
    from ablate.config.base import read_yaml
    from ablate.config.spec import parse_run_spec

    path = Path(target)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        data = read_yaml(path)
        if isinstance(data, dict) and "model" not in data:
            from ablate.config.grid import load_grid
            from ablate.plan.grid import expand

            return [r.spec for r in expand(load_grid(path), file=str(path))]
        return [parse_run_spec(data, file=str(path))]
    from ablate.models.loading import DEFAULT_MODEL

    return [
        parse_run_spec(
            {
                "model": tokenizer or DEFAULT_MODEL,
                "data": {"corpus": target},
                "phases": [{"name": "prepare", "objective": "mlm", "steps": 1}],
            },
            file=target,
        )
    ]
