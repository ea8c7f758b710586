"""The trial's side of a tune's run, in the run's own job process: at each log step the run reports its
training loss to its Optuna trial and asks the study's pruner whether to go on; when the pruner says stop,
the run ends with state `pruned` at that step. The decision is a function of the losses the run has logged
and of what the pruner sees in the study's storage, made at a known step of the run, never by a process
watching the run from outside.

A tune's jobs run `RunJob(progress_hook=trial_hook)`; the run folder's tune.json (written by the tune
before it submits the run) names the study, storage, trial and pruner.

May import: launch, tune.trials, tune.storage, tune.sampling.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from ablate.launch.worker import Pruned
from ablate.tune.sampling import make_pruner
from ablate.tune.storage import open_storage, trial_id
from ablate.tune.trials import TRIAL_RECORD, CorruptRecord, read_trial_record


def trial_hook(run_dir: Path) -> Callable[[dict], None] | None:
    """The hook for the run in `run_dir` (None for a run that belongs to no trial). A tune.json that cannot
    be read raises CorruptRecord: the job fails, saying which file."""
    import optuna

    record = read_trial_record(run_dir)
    if record is None:
        return None
    missing = [k for k in ("study", "storage", "trial") if k not in record]
    if missing:
        raise CorruptRecord(f"{Path(run_dir) / TRIAL_RECORD}: not a trial record (lacks {', '.join(missing)})")
    raw_pruner = record.get("pruner", "none")
    pruner = make_pruner(raw_pruner, str(Path(run_dir) / TRIAL_RECORD))
    storage = open_storage(record["storage"])
    study = optuna.load_study(study_name=record["study"], storage=storage, pruner=pruner)
    tid = trial_id(storage, record["study"], int(record["trial"]))
    reported = set(storage.get_trial(tid).intermediate_values)  # a resumed run's earlier steps
    name = raw_pruner if isinstance(raw_pruner, str) else raw_pruner.get("name")
    live = [True]

    def report(progress: dict) -> None:
        step, loss = int(progress["step"]), float(progress["loss"])
        if step in reported or not live[0]:
            return
        try:
            storage.set_trial_intermediate_value(tid, step, loss)
        except optuna.exceptions.UpdateFinishedTrialError:
            live[0] = False  # told already (by hand, or another tune): the run goes on as a plain run
            print(
                f"trial {record['trial']} of study {record['study']} is finished; the run no longer reports to it",
                file=sys.stderr,
            )
            return
        reported.add(step)
        if pruner.prune(study, storage.get_trial(tid)):
            raise Pruned(
                step,
                f"the {name} pruner of study {record['study']} stopped trial {record['trial']} "
                f"at step {step} (loss {loss:.6g})",
            )

    return report
