"""Optuna studies on a MariaDB server (the `optuna` database that scripts/slurm-local.sh start creates): trials
run two at a time as local jobs and as Slurm jobs, each job reporting to the server; a trial pruned, a trial
left running by a killed `ablate tune` resumed; the study read back with optuna.load_study from the URL. And
the exit-2 errors for a driver that is not installed and a server that does not answer.

Without a reachable server the server tests skip, saying why; ABLATE_REQUIRE_SLURM=1 (CI) fails them instead.
Tiny random-init BERT, four optimizer steps a run."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path

import pytest

from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.store import rundir
from ablate.tune.spec import load_tune
from ablate.tune.storage import open_storage
from ablate.tune.trials import trial_run
from test_tune import write_tune

URL_FILE = Path(os.environ.get("ABLATE_SLURM_DIR", "/tmp/ablate-slurm")) / "etc" / "optuna.url"
FIRST_LRS = [2.0e-3, 3.0e-3]  # trials 0 and 1, asked together
RESUMED_LR = 5.0e-3  # trial 2: left RUNNING by a killed tune, resumed; trains better than the median
PRUNED_LR = 1.0e-8  # trial 3: barely trains; the median pruner stops it at step 3
# Only COMPLETE trials feed the median: with two startup trials nothing is pruned while trials 0 and 1 run
# together, and trial 3's fate at step 3 does not depend on whether trial 2 has finished by then.
PRUNER = {"name": "median", "n_startup_trials": 2, "n_warmup_steps": 3}


def unavailable(reason: str):
    if os.environ.get("ABLATE_REQUIRE_SLURM") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def mariadb_url() -> str:
    """Optuna's storage on the local cluster's MariaDB (ABLATE_TUNE_MARIADB_URL overrides the file)."""
    url = os.environ.get("ABLATE_TUNE_MARIADB_URL") or (URL_FILE.read_text().strip() if URL_FILE.is_file() else "")
    if not url:
        unavailable(f"no MariaDB for Optuna: {URL_FILE} is missing (bash scripts/slurm-local.sh start)")
    try:
        open_storage(url)
    except SpecError as exc:
        unavailable(f"the MariaDB for Optuna cannot be used: {exc}")
    return url


@pytest.fixture
def study_name(mariadb_url):
    """A study name of this test's own in the shared database, deleted afterwards."""
    import optuna

    name = f"tiny_mariadb_{uuid.uuid4().hex[:8]}"
    yield name
    if name in optuna.get_all_study_names(mariadb_url):
        optuna.delete_study(study_name=name, storage=mariadb_url)


def mariadb_tune(folder: Path, name: str, study: str, url: str, n_trials: int, launcher: dict) -> Path:
    return write_tune(
        folder,
        name,
        study=study,
        storage=url,
        schedules={"mlm": [{"name": "mlm", "objective": "mlm", "steps": 4}]},
        freeze_masks=None,
        search_space={"optim.lr": {"low": 1.0e-8, "high": 1.0e-2, "log": True}},
        enqueue=[{"optim.lr": lr} for lr in FIRST_LRS],
        pruner=PRUNER,
        n_trials=n_trials,
        parallel=2,
        launcher=launcher,
    )


def credentials_file(folder: Path, url: str, mode: int = 0o600) -> Path:
    """The URL where a user keeps it: a file of their own, outside the results root."""
    path = folder / "secrets" / "optuna.url"
    path.parent.mkdir()
    path.write_text(url + "\n")
    path.chmod(mode)
    return path


def files_holding(root: Path, secret: str) -> list[str]:
    """Every file under root (job scripts, pickles and logs included) whose bytes hold the secret."""
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def kill_tune_after_ask(tune_file: Path, url: str, study: str, lr: float) -> int:
    """What a killed `ablate tune` leaves behind: a RUNNING trial with its params set, no run started."""
    import optuna

    tune = load_tune(tune_file)
    handle = optuna.load_study(study_name=study, storage=url)
    handle.enqueue_trial({"optim.lr": lr})
    return handle.ask({k: p.distribution() for k, p in tune.params.items()}).number


