"""Where things live: the data root, the cache, prepared token shards, the results root.

Each is an environment variable with a documented default, so tests, CI and Slurm jobs can point at
shared storage without editing grids. A grid or run spec may also name `data_root` explicitly.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ROOT_ENV = "ABLATE_DATA_ROOT"  # default: ./data
CACHE_ENV = "ABLATE_CACHE"  # default: ~/.cache/ablate
RESULTS_ENV = "ABLATE_RESULTS"  # default: ./results
PREPARED_ENV = "ABLATE_PREPARED"  # default: <cache>/prepared (on a cluster: shared storage)


def absolute_env_paths() -> None:
    """Make the location variables that are set absolute, against this process's working directory: jobs,
    workers and subprocesses inherit them but may start elsewhere (`ABLATE_DATA_ROOT=../data`)."""
    for name in (DATA_ROOT_ENV, CACHE_ENV, RESULTS_ENV, PREPARED_ENV):
        if os.environ.get(name):
            os.environ[name] = str(Path(os.environ[name]).expanduser().absolute())


def data_root(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get(DATA_ROOT_ENV, "data")).expanduser()


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "ablate")).expanduser()


def prepared_root(explicit: str | os.PathLike | None = None) -> Path:
    """Where prepared token shards live: data.prepared_root, else $ABLATE_PREPARED, else <cache>/prepared."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get(PREPARED_ENV)
    return Path(env).expanduser() if env else cache_dir() / "prepared"


def results_root(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get(RESULTS_ENV, "results")).expanduser()


def resolve_data_path(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """A relative data path is relative to the data root; an absolute one stays as it is."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else data_root(root) / p


def registry_dir(env: str, shipped: str) -> Path:
    """A registry of declarative files (tasks, suites): $env if set, else grids/<shipped> of this checkout."""
    value = os.environ.get(env)
    return Path(value).expanduser() if value else Path(__file__).resolve().parents[2] / "grids" / shipped


def registry_names(folder: Path) -> list[str]:
    """The names of a registry's files: the stems of its *.yaml."""
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
