"""A study on a server database (MySQL / MariaDB, PostgreSQL, or any SQLAlchemy URL): the URL parsed, its
driver imported and its server reached before anything runs, each failure an exit-2 error that names the
`storage` key and what to do; and the URL as printed (password hidden).

May import: config.
"""

from __future__ import annotations

from ablate.config.errors import SpecError
from ablate.config.extras import install_command

# what to install for the drivers people name; any other is "the package that provides <module>"
DRIVER_PACKAGES = {
    "pymysql": f"{install_command('pymysql')} (PyMySQL)",
    "MySQLdb": f"{install_command('pymysql')} and name PyMySQL in the URL: mysql+pymysql://USER:PASS@HOST:PORT/DB",
    "psycopg2": "pip install psycopg2-binary",
    "psycopg": "pip install 'psycopg[binary]'",
}
START_SERVER = (
    "start it (for the local cluster: bash scripts/slurm-local.sh start; "
    "`scripts/slurm-local.sh optuna-db` prints its URL) or fix the host, port or unix_socket in the URL"
)
# the driver's error codes for "nobody answers there" (MySQL client 2002/2003/2005/2013), else a refusal
UNREACHABLE_CODES = {2002, 2003, 2005, 2013}


def shown_url(url: str) -> str:
    """The URL to print: the password replaced by ***."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: there is no password to find in it
        return url


def parse_url(url: str):
    """The SQLAlchemy URL, or a SpecError naming the storage key."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)
    except ArgumentError as exc:
        raise SpecError(
            f"not a database URL: {exc}",
            key="storage",
            value=shown_url(url),
            allowed="dialect+driver://USER:PASS@HOST:PORT/DB, e.g. "
            "mysql+pymysql://optuna:PASS@127.0.0.1:3307/optuna",
        ) from None


def check_driver(url: str) -> None:
    """The URL's dialect is one SQLAlchemy knows and its driver module imports."""
    from sqlalchemy.exc import NoSuchModuleError

    parsed = parse_url(url)
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise SpecError(
            f"no database dialect/driver {parsed.drivername!r}",
            key="storage",
            value=shown_url(url),
            allowed="mysql+pymysql, postgresql+psycopg2, sqlite (or sqlite / journal for a file)",
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        module = exc.name or parsed.get_driver_name()
        raise SpecError(
            f"the URL's database driver {parsed.get_driver_name()!r} is not installed (no module {module!r})",
            key="storage",
            value=shown_url(url),
            allowed=DRIVER_PACKAGES.get(module, f"install the package that provides {module}"),
        ) from None


def is_rdb_url(storage: str) -> bool:
    """An RDB URL, not the sqlite / journal shorthands or a journal path."""
    return "://" in storage and not storage.startswith("journal:") and not storage.endswith(".journal")


def in_file(exc: SpecError, file: str | None) -> SpecError:
    """The same error, located in the tune file the storage came from."""
    return SpecError(exc.message, file=file, key=exc.key, value=exc.value, allowed=exc.allowed)


def check_storage_driver(storage: str, file: str | None) -> None:
    """For a tune file's RDB URL: its driver imports (no connection; the server is reached when the study
    opens)."""
    if not is_rdb_url(storage):
        return
    try:
        check_driver(storage)
    except SpecError as exc:
        raise in_file(exc, file) from None


def _server(parsed) -> str:
    socket = parsed.query.get("unix_socket")
    if socket:
        return f"unix socket {socket}"
    return f"{parsed.host or 'localhost'}" + (f":{parsed.port}" if parsed.port else "")


def connection_error(url: str, exc: Exception) -> SpecError:
    """The SpecError for a server that did not let the storage open: unreachable, or refused."""
    orig = getattr(exc, "orig", None) or exc
    code = orig.args[0] if getattr(orig, "args", None) and isinstance(orig.args[0], int) else None
    detail = f"{type(orig).__name__}: {orig}"
    parsed = parse_url(url)
    if code in UNREACHABLE_CODES or "connect" in str(orig).lower():
        return SpecError(
            f"the database server at {_server(parsed)} does not answer ({detail})",
            key="storage",
            value=shown_url(url),
            allowed=START_SERVER,
        )
    return SpecError(
        f"the database server at {_server(parsed)} refused the storage ({detail})",
        key="storage",
        value=shown_url(url),
        allowed="check the user, password and database in the URL",
    )


def open_rdb(url: str):
    """optuna.storages.RDBStorage on the URL, its driver and server checked first."""
    import optuna
    from sqlalchemy.exc import OperationalError

    check_driver(url)
    try:
        return optuna.storages.RDBStorage(url)
    except OperationalError as exc:
        raise connection_error(url, exc) from None
    except Exception as exc:  # e.g. a schema Optuna cannot use
        raise SpecError(
            f"cannot open storage: {type(exc).__name__}: {exc}", key="storage", value=shown_url(url)
        ) from None
