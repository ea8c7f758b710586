"""Where a study lives: its folder (results/<study>/, a sweep folder with study.json and optuna.db or
optuna.journal), its storage URL and the Optuna storage behind it, the study opened (or created) for a
tune, the lock that lets one `ablate tune` at a time drive it, and which storage a dashboard or a figure
means.

May import: config, store, tune.schema, tune.sampling, tune.rdb, tune.secrets.
"""

from __future__ import annotations

import time
from pathlib import Path

from ablate.config.errors import SpecError
from ablate.config.paths import results_root
from ablate.store import atomic, rundir
from ablate.store.lock import FileLock
from ablate.tune.rdb import in_file, open_rdb
from ablate.tune.sampling import make_sampler
from ablate.tune.schema import Tune
from ablate.tune.secrets import resolve

STUDY_RECORD = "study.json"


def study_dir(results_root: Path, study: str) -> Path:
    return Path(results_root) / study


def storage_url(storage: str, sdir: Path) -> str:
    """The storage as the study's files keep it: sqlite:///abs/path, journal:/abs/path, or the RDB URL (or the
    env: / file: reference to it, ablate.tune.secrets) as given."""
    if storage == "sqlite":
        return f"sqlite:///{(Path(sdir) / 'optuna.db').resolve()}"
    if storage == "journal":
        return f"journal:{(Path(sdir) / 'optuna.journal').resolve()}"
    return storage


def open_storage(url: str):
    """sqlite:///..., any SQLAlchemy URL (its driver and server checked), journal:PATH or a path ending in
    .journal; env:NAME / file:PATH read here (ablate.tune.secrets)."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    url = resolve(url)

    if url.startswith("journal:") or url.endswith(".journal"):
        path = url.removeprefix("journal:")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(path))
    if "://" not in url:
        raise SpecError(
            "not a storage URL",
            key="storage",
            value=url,
            allowed="sqlite, journal, journal:PATH, a .journal path, or an RDB URL (sqlite:///..., "
            "mysql+pymysql://USER:PASS@HOST:PORT/DB, postgresql://...)",
        )
    return open_rdb(url)


def trial_id(storage, study: str, number: int) -> int:
    """The storage's id of trial `number` of `study` (what storage calls and Trial objects take)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study), number)


class StudyLock:
    """One `ablate tune` process per study folder: RUNNING trials found at start were left by a dead one."""

    def __init__(self, sdir: Path):
        self.lock = FileLock(Path(sdir) / ".tune.lock")

    def __enter__(self):
        if not self.lock.acquire(wait_s=0):
            raise SpecError(
                "another `ablate tune` is running this study", key="study", value=self.lock.path.parent.name
            )
        return self

    def __exit__(self, *exc):
        self.lock.release()


def open_study(tune: Tune, sdir: Path):
    """The tune's study in its storage, created on the first run (the file's enqueued trials then queued
    first), with the tune file and study.json (study name, storage URL) written into its folder. Returns
    (study, storage, url)."""
    import optuna

    spec = tune.spec
    sdir.mkdir(parents=True, exist_ok=True)
    url = storage_url(spec.storage, sdir)
    try:
        storage = open_storage(url)
    except SpecError as exc:
        raise in_file(exc, tune.file) from None
    try:
        n_existing = len(optuna.load_study(study_name=spec.study, storage=storage).trials)
    except KeyError:
        n_existing = 0
    study = optuna.create_study(
        study_name=spec.study,
        storage=storage,
        load_if_exists=True,
        direction=spec.effective_direction,
        sampler=make_sampler(tune, n_existing),
    )
    if study.direction.name.lower() != spec.effective_direction:
        raise SpecError(
            f"study {spec.study!r} exists with direction {study.direction.name.lower()}",
            file=tune.file,
            key="direction",
            value=spec.effective_direction,
        )
    if not n_existing:
        for fixed in spec.enqueue:
            study.enqueue_trial(fixed)
    if tune.file:
        atomic.write_text(sdir / "tune.yaml", Path(tune.file).read_text())
    atomic.write_json(
        sdir / STUDY_RECORD,
        {
            "study": spec.study,
            "storage": url,
            "tune_file": str(Path(tune.file).resolve()) if tune.file else None,
            "updated": time.time(),
        },
    )
    return study, storage, url


def resolve_storage(study: str | None, storage: str | None, results: str | None) -> tuple[str, str | None]:
    """(storage url, study name) for the dashboard: --storage as given (sqlite/journal: the study's
    folder under the results root), else the storage of the study named (or the most recent one)."""
    if storage:
        if storage in ("sqlite", "journal"):
            if not study:
                raise SpecError(f"--storage {storage} needs a study name", key="STUDY")
            return storage_url(storage, study_dir(results_root(results), study)), study
        return storage, study
    root = results_root(results)
    if study:
        sdir = Path(study) if (Path(study) / "study.json").is_file() else study_dir(root, study)
        if not (sdir / "study.json").is_file():
            raise SpecError(
                "no such study (no study.json)",
                key="STUDY",
                value=study,
                allowed=", ".join(sorted(p.parent.name for p in root.glob("*/study.json"))) or "(none yet)",
            )
        return study_record(sdir / "study.json")
    found = sorted(root.glob("*/study.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SpecError(f"no study under {root}; give STUDY or --storage", key="STUDY")
    return study_record(found[-1])


def study_record(path: Path) -> tuple[str, str]:
    """(storage url, study name) of a study.json; rundir.DamagedRecord naming it when it holds no such pair."""

    def problem(info):
        if not isinstance(info, dict) or not all(isinstance(info.get(k), str) for k in ("storage", "study")):
            return "not a study record (storage and study, as text)"
        return None

    fix = "run `ablate tune TUNE_FILE` again (it rewrites it), or give --storage URL"
    info = rundir.read_record(path, problem, fix)
    return info["storage"], info["study"]
