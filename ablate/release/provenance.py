"""What a run's folder records about how its model was made, read for its model card: the spec, records/run.json
(token hashes, tokens, versions), records/frozen.json (what each phase froze) and the prepared corpus's
manifest (the fingerprint of the data it read).

May import: config, store, data, models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ablate.config import objectives
from ablate.config.errors import SpecError
from ablate.config.spec import RunSpec
from ablate.store import rundir


@dataclass(frozen=True)
class PhaseFacts:
    """One phase as the card describes it: the spec's phase, its resolved length and what it froze."""

    name: str
    objective: str
    mask_rate: float | None  # None for CLM
    steps: int
    tokens: int | None  # records/run.json phase_tokens (None for records without them)
    token_hash: str | None
    lr: str  # "peak 1e-4, warmup 2 steps, 1-sqrt decay to 0.1 x peak"
    freeze: str  # as written: "low, head"
    frozen_layers: list[int]  # as resolved (-1: the embeddings)


@dataclass(frozen=True)
class RunFacts:
    run_id: str
    run_dir: Path
    spec: RunSpec
    record: dict  # records/run.json
    phases: list[PhaseFacts]
    corpus: dict  # the data's fingerprint: the spec's data fields and the prepared manifest's
    versions: dict


def read_run_facts(run_dir: Path) -> RunFacts:
    """Everything the card says about training, from a done run's folder (SpecError when a record is missing)."""
    try:
        spec = rundir.read_spec(run_dir)
        record = rundir.read_json(run_dir / "records" / "run.json")
    except (OSError, ValueError) as exc:
        raise SpecError(
            f"the run's records cannot be read ({type(exc).__name__}: {exc})",
            file=str(run_dir),
            key="records/run.json",
        ) from None
    frozen = _frozen_by_phase(run_dir)
    return RunFacts(
        run_id=run_dir.name,
        run_dir=run_dir,
        spec=spec,
        record=record,
        phases=phase_facts(spec, record, frozen),
        corpus=corpus_fingerprint(spec),
        versions=_versions(record),
    )


def _frozen_by_phase(run_dir: Path) -> dict[str, list[int]]:
    """records/frozen.json as {phase: sorted layers}; an older run without the record falls back on the plan."""
    path = run_dir / "records" / "frozen.json"
    if not path.is_file():
        return {}
    cols = rundir.read_json(path)
    out: dict[str, list[int]] = {}
    for phase, layer in zip(cols.get("phase", []), cols.get("layer", [])):
        out.setdefault(phase, []).append(int(layer))
    return {phase: sorted(layers) for phase, layers in out.items()}


def describe_lr(spec: RunSpec, phase) -> str:
    lr = phase.lr
    parts = [f"peak {lr.peak_lr if lr.peak_lr is not None else spec.optim.lr:g}"]
    if lr.warmup_steps:
        parts.append(f"warmup {lr.warmup_steps} steps")
    elif lr.warmup_fraction:
        parts.append(f"warmup {lr.warmup_fraction:g} of the phase")
    parts.append("constant" if lr.decay == "constant" else f"{lr.decay} decay to {lr.final_fraction:g} x peak")
    return ", ".join(parts)


def phase_facts(spec: RunSpec, record: dict, frozen: dict[str, list[int]]) -> list[PhaseFacts]:
    tokens = record.get("phase_tokens") or {}
    hashes = record.get("phase_token_hashes") or {}
    out = []
    for phase, steps in zip(spec.phases, spec.phase_steps()):
        rate = objectives.get(phase.objective).identity(phase).get("mask_rate")
        out.append(
            PhaseFacts(
                name=phase.name,
                objective=phase.objective,
                mask_rate=rate,
                steps=steps,
                tokens=tokens.get(phase.name),
                token_hash=hashes.get(phase.name),
                lr=describe_lr(spec, phase),
                freeze=", ".join(phase.freeze),
                frozen_layers=frozen.get(phase.name, []),
            )
        )
    return out


def _versions(record: dict) -> dict:
    versions = record.get("versions") or {}
    if isinstance(versions, str):  # run.json keeps them as a JSON string (a flat column of the runs table)
        try:
            versions = json.loads(versions)
        except ValueError:
            return {"versions": versions}
    return versions if isinstance(versions, dict) else {"versions": str(versions)}


def corpus_fingerprint(spec: RunSpec) -> dict:
    """The spec's data fields and, when the prepared folder is still there, its manifest's identity of the
    sources (path, size, sha256), token and document counts and tokenizer fingerprint."""
    data = spec.data.model_dump(mode="json", exclude={"data_root", "prepared_root"})
    out = {"data": data, "manifest": None, "prepared": None}
    found = _prepared_manifest(spec)
    if found is not None:
        folder, manifest = found
        out["prepared"] = str(folder)
        out["manifest"] = {
            k: manifest.get(k) for k in ("n_tokens", "n_documents", "tokenizer_fingerprint", "dtype", "vocab_size")
        }
        out["manifest"]["sources"] = [
            {k: s.get(k) for k in ("path", "size", "sha256", "fingerprint") if k in s}
            for s in manifest.get("sources", [])
        ]
    return out


def _prepared_manifest(spec: RunSpec) -> tuple[Path, dict] | None:
    """(folder, manifest) of the run's prepared corpus; None when it cannot be found here (the tokenizer does
    not load offline, the sources moved, or the prepared folder was removed)."""
    from ablate.data.corpus import find_prepared
    from ablate.models.loading import load_tokenizer

    try:
        tokenizer = load_tokenizer(spec.tokenizer or spec.model, local_only=True)
        if tokenizer is None:
            return None
        folder, manifest, _ = find_prepared(spec.data, tokenizer)
    except (SpecError, OSError):
        return None
    return None if manifest is None else (folder, manifest)
