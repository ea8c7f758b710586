"""Layer transplants: hybrid models built from two finished runs of a sweep (the embeddings and chosen
layers from one, everything else from the other), recorded as derived runs and fine-tuned on the sweep's
tasks, so that they appear in the runs and scores tables (`--table scores` rows) like any arm.

The layer split resolves like a freeze mask (ablate.plan.freezing.resolve_freeze): low / mid / high thirds,
ranges such as 0-7, `encoder` (embeddings, every block, the final norm) and `head` (the MLM head); the
embeddings always come with the chosen layers. Runs are matched per seed by ablate.analysis.pairs' identity
(same model, data, seed and training settings).

A derived run is a folder runs/tx-<digest> with spec.json (the `into` run's spec; labels.derived holds the
provenance and labels.axes the arm: schedule "<into>_<from>[<layers>]", freeze "none"), records (run.json
with derived_from / derived_into / transplant_layers; no curves or layer measures), model/ and scores/.

May import: config, store, models, plan, analysis, train, evaluate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

from ablate.analysis.pairs import run_info
from ablate.config.errors import SpecError
from ablate.config.spec import FREEZE_ALLOWED, FREEZE_WORDS, RunSpec, parse_layer_range
from ablate.models.families import family_of, n_layers
from ablate.plan.freezing import FrozenSet, is_frozen, resolve_freeze
from ablate.store import rundir


def parse_layers(text: str | list, key: str = "--layers") -> tuple[str, ...]:
    """'0-7' / 'low,mid' / ['embeddings', 3] -> words a freeze mask takes ('none' is no transplant)."""
    words = tuple(str(w).strip() for w in (text.split(",") if isinstance(text, str) else text) if str(w).strip())
    bad = [w for w in words if w == "none" or (w not in FREEZE_WORDS and parse_layer_range(w) is None)]
    if not words or bad:
        raise SpecError("not a layer split", key=key, value=bad[0] if bad else text, allowed=FREEZE_ALLOWED)
    return words


def parse_arm(text: str, key: str) -> tuple[str, str]:
    """'schedule' or 'schedule/freeze' -> (schedule, freeze); freeze defaults to "none"."""
    schedule, _, freeze = text.partition("/")
    if not schedule:
        raise SpecError("an arm is SCHEDULE or SCHEDULE/FREEZE", key=key, value=text)
    return schedule, freeze or "none"


def hybrid_state(source, target, words: tuple[str, ...], key: str = "--layers") -> FrozenSet:
    """Copy the embeddings and the layers `words` name from `source` into `target` (two *ForMaskedLM of the
    same architecture and depth), in place; returns what was copied. SpecError for different architectures
    or depths, or layers out of range."""
    cs, ct = source.config, target.config
    shapes = {n: p.shape for n, p in source.named_parameters()}
    if (cs.model_type, n_layers(cs)) != (ct.model_type, n_layers(ct)) or \
            shapes != {n: p.shape for n, p in target.named_parameters()}:
        raise SpecError("transplant between different architectures or depths", key=key,
                        value=f"{cs.model_type} x {n_layers(cs)} layers into {ct.model_type} x {n_layers(ct)} layers",
                        allowed="two runs of the same model")
    family = family_of(ct)
    chosen = resolve_freeze(("embeddings", *words), n_layers(ct), key)
    params = dict(source.named_parameters())
    with torch.no_grad():
        for name, p in target.named_parameters():
            if is_frozen(name, family, chosen):
                p.copy_(params[name])
    return chosen


def _arm_runs(runs: pd.DataFrame, arm: tuple[str, str], key: str) -> pd.DataFrame:
    done = runs[(runs["status"] == "done") & (runs["schedule"].astype(str) == arm[0])
                & (runs["freeze"].astype(str) == arm[1])]
    if done.empty:
        arms = sorted({f"{s}/{f}" for s, f in zip(runs["schedule"], runs["freeze"]) if isinstance(s, str)})
        raise SpecError("no finished run of this arm in the sweep", key=key, value="/".join(arm),
                        allowed=", ".join(arms))
    return done


def match_runs(sweep_dir: Path, runs: pd.DataFrame, source: tuple[str, str], target: tuple[str, str]
               ) -> list[tuple[str, str]]:
    """(source run, target run) per seed: the runs of the two arms with the same identity and seed."""
    def infos(arm, key):
        out = {}
        for run_id in _arm_runs(runs, arm, key)["run_id"]:
            spec = RunSpec.model_validate(rundir.read_json(rundir.runs_dir(sweep_dir) / run_id / "spec.json"))
            info = run_info(run_id, spec)
            out[(info.identity, info.seed)] = run_id
        return out

    a, b = infos(source, "--from"), infos(target, "--into")
    missing = sorted(set(a) ^ set(b), key=lambda k: k[1])
    if missing:
        side = "--into" if missing[0] in a else "--from"
        raise SpecError(f"no finished {side.strip('-')} run for seed {missing[0][1]} (the arms must have the same "
                        "seeds and training settings)", key=side, value="/".join(target if side == "--into"
                                                                                  else source))
    return [(a[k], b[k]) for k in sorted(a, key=lambda k: k[1])]


def build_derived(sweep_dir: Path, from_id: str, into_id: str, words: tuple[str, ...], arms: tuple[str, str],
                  log: Callable[[str], None] = print) -> Path:
    """The derived run folder of one hybrid (kept as is when it is already done)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from ablate.train.checkpoint import save_final_model

    root = rundir.runs_dir(sweep_dir)
    tid = "tx-" + hashlib.sha256(f"{from_id}|{into_id}|{','.join(words)}".encode()).hexdigest()[:10]
    out = root / tid
    if rundir.read_status(out).get("state") == "done":
        return out
    src = AutoModelForMaskedLM.from_pretrained(root / from_id / "model", dtype=torch.float32)
    model = AutoModelForMaskedLM.from_pretrained(root / into_id / "model", dtype=torch.float32)
    chosen = hybrid_state(src, model, words)
    spec = rundir.read_json(root / into_id / "spec.json")
    labels = spec.get("labels") or {}
    arm = f"{arms[1]}_{arms[0]}[{chosen.describe()}]"
    spec["labels"] = {**labels, "axes": {**(labels.get("axes") or {}), "schedule": arm, "freeze": "none"},
                      "derived": {"kind": "transplant", "from": from_id, "into": into_id,
                                  "layers": chosen.describe(), "from_arm": arms[0], "into_arm": arms[1]}}
    rundir.atomic.write_json(out / "spec.json", spec)
    save_final_model(model, AutoTokenizer.from_pretrained(root / into_id / "model"), out / "model")
    rundir.write_records(out, {"model_dir": str((out / "model").resolve()), "n_layers": n_layers(model.config),
                               "tokens_seen": 0, "derived_from": from_id, "derived_into": into_id,
                               "transplant_layers": chosen.describe()}, [], [], [], [])
    rundir.write_status(out, "done", finished=__import__("time").time())
    log(f"{tid}: {arm}: {chosen.describe()} of {from_id} into {into_id}")
    return out


def transplant(sweep_dir: Path, runs: pd.DataFrame, source: str, target: str, layers: str | list,
               tasks: tuple[str, ...] | None = None, seeds: tuple[int, ...] | None = None,
               log: Callable[[str], None] = print) -> list[Path]:
    """Build (or find) the hybrids of arm `source`'s layers in arm `target`, one per seed, and fine-tune each
    on `tasks` (default: the target run's eval tasks). Everything is checked before anything is built."""
    from ablate.evaluate.runs import evaluate_run

    words = parse_layers(layers)
    arms = (parse_arm(source, "--from"), parse_arm(target, "--into"))
    matched = match_runs(sweep_dir, runs, *arms)
    names = tuple("/".join(a) if a[1] != "none" else a[0] for a in arms)
    folders = [build_derived(sweep_dir, a, b, words, names, log) for a, b in matched]
    for folder in folders:
        spec = RunSpec.model_validate(rundir.read_json(folder / "spec.json"))
        if tasks or spec.eval.tasks:
            evaluate_run(folder, spec, log=lambda m, r=folder.name: log(f"[{r}] {m}"), tasks=tasks, seeds=seeds)
    return folders
