"""Layer and component transplants: hybrid models built from two finished runs of a sweep (the chosen layers
from one, or only some components of its blocks, everything else from the other),
recorded as derived runs and fine-tuned on the sweep's tasks (or the transplant's own evaluation), so that
they appear in the runs and scores tables (`--table scores`, `--table transplant`) like any arm.

The layer split resolves like a freeze mask (ablate.plan.freezing.resolve_freeze): low / mid / high thirds,
ranges such as 0-7, `encoder` (embeddings, every block, the final norm) and `head` (the MLM head). The
embeddings stay the into run's, as in the paper's transplants of layer groups, unless asked for
(`embeddings: true`, `--embeddings`) or named by the layers (`embeddings`, `encoder`); a derived run made
before the choice existed (its spec without labels.derived.embeddings) is built as it was then, the
embeddings with a layer split. Components (attention, mlp: the parameters the model's family entry names,
ablate.models.families) are copied alone from each chosen block. Runs are matched per seed
(ablate.plan.transplants).

A derived run is a folder runs/tx-<digest> with spec.json (ablate.plan.transplants.derived_spec: the `into`
run's spec; labels.derived holds the provenance and labels.axes the arm: schedule "<into>_<from>[<layers>]",
freeze "none"), records (run.json with derived_from / derived_into / transplant_layers; no curves or layer
measures), model/ and scores/. Its job (ablate.launch.worker, as for any run: status, lock, failure) builds
it with build_hybrid and fine-tunes it on its spec's eval.tasks; a sweep submits it once both source runs
are done, `ablate transplant` runs it in its own process.

May import: config, store, models, plan, train, evaluate.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

from ablate.config.errors import SpecError
from ablate.config.spec import RunSpec
from ablate.config.transplants import (
    arm_name,
    copies_embeddings,
    derived_id,
    parse_arm,
    parse_components,
    parse_layers,
)
from ablate.models.families import family_of, layer_of, n_layers
from ablate.models.loading import check_run_model, load_config
from ablate.plan.freezing import FrozenSet, is_frozen
from ablate.plan.transplants import PlannedTransplant, derived_spec, match_arms, resolve_split
from ablate.store import rundir


def hybrid_state(
    source,
    target,
    words: tuple[str, ...],
    key: str = "--layers",
    components: tuple[str, ...] = (),
    embeddings: bool = False,
) -> FrozenSet:
    """Copy the layers `words` name from `source` into `target` (two *ForMaskedLM of the same architecture
    and depth), in place, or with `components` only those parts of the blocks `words` name; with
    `embeddings` the embeddings too. Returns what was copied (with components: the blocks, and the
    embeddings). SpecError for different architectures or depths, layers out of range, a component the
    family does not declare."""
    cs, ct = source.config, target.config
    shapes = {n: p.shape for n, p in source.named_parameters()}
    if (cs.model_type, n_layers(cs)) != (ct.model_type, n_layers(ct)) or shapes != {
        n: p.shape for n, p in target.named_parameters()
    }:
        raise SpecError(
            "transplant between different architectures or depths",
            key=key,
            value=f"{cs.model_type} x {n_layers(cs)} layers into {ct.model_type} x {n_layers(ct)} layers",
            allowed="two runs of the same model",
        )
    family = family_of(ct)
    family.check_components(components, "--components")
    chosen, _ = resolve_split(words, components, n_layers(ct), key, embeddings)
    params = dict(source.named_parameters())
    with torch.no_grad():
        for name, p in target.named_parameters():
            if _copied(name, family, chosen, components):
                p.copy_(params[name])
    return chosen


def _copied(name: str, family, chosen: FrozenSet, components: tuple[str, ...]) -> bool:
    if not components:
        return is_frozen(name, family, chosen)
    where = layer_of(name, family)
    if where == "emb":
        return chosen.embeddings
    return where.isdigit() and int(where) in chosen.layers and family.component_of(name) in components


def scoring_key(overrides: dict | None) -> str:
    """The runs-table column transplant_eval: the hybrid's scoring overrides as canonical JSON, '' for none."""
    return json.dumps(overrides, sort_keys=True) if overrides else ""


def _arm_runs(sweep_dir: Path, runs: pd.DataFrame, arm: tuple[str, str], key: str) -> dict[str, RunSpec]:
    """The finished runs of one arm, by id."""
    done = runs[
        (runs["status"] == "done")
        & (runs["schedule"].astype(str) == arm[0])
        & (runs["freeze"].astype(str) == arm[1])
    ]
    if done.empty:
        arms = sorted({arm_name((s, f)) for s, f in zip(runs["schedule"], runs["freeze"]) if isinstance(s, str)})
        raise SpecError(
            "no finished run of this arm in the sweep", key=key, value=arm_name(arm), allowed=", ".join(arms)
        )
    return {rid: rundir.read_spec(rundir.runs_dir(sweep_dir) / rid) for rid in done["run_id"]}


