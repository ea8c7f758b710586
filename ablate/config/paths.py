"""Where things live: the data root, the cache, prepared token shards, the results root, and the grids, tasks
and suites shipped with ablate.

Each location is an environment variable with a documented default, so tests, CI and Slurm jobs can point at
shared storage without editing grids. A grid or run spec may also name `data_root` explicitly.

The shipped grids are the repository's grids/ folder: installed as package data (ablate/grids in a wheel), read
in place in a source checkout (an editable install, the tests).

May import: nothing of ablate.
"""

from __future__ import annotations

import importlib.resources
import os
import sys
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


SHIPPED = "grids"  # the folder of shipped grids, as users and the docs name it: grids/smoke.yaml


def shipped_grids() -> Path:
    """The grids shipped with ablate (grids/tasks and grids/suites inside): the wheel's package data, else the
    grids/ folder of the source checkout this module runs from."""
    installed = importlib.resources.files("ablate") / SHIPPED
    if isinstance(installed, Path) and installed.is_dir():
        return installed
    return Path(__file__).resolve().parents[2] / SHIPPED


def given_or_shipped(path: str) -> str:
    """A grid, run spec or tune file named on the command line: as given when it exists (relative to the
    working directory), else grids/NAME falls back to the shipped copy, so that the documented commands
    (`ablate sweep grids/smoke.yaml`) run from any folder. A note on stderr says which file was read."""
    given = Path(path)
    if given.exists() or given.is_absolute() or not given.parts or given.parts[0] != SHIPPED:
        return path
    shipped = shipped_grids().joinpath(*given.parts[1:])
    if not shipped.is_file():
        return path  # not found either way: the reader names the path as given
    print(f"note: no {path} in {Path.cwd()}; reading the copy shipped with ablate: {shipped}", file=sys.stderr)
    return str(shipped)


def registry_dir(env: str, shipped: str) -> Path:
    """A registry of declarative files (tasks, suites): $env if set, else grids/<shipped> of the shipped grids."""
    value = os.environ.get(env)
    return Path(value).expanduser() if value else shipped_grids() / shipped


def registry_names(folder: Path) -> list[str]:
    """The names of a registry's files: the stems of its *.yaml."""
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
