"""Where things live: the data root, the tokenization cache, the results root.

Each is an environment variable with a documented default, so tests, CI and Slurm jobs can point at
shared storage without editing grids. A grid or run spec may also name `data_root` explicitly.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ROOT_ENV = "ABLATE_DATA_ROOT"    # default: ./data
CACHE_ENV = "ABLATE_CACHE"            # default: ~/.cache/ablate
RESULTS_ENV = "ABLATE_RESULTS"        # default: ./results


def data_root(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get(DATA_ROOT_ENV, "data")).expanduser()


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "ablate")).expanduser()


def results_root(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get(RESULTS_ENV, "results")).expanduser()


def resolve_data_path(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """A relative data path is relative to the data root; an absolute one stays as it is."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else data_root(root) / p
