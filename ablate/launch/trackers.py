"""Live views of a run in the trackers researchers already use: TensorBoard event files, MLflow and W&B
(offline). Each is its own client library, used as its users use it, behind one small interface.

Trackers are I/O at the edge of a run, so they live here beside the worker that feeds them (not in store:
they write to places other than the run folder, and need the spec and the run's state). Rank 0 only.

A tracker never fails or stops a run: any error is written to the run log and that tracker is dropped for
the rest of the attempt. A requeued run resumes into the same tracker run: <run folder>/trackers.json keeps
each tracker's run id and the last step logged, and only later steps are sent (TensorBoard also purges
events past that step that a killed attempt wrote after its last bookkeeping).

May import: config, store.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable

from ablate.config import extras
from ablate.config.spec import RunSpec, dump_run_spec
from ablate.store import atomic
from ablate.store.lock import FileLock
from ablate.store.rundir import read_json

Log = Callable[[str], None]
STATE_FILE = "trackers.json"


def arm_name(spec: RunSpec, run_id: str) -> str:
    """'clm_detour-low_clm-<run id>': the axis values, readable in a tracker's run list, then the id."""
    axes = spec.labels.get("axes") if isinstance(spec.labels.get("axes"), dict) else {}
    return "-".join([str(v) for v in axes.values()] + [run_id])


def flat_params(spec: RunSpec) -> dict[str, str]:
    """The arm's axes and its resolved spec as flat key -> text params (MLflow/W&B/TensorBoard hparams)."""
    out: dict[str, str] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list) and value and any(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)
        else:
            out[prefix] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)

    walk("", dump_run_spec(spec))
    out["run_id"] = spec.run_id
    return out


class TensorBoardTracker:
    """torch.utils.tensorboard's SummaryWriter: one event folder per arm."""

    name = "tensorboard"

    def __init__(self, spec: RunSpec, run_dir: Path, resume_id: str | None, last_step: int):
        extras.load("tensorboard", "the tensorboard tracker")  # torch.utils.tensorboard writes with it
        from torch.utils.tensorboard import SummaryWriter

        cfg = spec.tracking.tensorboard
        sweep = str(spec.labels.get("sweep", run_dir.parent.parent.name))
        self.log_dir = (
            Path(cfg.log_dir).expanduser() / sweep / arm_name(spec, run_dir.name)
            if cfg.log_dir
            else run_dir / "tensorboard"
        )
        # purge_step drops events at or after it that an earlier attempt wrote past its last bookkeeping
        self.writer = SummaryWriter(str(self.log_dir), purge_step=last_step + 1 if resume_id else None)
        self.id = str(self.log_dir)

    def log_params(self, params: dict[str, str]) -> None:
        self.writer.add_text("spec", "\n".join(f"    {k}: {v}" for k, v in params.items()), 0)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_artifact(self, path: Path) -> None:
        pass  # TensorBoard has no artifacts; the model stays in the run folder

    def close(self, finished: bool = True) -> None:
        self.writer.close()


def mlflow_uri(spec: RunSpec, run_dir: Path) -> str:
    """The spec's URI; a plain folder (or the default, the sweep folder) means the sqlite file mlflow.db in it."""
    uri = spec.tracking.mlflow.uri
    if uri and "://" in uri:
        return uri
    folder = Path(uri).expanduser() if uri else run_dir.parent.parent
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(folder / 'mlflow.db').resolve()}"


