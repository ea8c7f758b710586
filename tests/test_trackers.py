"""Trackers: what a run sends to TensorBoard and MLflow, read back with each tool's own reader, and what W&B
(offline: no public reader of its files) accepts through its public API, equals the run's own curves; a
requeued run resumes into the same tracker run and appends, never duplicates; a tracker that fails is written
to the run log and the run goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablate.config.spec import parse_run_spec
from ablate.launch import trackers as trackers_module
from ablate.launch.worker import execute, prepare_run_dir
from builders import corpus_slice, run_spec

SPEC = run_spec(
    data=corpus_slice(max_documents=60),
    checkpoint_every=2,
    log_every=2,
    phases=[
        {"name": "mlm", "objective": "mlm", "steps": 3},
        {"name": "mlm_decay", "objective": "mlm", "steps": 2, "lr": {"decay": "linear"}},
    ],
    labels={"sweep": "trk", "axes": {"schedule": "mlm", "freeze": "none"}},
)


def _spec(tmp_path: Path, tracking: dict):
    return parse_run_spec({**SPEC, "tracking": tracking})


def _run_dir(tmp_path: Path, spec) -> Path:
    return prepare_run_dir(spec, tmp_path / "trk" / "runs" / spec.run_id)


def _curves(run_dir: Path) -> dict[int, float]:
    columns = json.loads((run_dir / "records" / "curves.json").read_text())
    return dict(zip(columns["step"], columns["loss"]))


class RecordedRun:
    """A wandb Run as wandb.init returns it, recording what it accepts through its public methods."""

    def __init__(self, run, rows: list[dict]):
        self._run, self.rows = run, rows

    def log(self, data, step=None, **more):
        self._run.log(data, step=step, **more)
        self.rows.append({**data, "_step": step})  # after W&B took it

    def __getattr__(self, name):
        return getattr(self._run, name)


@pytest.fixture
def wandb_attempts(monkeypatch) -> list[dict]:
    """Each wandb.init (the run id asked for, then the rows logged): the real W&B, offline, behind its public API."""
    import wandb

    attempts, real_init = [], wandb.init

    def init(**kwargs):
        attempts.append({"id": kwargs["id"], "rows": []})
        return RecordedRun(real_init(**kwargs), attempts[-1]["rows"])

    monkeypatch.setattr(wandb, "init", init)
    return attempts


def test_tracking_does_not_change_the_run_id(tmp_path):
    assert _spec(tmp_path, {"tensorboard": True, "mlflow": True}).run_id == parse_run_spec(SPEC).run_id


@pytest.mark.slow
def test_a_requeued_run_fills_every_tracker_once(tmp_path, data_root, wandb_attempts):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = _spec(tmp_path, {"tensorboard": True, "mlflow": {"uri": uri}, "wandb": True})
    run_dir = _run_dir(tmp_path, spec)
    assert execute(run_dir, stop_after_steps=3) == "interrupted"  # a preemption after step 3
    first = json.loads((run_dir / "trackers.json").read_text())
    assert first["step"] == 3
    assert execute(run_dir) == "done"
    assert json.loads((run_dir / "trackers.json").read_text())["ids"] == first["ids"]  # the same tracker runs
    curves = _curves(run_dir)
    assert sorted(curves) == [1, 2, 3, 4, 5]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3, 4, 5]
    assert [e.value for e in loss] == pytest.approx([curves[s] for s in range(1, 6)], rel=1e-6)
    assert "grad_norm/layer_0" in events.Tags()["scalars"]
    assert "weight_rel_change/mlm/layer_0" in events.Tags()["scalars"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(first["ids"]["mlflow"])
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "trk"
    assert run.data.params["labels.axes.schedule"] == "mlm" and run.data.params["run_id"] == spec.run_id
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5]  # appended, no step twice
    assert {m.step: m.value for m in history} == pytest.approx(curves)
    lr = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/lr")}
    assert lr == pytest.approx(
        dict(zip(*[json.loads((run_dir / "records" / "curves.json").read_text())[k] for k in ("step", "lr")]))
    )
    assert len(client.search_runs([run.info.experiment_id])) == 1

    assert "tracker wandb" not in (run_dir / "log.txt").read_text()  # W&B took every call
    assert [a["id"] for a in wandb_attempts] == [first["ids"]["wandb"]] * 2  # the second attempt resumes it
    steps = [[r["_step"] for r in a["rows"] if "train/loss" in r] for a in wandb_attempts]
    assert steps == [[1, 2, 3], [4, 5]]  # the second attempt sends only the steps after the first's last
    rows = [r for a in wandb_attempts for r in a["rows"] if "train/loss" in r]
    assert [r["train/loss"] for r in rows] == pytest.approx([curves[s] for s in range(1, 6)])
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 2  # two attempts, one W&B run id
    # one W&B run id in both (W&B adds "-1" to the second folder's name when both attempts start in one second)
    assert len({p.stem for p in run_dir.glob("wandb/offline-run-*/run-*.wandb")}) == 1


class Broken:
    name = "mlflow"

    def __init__(self, *args):
        self.id = "broken"

    def log_params(self, params):
        pass

    def log_metrics(self, metrics, step):
        raise ConnectionError("tracking server unreachable")

    def close(self, finished=True):
        pass


@pytest.mark.slow
def test_a_failing_tracker_is_logged_and_the_run_goes_on(tmp_path, data_root, monkeypatch):
    monkeypatch.setitem(trackers_module.TRACKERS, "mlflow", Broken)
    spec = _spec(tmp_path, {"tensorboard": True, "mlflow": True})
    run_dir = _run_dir(tmp_path, spec)
    assert execute(run_dir) == "done"
    log = (run_dir / "log.txt").read_text()
    assert "tracker mlflow: log_metrics failed (ConnectionError: tracking server unreachable)" in log
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4, 5]  # the others keep tracking


def test_tracking_block_is_validated():
    from ablate.config.errors import SpecError

    with pytest.raises(SpecError, match="tracking.mlflow"):
        parse_run_spec({**SPEC, "tracking": {"mlflow": {"url": "x"}}})
    with pytest.raises(SpecError, match="tracking.neptune"):
        parse_run_spec({**SPEC, "tracking": {"neptune": True}})
    assert parse_run_spec({**SPEC, "tracking": {"tensorboard": False}}).tracking.enabled == ()
