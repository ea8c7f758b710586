"""Layer transplants as jobs. A sweep's derived runs (ablate.plan.transplants) wait until the two runs each
one needs are done, then go to the sweep's own scheduler like any run: the job (launch.worker) builds the
hybrid and fine-tunes it, with the same status, lock and failure records. `ablate transplant` runs them in
its own process. Their tasks are checked before anything is submitted.

May import: config, store, plan, evaluate, launch.worker.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from ablate.config.errors import SpecError
from ablate.launch import worker
from ablate.plan.transplants import PlannedTransplant
from ablate.store import rundir
from ablate.store.sweep import SweepFolder

NOT_BUILDABLE = ("failed", "pruned")  # a source run in one of these states gives no hybrid


def check_tasks(planned: list[PlannedTransplant], file: str) -> None:
    """The tasks an entry names exist and read (the runs' own tasks are checked with the runs)."""
    from ablate.evaluate.runs import check_eval

    for t in {t.key: t for t in planned if t.own_tasks}.values():
        try:
            check_eval([t.spec], file=file)
        except SpecError as exc:
            if exc.file != file:  # an error inside a task file
                key = exc.key
            elif (exc.key or "").startswith(("eval.finetune", "base.eval.protocol")):
                key = f"{t.key}.eval.{exc.key.rsplit('eval.', 1)[1]}"
            else:
                key = f"{t.key}.tasks"
            raise SpecError(exc.message, file=exc.file, key=key, value=exc.value, allowed=exc.allowed) from None


class Waiting:
    """The derived runs a sweep submits, each once both its source runs are done."""

    def __init__(self, paths: SweepFolder, planned: list[PlannedTransplant]):
        self.paths, self.left = paths, list(planned)

    def ready(self) -> list[Path]:
        """The derived run folders whose source runs are both done now; they leave the list. One whose
        source run failed or was pruned is marked failed, saying which, and leaves the list too (it is
        submitted again with --retry-failed, after its source)."""
        out = []
        for t in list(self.left):
            states = {rid: rundir.state_or_corrupt(self.paths.run(rid)) for rid in (t.from_id, t.into_id)}
            folder = self.paths.run(t.run_id)
            lost = [f"its source run {rid} is {state}" for rid, state in states.items() if state in NOT_BUILDABLE]
            if lost:
                rundir.write_status(folder, "failed", error="not built: " + "; ".join(lost))
            elif any(state != "done" for state in states.values()):
                continue
            else:
                out.append(folder)
            self.left.remove(t)
        return out

    def describe_left(self) -> list[str]:
        """A line per derived run still waiting (its source runs are neither done nor failed here)."""
        return [
            f"transplant {t.run_id} waits for runs {t.from_id} and {t.into_id} (queued or running "
            "elsewhere, or interrupted): run the sweep again once they are done"
            for t in self.left
        ]


def run_here(
    sweep_dir: Path,
    planned: list[PlannedTransplant],
    tasks: tuple[str, ...] | None,
    seeds: tuple[int, ...] | None,
    log: Callable[[str], None] = print,
) -> list[str]:
    """`ablate transplant`: build and fine-tune each derived run in this process (one already done only
    gets the `tasks` / `seeds` asked for, read back where its scores exist). Returns the ids that failed
    (recorded in their folders); the others go on."""
    from ablate.evaluate.runs import evaluate_run
    from ablate.evaluate.transplant import prepare_derived

    folders = [prepare_derived(sweep_dir, t) for t in planned]
    failed = []
    for folder in folders:
        if rundir.read_status(folder).get("state") == "done":
            if tasks or seeds:
                evaluate_run(
                    folder,
                    worker.load_spec(folder),
                    log=lambda m, r=folder.name: log(f"[{r}] {m}"),
                    tasks=tasks,
                    seeds=seeds,
                )
            continue
        try:
            worker.execute(folder)
        except (SpecError, rundir.AlreadyRunning):
            raise
        except Exception as exc:  # recorded in status.json and log.txt by the worker
            print(
                f"failed {folder.name}: {type(exc).__name__}: {exc}\n  log: {folder / 'log.txt'}", file=sys.stderr
            )
            failed.append(folder.name)
    return failed
