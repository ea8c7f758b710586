"""Traced step memories kept on disk, so that a second dry run, a requeued job and `--retry-failed` read what
an earlier process traced (ablate.predict.gpu_memory; docs/gpu-memory.md, "The trace cache").

An entry is one JSON file named by the sha256 of everything its trace depends on: the caller's inputs (the
step's shape, the model's config, the spec's settings the trace reads) and this machine's side of it, which
`environment` states: the torch, transformers and kernels versions, the SDPA backends torch may pick and its
deterministic-algorithms switch (the kernel CUDA would run: ablate.predict.meta_cuda), and a digest of ablate's
own source the trace runs through (TRACED_SOURCES): a change to the attention, the loss or the loop names new
entries and the old ones are never read again. The inputs are stored beside the result and compared on
reading, so an entry is used only for exactly the inputs it was traced for.

The folder is `$ABLATE_CACHE/gpu-memory` (default ~/.cache/ablate/gpu-memory): entries are keyed by content,
not by sweep, so every grid, results root and Slurm job that reaches that folder shares them. Writes are atomic
(ablate.store.atomic: a reader sees a whole file or none), so processes may read and write it at once. An
entry carries its format and a sha256 of its result; one that cannot be read or parsed, of another format,
written for other inputs, whose result does not match its checksum or whose values are not what the plan
reads (byte counts as non-negative integers: a "0" is no count) is ignored, named on stderr and in the dry
run's summary, and the step traced again over it; a folder that cannot be written only costs the next
process that trace (docs/reliability.md).

May import: config, store.
"""

from __future__ import annotations

import hashlib
import json
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import torch

from ablate.config.paths import cache_dir
from ablate.store.atomic import write_text

FORMAT = 2  # an entry's layout (2: with its result's checksum); a new one names new files
FOLDER = "gpu-memory"
PACKAGE = Path(__file__).resolve().parents[1]  # ablate/
# ablate's code a traced step runs (relative to the package): the loop, the objectives' batches and attention
# patterns, the models' attention kernels, the meta CUDA router, the phase plans and freezing, the tracer
TRACED_SOURCES = (
    "train",
    "models",
    "config/objectives",
    "config/spec.py",
    "plan/phases.py",
    "plan/freezing.py",
    "analysis/probe.py",
    "data/corpus.py",
    "predict/gpu_memory.py",
    "predict/trace_cache.py",
)
VERSIONED = ("torch", "transformers", "kernels")  # the distributions whose code the trace runs

counts = {"traced": 0, "read": 0}  # this process's step shapes: traced, or read from the folder
ignored: list[str] = []  # this process's entries that failed their check: "<path>: <what is wrong>"


def folder() -> Path:
    return cache_dir() / FOLDER


@lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over the path and bytes of every .py file under TRACED_SOURCES (a missing one counts as such)."""
    digest = hashlib.sha256()
    for source in TRACED_SOURCES:
        path = PACKAGE / source
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(PACKAGE)).encode())
            digest.update(file.read_bytes() if file.is_file() else b"<missing>")
    return digest.hexdigest()


@lru_cache(maxsize=None)
def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """This process's side of a trace: versions, the kernel choice's switches, ablate's traced source."""
    return {
        "versions": {name: _version(name) for name in VERSIONED},
        "sdpa_enabled": {
            "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        },
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "source": source_digest(),
    }


def entry_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """What an entry is keyed by and stores: the caller's inputs and the environment, as JSON reads them back
    (tuples as lists), so a stored entry compares equal to the inputs it was written for."""
    return json.loads(json.dumps({"format": FORMAT, "inputs": inputs, "environment": environment()}))


def path_of(keyed: dict[str, Any]) -> Path:
    text = json.dumps(keyed, sort_keys=True, separators=(",", ":"))
    return folder() / f"{hashlib.sha256(text.encode()).hexdigest()}.json"


def checksum(result: dict[str, Any]) -> str:
    """sha256 of the result as stored (sorted keys, no spaces): what an entry's "sha256" must match."""
    return hashlib.sha256(json.dumps(result, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Damaged(ValueError):
    """An entry that is there but fails its check: ignored, named, and traced again over."""


def read(keyed: dict[str, Any]) -> dict[str, Any] | None:
    """The stored result for `keyed` (entry_inputs), or None where there is no entry; Damaged where there is
    one that cannot be read, is not this format's JSON, was written for other inputs or fails its checksum."""
    path = path_of(keyed)
    try:
        entry = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as exc:  # a folder that cannot be read: as good as absent
        if path.is_file():
            raise Damaged(f"cannot be read ({exc.strerror})") from None
        return None
    except ValueError as exc:  # a file cut short, overwritten, not UTF-8
        raise Damaged(f"not JSON ({exc})") from None
    if not isinstance(entry, dict):
        raise Damaged(f"a JSON {type(entry).__name__}, not an entry")
    if entry.get("format") != FORMAT:
        raise Damaged(f"format {entry.get('format')!r}, this ablate reads {FORMAT}")
    if entry.get("keyed") != keyed:
        raise Damaged("written for other inputs than the name it has")
    result = entry.get("result")
    if not isinstance(result, dict) or entry.get("sha256") != checksum(result):
        raise Damaged("its result does not match its sha256")
    return result


def write(keyed: dict[str, Any], result: dict[str, Any]) -> None:
    """Store `result` for `keyed`, atomically; a folder that cannot be written is left as it is."""
    entry = {"format": FORMAT, "keyed": keyed, "result": result, "sha256": checksum(result)}
    try:
        write_text(path_of(keyed), json.dumps(entry, indent=1, sort_keys=True) + "\n")
    except OSError:  # read-only or full: the next process traces again
        pass


def _ignore(keyed: dict[str, Any], problem: str) -> None:
    note = f"{path_of(keyed)}: {problem}"
    ignored.append(note)
    print(f"warning: trace cache entry ignored and traced again: {note}", file=sys.stderr)


def read_or_trace(
    inputs: dict[str, Any], trace: Callable[[], Any], encode: Callable[[Any], dict], decode: Callable[[dict], Any]
):
    """The result for `inputs`: read from the folder, else `trace()`d and stored. An entry that fails its
    check, or whose result `decode` refuses (KeyError, TypeError, ValueError: a value of the wrong type), is
    ignored, named (`ignored`, stderr) and traced again over."""
    keyed = entry_inputs(inputs)
    try:
        stored = read(keyed)
        result = None if stored is None else decode(stored)
    except Damaged as exc:
        _ignore(keyed, str(exc))
        result = None
    except (KeyError, TypeError, ValueError) as exc:
        _ignore(keyed, f"its result is not what the plan reads ({type(exc).__name__}: {exc})")
        result = None
    if result is not None:
        counts["read"] += 1
        return result
    result = trace()
    counts["traced"] += 1
    write(keyed, encode(result))
    return result


def summary() -> str:
    """What this process did, for the dry run: how many step shapes were traced and how many were read."""
    line = (
        f"step shapes: {counts['traced']} traced, {counts['read']} read from the trace cache ({folder()}; "
        "docs/gpu-memory.md)"
    )
    return "\n".join([line, *(f"  ignored (failed its check, traced again): {note}" for note in ignored)])
