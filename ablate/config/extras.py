"""The optional libraries and the extra of `pip install 'ablate[EXTRA]'` that brings each: `hf` (datasets, for
hf: corpora and `format: hf` tasks), `trackers` (TensorBoard, MLflow, W&B), `tune` (optuna-dashboard, the
MariaDB driver). A missing one is a SpecError (exit 2) naming the extra to install, raised where the library is
first needed: at validation where a file names it (a grid's tracker, an hf: corpus), else at its import.

May import: config.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from ablate.config.errors import SpecError

EXTRA_OF = {  # module -> the extra that installs it (pyproject.toml's [project.optional-dependencies])
    "datasets": "hf",
    "tensorboard": "trackers",
    "mlflow": "trackers",
    "wandb": "trackers",
    "optuna_dashboard": "tune",
    "pymysql": "tune",
}


def install_command(module: str) -> str:
    return f"pip install 'ablate[{EXTRA_OF[module]}]'"


def installed(module: str) -> bool:
    """Whether the module can be imported, found without importing it (mlflow and wandb take seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module set to None in sys.modules
        return False


def _missing(module: str, needed_for: str, reason: str = "which is not installed", **where) -> SpecError:
    return SpecError(
        f"{needed_for} needs the {module!r} package, {reason}", allowed=install_command(module), **where
    )


def require(module: str, needed_for: str, **where) -> None:
    """A SpecError naming the extra when `module` is not installed; `where`: file, key, value of the input
    that asks for it."""
    if not installed(module):
        raise _missing(module, needed_for, **where)


def load(module: str, needed_for: str, **where) -> ModuleType:
    """The module imported; a SpecError naming the extra when it cannot be."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        broken = exc.name is not None and exc.name.split(".")[0] != module  # installed, one of its imports not
        reason = f"which does not import ({exc})" if broken else "which is not installed"
        raise _missing(module, needed_for, reason, **where) from None