def plan_transplant(
    sweep_dir: Path,
    runs: pd.DataFrame,
    source: str,
    target: str,
    layers: str | list | None,
    tasks: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] | None = None,
    components: str | list | None = None,
    embeddings: bool = False,
) -> list[PlannedTransplant]:
    """`ablate transplant`: the hybrids of arm `source`'s layers (or components; `embeddings`: and its
    embeddings) in arm `target`, one per seed, from the sweep's finished runs (`runs`: its collected runs
    table). SpecError for an unknown arm, a seed one arm lacks, layers that do not parse or lie past the
    depth, an unknown component."""
    parts = parse_components(components)
    if layers is None and not parts:
        raise SpecError("a transplant needs --layers, or --components (then from every block)", key="--layers")
    words = parse_layers(layers) if layers is not None else ("encoder",)
    embeddings = copies_embeddings(words, parts, embeddings)
    arms = (parse_arm(source, "--from"), parse_arm(target, "--into"))
    names = (arm_name(arms[0]), arm_name(arms[1]))
    if arms[0] == arms[1]:
        raise SpecError(
            "--from and --into are the same arm (the hybrid would be the run itself)", key="--into", value=target
        )
    found = (_arm_runs(sweep_dir, runs, arms[0], "--from"), _arm_runs(sweep_dir, runs, arms[1], "--into"))
    matched, alone = match_arms(*found, names)
    if alone:
        seed, arm, rid = alone[0]
        side = "--into" if arm == names[0] else "--from"
        raise SpecError(
            f"run {rid} (arm {arm}, seed {seed}) has no finished {side.strip('-')} run with its seed "
            "(the arms must have the same seeds and training settings)",
            key=side,
            value=names[1] if side == "--into" else names[0],
        )
    root = rundir.runs_dir(sweep_dir)
    planned = []
    for from_id, into_id in matched:
        for side in (from_id, into_id):
            check_run_model(root / side / "model")
        config = load_config(str(root / into_id / "model"))
        family_of(config).check_components(parts, "--components")
        spec = derived_spec(
            found[1][into_id],
            from_id,
            into_id,
            words,
            names,
            n_layers(config),
            "--layers",
            tasks,
            seeds,
            parts,
            embeddings=embeddings,
        )
        planned.append(
            PlannedTransplant(
                derived_id(from_id, into_id, words, parts, embeddings),
                "--from/--into",
                from_id,
                into_id,
                spec,
                tasks is not None,
            )
        )
    return planned


def prepare_derived(sweep_dir: Path, planned: PlannedTransplant) -> Path:
    """The derived run's folder with its spec.json (a folder already done keeps its own)."""
    folder = rundir.runs_dir(sweep_dir) / planned.run_id
    if rundir.read_status(folder).get("state") != "done":
        rundir.atomic.write_json(folder / "spec.json", planned.spec.model_dump(mode="json"))
    return folder


def build_hybrid(run_dir: Path, spec: RunSpec, log: Callable[[str], None] = print) -> FrozenSet:
    """Build the derived run's model (and its records) from the two finished runs its spec names; the
    caller (the worker) fine-tunes it and marks it done."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from ablate.train.checkpoint import save_final_model

    run_dir = Path(run_dir)
    derived = spec.labels["derived"]
    sources = {side: run_dir.parent / derived[side] for side in ("from", "into")}
    for side, folder in sources.items():
        state = rundir.effective_state(folder)
        if state != "done":
            raise RuntimeError(f"the {side} run {folder.name} is {state}, not done: nothing to build from")
    for folder in sources.values():
        check_run_model(folder / "model")
    src = AutoModelForMaskedLM.from_pretrained(sources["from"] / "model", dtype=torch.float32)
    model = AutoModelForMaskedLM.from_pretrained(sources["into"] / "model", dtype=torch.float32)
    components = tuple(derived.get("components") or ())
    # a spec written before the embeddings choice: a layer split copied them, components did not
    embeddings = bool(derived.get("embeddings", not components))
    chosen = hybrid_state(src, model, tuple(derived["words"]), components=components, embeddings=embeddings)
    save_final_model(model, AutoTokenizer.from_pretrained(sources["into"] / "model"), run_dir / "model")
    rundir.write_records(
        run_dir,
        {
            "model_dir": str((run_dir / "model").resolve()),
            "n_layers": n_layers(model.config),
            "tokens_seen": 0,
            "derived_from": derived["from"],
            "derived_into": derived["into"],
            "transplant_layers": chosen.describe(),
            "transplant_components": "+".join(components),
            "transplant_whole": bool(derived.get("whole")),
            "transplant_eval": scoring_key(derived.get("eval")),
        },
        [],
        [],
        [],
        [],
    )
    what = chosen.describe() + (f" ({'+'.join(components)})" if components else "")
    log(f"{run_dir.name}: {spec.labels['axes']['schedule']}: {what} of {derived['from']} into {derived['into']}")
    return chosen