def submitted_together(out: str) -> bool:
    """The tune's output shows two jobs submitted before any trial was told how its run ended."""
    lines = out.splitlines()
    told = next((i for i, line in enumerate(lines) if "): complete" in line or "): pruned" in line), len(lines))
    return sum(line.startswith("submitted ") for line in lines[:told]) == 2


def run_dir_of(results: Path, tune_file: Path, study: str, trial) -> Path:
    return results / study / "runs" / trial_run(load_tune(tune_file), trial.params, trial.number).run_id


@pytest.mark.slow
@pytest.mark.slurm  # its server is the one scripts/slurm-local.sh starts: a skip is said out loud
def test_parallel_local_trials_on_mariadb_prune_and_resume(tmp_path, capsys, mariadb_url, study_name, data_root):
    import optuna

    results = tmp_path / "results"
    local = {"executor": "local", "local": {"parallel": 2}}
    secret = f"file:{credentials_file(tmp_path, mariadb_url)}"
    two = mariadb_tune(tmp_path, "two.yaml", study_name, secret, 2, local)
    assert main(["tune", str(two), "--results", str(results), "--poll", "0.5"]) == 0
    first_out = capsys.readouterr().out
    assert submitted_together(first_out), first_out
    first = {
        t.number: (t.params, t.value, t.datetime_complete)
        for t in optuna.load_study(study_name=study_name, storage=mariadb_url).trials
    }
    assert [first[n][0]["optim.lr"] for n in sorted(first)] == FIRST_LRS

    resumed = kill_tune_after_ask(two, mariadb_url, study_name, RESUMED_LR)
    optuna.load_study(study_name=study_name, storage=mariadb_url).enqueue_trial({"optim.lr": PRUNED_LR})
    four = mariadb_tune(tmp_path, "four.yaml", study_name, secret, 4, local)
    assert main(["tune", str(four), "--results", str(results), "--poll", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "2 finished trials, 1 left running by an earlier process (resumed), 1 to ask" in out, out
    assert submitted_together(out), out
    password = optuna.storages.RDBStorage(mariadb_url).engine.url.password
    assert password not in first_out + out  # printed as ***

    trials = optuna.load_study(study_name=study_name, storage=mariadb_url).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "COMPLETE", "PRUNED"]
    assert {n: (trials[n].params, trials[n].value, trials[n].datetime_complete) for n in first} == first
    assert resumed == 2 and trials[2].params == {"optim.lr": RESUMED_LR}
    assert sorted(trials[2].intermediate_values) == [1, 2, 3, 4]  # reported by its job, into the server
    assert trials[2].value == pytest.approx(trials[2].intermediate_values[4])
    assert trials[3].params == {"optim.lr": PRUNED_LR} and sorted(trials[3].intermediate_values) == [1, 2, 3]
    status = rundir.read_status(run_dir_of(results, four, study_name, trials[3]))
    assert status["state"] == "pruned" and status["pruned_at_step"] == 3, status
    record = rundir.read_json(run_dir_of(results, four, study_name, trials[2]) / "tune.json")
    assert record["storage"] == secret and record["state"] == "complete"
    assert files_holding(results, password) == [] and files_holding(tmp_path / "four.yaml", password) == []


def test_a_credentials_file_others_can_read_exits_2_before_anything_runs(tmp_path, capsys, data_root):
    url = "mysql+pymysql://optuna:hunter2@127.0.0.1:3307/optuna"
    path = credentials_file(tmp_path, url, mode=0o640)
    f = mariadb_tune(tmp_path, "tune.yaml", "tiny_shared_secret", f"file:{path}", 2, {"executor": "debug"})
    assert main(["tune", str(f), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert f"{f}: storage: the credentials file is readable by others (mode -rw-r-----" in err, err
    assert f"chmod 600 {path}" in err and "hunter2" not in err, err
    assert not (tmp_path / "results").exists()


def test_a_password_written_in_the_tune_file_or_on_the_command_line_exits_2(tmp_path, capsys, data_root):
    url = "mysql+pymysql://optuna:hunter2@127.0.0.1:3307/optuna"
    f = mariadb_tune(tmp_path, "tune.yaml", "tiny_literal", url, 2, {"executor": "debug"})
    plain = mariadb_tune(tmp_path, "plain.yaml", "tiny_literal", "sqlite", 2, {"executor": "debug"})
    for argv in (["tune", str(f)], ["tune", str(plain), "--storage", url]):
        assert main([*argv, "--results", str(tmp_path / "results")]) == 2
        err = capsys.readouterr().err
        assert "storage: a database password in the storage URL would be written into the study's folder" in err
        assert "storage: env:NAME" in err and "file:PATH, chmod 600" in err and "hunter2" not in err, err
    assert not (tmp_path / "results").exists()


def test_an_unset_environment_variable_exits_2_naming_it(tmp_path, monkeypatch, capsys, data_root):
    monkeypatch.delenv("ABLATE_TEST_OPTUNA_URL", raising=False)
    f = mariadb_tune(tmp_path, "tune.yaml", "tiny_noenv", "env:ABLATE_TEST_OPTUNA_URL", 2, {"executor": "debug"})
    assert main(["tune", str(f), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert f"{f}: storage: the environment variable ABLATE_TEST_OPTUNA_URL is not set" in err, err


@pytest.mark.slow
@pytest.mark.slurm
def test_parallel_slurm_trials_report_to_mariadb(
    tmp_path, monkeypatch, capsys, slurm_env, mariadb_url, study_name, data_root
):
    import optuna

    monkeypatch.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])
    monkeypatch.setenv("ABLATE_TEST_OPTUNA_URL", mariadb_url)  # sbatch passes the environment to the jobs
    slurm = {
        "executor": "slurm",
        "slurm": {"partition": "cpu", "cpus_per_task": 1, "mem_gb": 3, "timeout_min": 30},
    }
    two = mariadb_tune(tmp_path, "two.yaml", study_name, "env:ABLATE_TEST_OPTUNA_URL", 2, slurm)
    results = tmp_path / "results"
    assert main(["tune", str(two), "--results", str(results), "--poll", "1"]) == 0
    out = capsys.readouterr().out
    assert submitted_together(out), out
    trials = optuna.load_study(study_name=study_name, storage=mariadb_url).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    for t in trials:
        assert sorted(t.intermediate_values) == [1, 2, 3, 4]  # each Slurm job reported to the server
        status = rundir.read_status(run_dir_of(results, two, study_name, t))
        assert status["state"] == "done" and status["executor"] == "slurm" and status["job_id"]
    password = optuna.storages.RDBStorage(mariadb_url).engine.url.password
    assert password not in out and files_holding(results, password) == []  # job scripts and Slurm logs too


def refused_port() -> int:
    """A loopback port nothing listens on (just released by this process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_driver_that_is_not_installed_exits_2_naming_the_storage(tmp_path, monkeypatch, capsys, data_root):
    monkeypatch.setitem(sys.modules, "pymysql", None)  # PyMySQL as if not installed
    monkeypatch.setenv("ABLATE_TEST_OPTUNA_URL", "mysql+pymysql://optuna:secret@127.0.0.1:3307/optuna")
    f = mariadb_tune(
        tmp_path, "tune.yaml", "tiny_nodriver", "env:ABLATE_TEST_OPTUNA_URL", 2, {"executor": "debug"}
    )
    assert main(["tune", str(f), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert f"{f}: storage: the URL's database driver 'pymysql' is not installed" in err, err
    assert "pip install 'ablate[tune]'" in err and "secret" not in err, err
    assert not (tmp_path / "results").exists()


def test_a_server_that_does_not_answer_exits_2_saying_what_to_do(tmp_path, capsys, data_root):
    if os.environ.get("ABLATE_REQUIRE_SLURM") != "1":
        pytest.importorskip("pymysql", reason="PyMySQL is not installed (pip install 'ablate[tune]')")
    port = refused_port()
    path = credentials_file(tmp_path, f"mysql+pymysql://optuna:secret@127.0.0.1:{port}/optuna")
    f = mariadb_tune(tmp_path, "tune.yaml", "tiny_noserver", f"file:{path}", 2, {"executor": "debug"})
    assert main(["tune", str(f), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert f"{f}: storage: the database server at 127.0.0.1:{port} does not answer" in err, err
    assert "scripts/slurm-local.sh start" in err and "secret" not in err, err
    assert not (tmp_path / "results").exists()  # the server reached before the study's folder is made
