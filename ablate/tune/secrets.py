"""Where a server database's URL comes from when it holds a password: never the tune file, the study's folder,
a log or a table, but where the user keeps secrets. The tune file (or `--storage`) names the place:

    storage: env:ABLATE_OPTUNA_URL          # an environment variable the tune and its jobs see
    storage: file:~/.config/ablate/optuna.url   # a file readable by its owner only (chmod 600)

That reference is what the study's folder and each run's tune.json keep; each process that opens the storage
(the tune, its jobs, the dashboard, the figure) reads the URL from the place itself.

May import: config, tune.rdb.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ablate.config.errors import SpecError
from ablate.tune.rdb import is_rdb_url, parse_url

ENV_PREFIX = "env:"
FILE_PREFIX = "file:"
WHERE_SECRETS_GO = (
    "the URL in an environment variable (storage: env:NAME) or in a file readable by you only "
    "(storage: file:PATH, chmod 600)"
)


def is_reference(storage: str) -> bool:
    return storage.startswith((ENV_PREFIX, FILE_PREFIX))


def written_reference(storage: str, tune_file: str | None) -> str:
    """The storage as the study's files may keep it: a file: reference made absolute (relative to the tune
    file's folder), anything else as given. A literal URL with a password is refused: it would be copied into
    the study's folder (tune.yaml, study.json, every run's tune.json), which is shared and published."""
    if storage.startswith(FILE_PREFIX):
        path = Path(storage.removeprefix(FILE_PREFIX)).expanduser()
        if not path.is_absolute() and tune_file:
            path = Path(tune_file).resolve().parent / path
        return FILE_PREFIX + str(path)
    if is_rdb_url(storage) and not is_reference(storage) and parse_url(storage).password:
        raise SpecError(
            "a database password in the storage URL would be written into the study's folder",
            file=tune_file,
            key="storage",
            value=parse_url(storage).render_as_string(hide_password=True),
            allowed=WHERE_SECRETS_GO,
        )
    return storage


def resolve(storage: str) -> str:
    """The URL behind an env: or file: reference (anything else as given); exit 2 when the place is missing,
    empty, or (a file) readable by others."""
    if storage.startswith(ENV_PREFIX):
        name = storage.removeprefix(ENV_PREFIX)
        url = os.environ.get(name, "").strip()
        if not url:
            raise SpecError(
                f"the environment variable {name} is not set (or empty) in this process",
                key="storage",
                value=storage,
                allowed=f"export {name}=URL where `ablate tune` and its jobs run",
            )
        return url
    if storage.startswith(FILE_PREFIX):
        return _read_credentials(Path(storage.removeprefix(FILE_PREFIX)).expanduser())
    return storage


def _read_credentials(path: Path) -> str:
    try:
        info = path.stat()
    except OSError as exc:
        raise SpecError(
            f"cannot read the credentials file ({exc.strerror})",
            key="storage",
            value=FILE_PREFIX + str(path),
            allowed="a file holding the storage URL, chmod 600",
        ) from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO) or info.st_uid != os.getuid():
        raise SpecError(
            f"the credentials file is readable by others (mode {stat.filemode(info.st_mode)}, owner "
            f"uid {info.st_uid})",
            key="storage",
            value=FILE_PREFIX + str(path),
            allowed=f"a file of your own that only you can read: chmod 600 {path}",
        )
    url = path.read_text().strip()
    if not url:
        raise SpecError(
            "the credentials file is empty",
            key="storage",
            value=FILE_PREFIX + str(path),
            allowed="the storage URL on one line",
        )
    return url
