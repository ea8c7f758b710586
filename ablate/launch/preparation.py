"""Corpora of a set of runs, prepared once before the runs start: checked (missing, empty, unreadable: a
SpecError before anything is submitted), then tokenized into prepared folders, each distinct (corpus,
tokenizer) once. Locally in this process; on Slurm as one job the arms depend on (afterok), and no job at
all when every prepared folder is complete.

May import: config, store, data, models, launch.executors.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from ablate.config.errors import SpecError
from ablate.config.grid import Launcher
from ablate.config.spec import DataSpec, RunSpec
from ablate.data.corpus import open_prepared
from ablate.data.prepare import prepared_folder, read_manifest, tokenizer_fingerprint
from ablate.data.sources import resolve_sources
from ablate.launch.executors import make_executor

Print = Callable[[str], None]
# what decides the prepared tokens; the other data fields (seq_len, data_seed, valid_corpus) do not
READING_FIELDS = ("corpus", "format", "text_field", "max_documents", "errors", "data_root", "prepared_root")


def distinct_corpora(specs: list[RunSpec]) -> list[tuple[DataSpec, str]]:
    """(data spec, tokenizer reference) for each distinct corpus reading and tokenizer, in first-seen order."""
    seen: dict[str, tuple[DataSpec, str]] = {}
    for spec in specs:
        tok = spec.tokenizer or spec.model
        key = repr(([getattr(spec.data, f) for f in READING_FIELDS], tok))
        seen.setdefault(key, (spec.data, tok))
    return list(seen.values())


def check_corpora(specs: list[RunSpec], file: str | None = None) -> None:
    """Every corpus exists, is readable and not empty (SpecError naming the grid or spec file otherwise)."""
    for data, _ in distinct_corpora(specs):
        try:
            resolve_sources(data)
        except SpecError as exc:
            raise SpecError(exc.message, file=exc.file or file, key=exc.key, value=exc.value,
                            allowed=exc.allowed) from None


def prepare_corpora(specs: list[RunSpec], workers: int | None = None, verify: bool = False,
                    out: Print = print, shard_tokens: int | None = None) -> list[Path]:
    """Prepare each distinct corpus (or wait for whoever is preparing it); with verify, re-hash every prepared
    file and source and raise a SpecError on a mismatch."""
    from ablate.data.prepare import prepare
    from ablate.data.prepared import PreparedCorpus
    from ablate.models.sources import load_tokenizer

    folders = []
    for data, tok in distinct_corpora(specs):
        tokenizer = load_tokenizer(tok)
        folder = prepare(data, tokenizer, workers=workers, **({"shard_tokens": shard_tokens} if shard_tokens else {}))
        corpus = PreparedCorpus(folder)
        if verify:
            bad = corpus.verify() + _changed_content(corpus.manifest, data)
            if bad:
                raise SpecError("checksums do not match the manifest; re-prepare: delete the folder and run "
                                f"ablate prepare again ({folder})", file=", ".join(bad))
        out(f"{data.corpus} ({tok}): {corpus.n_documents:,} documents, {corpus.n_tokens:,} tokens "
            f"({corpus.manifest['dtype']}) in {folder}" + (" - verified" if verify else ""))
        folders.append(folder)
    return folders


def _changed_content(manifest: dict, data: DataSpec) -> list[str]:
    by_path = {str(s.path): s for s in resolve_sources(data)}
    return [rec["path"] for rec in manifest["sources"]
            if "sha256" in rec and rec["path"] in by_path and by_path[rec["path"]].content_hash() != rec["sha256"]]


def unprepared(specs: list[RunSpec]) -> list[RunSpec]:
    """Runs whose corpus has no complete prepared folder yet (a changed corpus is a SpecError here)."""
    from ablate.models.sources import load_tokenizer

    missing = []
    for data, tok in distinct_corpora(specs):
        tokenizer = load_tokenizer(tok)
        folder = prepared_folder(data, resolve_sources(data), tokenizer_fingerprint(tokenizer))
        if read_manifest(folder) is None:
            missing += [s for s in specs if s.data == data and (s.tokenizer or s.model) == tok]
        else:
            open_prepared(data, tokenizer)      # refuses a corpus that changed since it was prepared
    return missing


def prepare_job(spec_dicts: list[dict]) -> str:
    """The Slurm preparation job: its CPUs are the workers."""
    prepare_corpora([RunSpec.model_validate(d) for d in spec_dicts], out=lambda line: print(line, file=sys.stderr))
    return "prepared"


def prepare_for_sweep(kind: str, launcher: Launcher, specs: list[RunSpec], folder: Path, name: str,
                      out: Print = print) -> str | None:
    """Prepare before the first run: here for local and debug executors; on Slurm submit one preparation
    job and return its id (the arms then depend on it), or None when nothing needs preparing."""
    if kind != "slurm":
        prepare_corpora(specs, out=out)
        return None
    todo = unprepared(specs)
    if not todo:
        return None
    s = launcher.slurm
    one_task = launcher.model_copy(update={"slurm": s.model_copy(update={"gpus_per_node": 0, "nodes": 1,
                                                                          "tasks_per_node": 1})})
    executor = make_executor("slurm", one_task, folder, f"ablate-prepare-{name}")
    job = executor.submit(prepare_job, [spec.model_dump(mode="json") for spec in todo])
    out(f"submitted the preparation of {len(distinct_corpora(todo))} corpora as job {job.job_id}; the runs wait "
        f"for it (afterok)")
    return str(job.job_id)


def after(job_id: str, launcher: Launcher) -> dict:
    """Slurm parameters of arms that start only after the preparation job succeeded (and are cancelled if
    it fails, rather than wait forever)."""
    return {"slurm_additional_parameters": {**launcher.slurm.additional_parameters, "dependency": f"afterok:{job_id}",
                                            "kill_on_invalid_dep": "yes"}}


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
    from ablate.models.sources import DEFAULT_MODEL

    return [parse_run_spec({"model": tokenizer or DEFAULT_MODEL, "data": {"corpus": target},
                            "phases": [{"name": "prepare", "objective": "mlm", "steps": 1}]}, file=target)]