class MlflowTracker:
    """MlflowClient: experiment = sweep, run = arm (its id kept in trackers.json to resume into)."""

    name = "mlflow"

    def __init__(self, spec: RunSpec, run_dir: Path, resume_id: str | None, last_step: int):
        MlflowClient = extras.load("mlflow", "the mlflow tracker").MlflowClient

        cfg = spec.tracking.mlflow
        self.uri = mlflow_uri(spec, run_dir)
        # a server gets batches in the background (never blocks training); a local store synchronously
        self.synchronous = not self.uri.startswith(("http://", "https://", "databricks"))
        self.log_model = cfg.log_model
        # runs of a sweep starting together would race to create the sqlite tables and the experiment
        lock = (
            FileLock(Path(self.uri[len("sqlite:///") :] + ".lock")) if self.uri.startswith("sqlite:///") else None
        )
        if lock is not None:
            lock.acquire(wait_s=300)
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
            if resume_id:
                self.id = resume_id
                self.client.update_run(resume_id, status="RUNNING")
                return
            experiment = cfg.experiment or str(spec.labels.get("sweep", run_dir.parent.parent.name))
            found = self.client.get_experiment_by_name(experiment)
            exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
        finally:
            if lock is not None:
                lock.release()
        axes = spec.labels.get("axes") if isinstance(spec.labels.get("axes"), dict) else {}
        run = self.client.create_run(
            exp_id,
            run_name=arm_name(spec, run_dir.name),
            tags={"ablate.run_id": run_dir.name, **{f"axis.{k}": str(v) for k, v in axes.items()}},
        )
        self.id = run.info.run_id

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], v[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow's limit per batch
            self.client.log_batch(self.id, params=items[start : start + 100], synchronous=self.synchronous)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(__import__("time").time() * 1000)
        items = [Metric(_mlflow_key(k), float(v), stamp, step) for k, v in metrics.items()]
        for start in range(0, len(items), 1000):
            self.client.log_batch(self.id, metrics=items[start : start + 1000], synchronous=self.synchronous)

    def log_artifact(self, path: Path) -> None:
        if self.log_model:
            self.client.log_artifacts(self.id, str(path), artifact_path="model")

    def close(self, finished: bool = True) -> None:
        self.client.set_terminated(self.id, status="FINISHED" if finished else "KILLED")


def _mlflow_key(key: str) -> str:
    return key.replace(":", "_")


class WandbTracker:
    """wandb in offline mode (never the network): `wandb sync <dir>/wandb/offline-run-*` uploads it later."""

    name = "wandb"

    def __init__(self, spec: RunSpec, run_dir: Path, resume_id: str | None, last_step: int):
        wandb = extras.load("wandb", "the wandb tracker")

        cfg = spec.tracking.wandb
        self.id = resume_id or f"{run_dir.name}-{os.urandom(3).hex()}"
        folder = Path(cfg.dir).expanduser() if cfg.dir else run_dir
        folder.mkdir(parents=True, exist_ok=True)
        sweep = str(spec.labels.get("sweep", run_dir.parent.parent.name))
        self.run = wandb.init(
            project=cfg.project or sweep,
            group=sweep,
            name=arm_name(spec, run_dir.name),
            id=self.id,
            resume="allow",
            mode="offline",
            dir=str(folder),
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )

    def log_params(self, params: dict[str, str]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_artifact(self, path: Path) -> None:
        pass  # offline artifacts of a whole model would copy it; the run folder keeps it

    def close(self, finished: bool = True) -> None:
        self.run.finish(exit_code=0 if finished else 1)


TRACKERS = {"tensorboard": TensorBoardTracker, "mlflow": MlflowTracker, "wandb": WandbTracker}


def check_installed(specs: list[RunSpec], file: str | None = None) -> None:
    """Every tracker the runs ask for is installed (each is named after its library): a SpecError naming
    `pip install 'ablate[trackers]'` before anything is submitted, rather than a run that tracks nothing."""
    for name in dict.fromkeys(n for spec in specs for n in spec.tracking.enabled):
        extras.require(name, f"the {name} tracker", file=file, key=f"tracking.{name}")


class RunTrackers:
    """The trackers a RunSpec asks for, fed from the training state at each log step, then the scores."""

    def __init__(self, spec: RunSpec, run_dir: Path, log: Log):
        self.spec, self.run_dir, self.log = spec, Path(run_dir), log
        self.path = self.run_dir / STATE_FILE
        self.state = {"ids": {}, "step": 0, "layer_rows": 0}
        try:
            state = read_json(self.path) if self.path.is_file() else self.state
            if not isinstance(state, dict) or not isinstance(state.get("ids"), dict):
                raise ValueError("not a trackers record (ids of the tracker runs)")
            self.state = {**self.state, **state}
        except (OSError, ValueError) as exc:  # unreadable: start new tracker runs rather than fail the run
            log(f"trackers: {self.path.name} unreadable ({exc}); starting new tracker runs")
        self.trackers: dict[str, object] = {}
        fresh = []
        for name in spec.tracking.enabled:
            resume_id = self.state["ids"].get(name)
            tracker = self._guard(
                name,
                "start",
                lambda c=TRACKERS[name], r=resume_id: c(spec, self.run_dir, r, int(self.state["step"])),
            )
            if tracker is not None:
                self.trackers[name] = tracker
                self.state["ids"][name] = tracker.id
                fresh += [name] if resume_id is None else []
        if self.trackers:
            self._save()
            log(
                f"tracking: {', '.join(self.trackers)}"
                + (f" (resuming after step {self.state['step']})" if self.state["step"] else "")
            )
        params = flat_params(spec)
        for name in fresh:
            self._call(name, "log_params", params)

    @classmethod
    def for_spec(cls, spec: RunSpec, run_dir: Path, log: Log) -> "RunTrackers | None":
        return cls(spec, run_dir, log) if spec.tracking.enabled else None

    def _guard(self, name: str, what: str, fn):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001  (a tracker never fails a run: the error goes to the log)
            self.log(f"tracker {name}: {what} failed ({type(exc).__name__}: {exc}); the run goes on without it")
            self.trackers.pop(name, None)
            return None

    def _call(self, name: str, method: str, *args) -> None:
        tracker = self.trackers.get(name)
        if tracker is not None:
            self._guard(name, method, lambda: getattr(tracker, method)(*args))

    def _send(self, by_step: dict[int, dict[str, float]]) -> None:
        for step in sorted(by_step):
            for name in list(self.trackers):
                self._call(name, "log_metrics", by_step[step], step)

    def _save(self) -> None:
        atomic.write_json(self.path, self.state)

    def feed(self, state) -> None:
        """Send what the TrainState holds past the last step logged: loss, LR and tokens per step, per-layer
        gradient norms, and the phase-end layer measures (at the phase's last step)."""
        last = int(self.state["step"])
        by_step: dict[int, dict[str, float]] = {}
        phase_end: dict[str, int] = {}
        for row in state.curves:
            phase_end[row["phase"]] = row["step"]
            if row["step"] > last:
                by_step.setdefault(row["step"], {}).update(
                    {
                        "train/loss": row["loss"],
                        "train/lr": row["lr"],
                        "train/tokens": row["tokens"],
                        **{
                            f"train/{k}": v
                            for k, v in row.items()  # loss/<member>, mask_rate, tokens/<source>
                            if k.startswith(("loss/", "mask_rate", "tokens/"))
                            and v is not None
                            and math.isfinite(v)
                        },
                    }
                )
        for row in state.grad_norms:
            if row["step"] > last:
                by_step.setdefault(row["step"], {})[f"grad_norm/layer_{row['layer']}"] = row["grad_norm"]
        done = int(self.state["layer_rows"])
        for row in state.layer_rows[done:]:
            step = phase_end.get(row["phase"], state.global_step)
            by_step.setdefault(step, {})[f"{row['measure']}/{row['phase']}/layer_{row['layer']}"] = row["value"]
        self._send(by_step)
        self.state.update(step=max([last, *by_step]), layer_rows=len(state.layer_rows))
        self._save()

    def scores(self, rows: list[dict], step: int) -> None:
        """Downstream scores, as '<task>/<split>/<metric>/seed_<n>' at the run's last step (each once, even
        when an evaluation resumed reads earlier seeds back)."""
        sent = set(self.state.get("scores", []))
        metrics = {
            f"{r['task']}/{r['split']}/{r['metric']}/seed_{r['finetune_seed']}": r["value"]
            for r in rows
            if isinstance(r.get("value"), (int, float))
        }
        metrics = {k: v for k, v in metrics.items() if k not in sent}
        if metrics:
            self._send({step: metrics})
            self.state["scores"] = sorted(sent | metrics.keys())
            self._save()

    def finish(self, model_dir: Path | None = None) -> None:
        for name in list(self.trackers):
            if model_dir is not None and model_dir.is_dir():
                self._call(name, "log_artifact", model_dir)
            self._call(name, "close")
        self.trackers.clear()

    def close(self) -> None:
        """End this attempt without finishing (interrupted or failed): the next attempt resumes."""
        for name in list(self.trackers):
            self._call(name, "close", False)
        self.trackers.clear()
