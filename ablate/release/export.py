"""`ablate export`: one finished run of a collected sweep as an ordinary Hugging Face folder, the release of an
arm.

    DIR/config.json, model.safetensors (or its shards + index), tokenizer files   the run's model/ (*ForMaskedLM),
                                                                                  with --bf16 cast to bfloat16
    DIR/README.md                  the model card (ablate.release.card), hub metadata in its front matter
    DIR/figures/layers.{png,svg,csv}   the layers figure of the run (and its MLM twin)
    DIR/ablate/spec.json, run.json, frozen.json, scores.csv   the records the card was written from; scores.csv:
                                   the arm's rows of `ablate report --table scores`, unrounded

Which run: a run id, or an arm as the tables name it ("schedule" or "schedule, freeze MASK"; also
"schedule/MASK" as `ablate transplant` takes it). An arm with several seeds' finished runs exports its lowest
seed unless `seed` names another (the choice is returned as a note). The folder is written under a temporary
name next to DIR and renamed into place once complete: an error leaves nothing at DIR. A non-empty DIR is
refused unless `force` (then replaced whole).

May import: config, store, models, report.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from ablate.config.errors import SpecError
from ablate.config.transplants import arm_name
from ablate.report.arms import arm_label, done_runs
from ablate.release.card import Card, CardScores, render_card
from ablate.release.provenance import RunFacts, read_run_facts
from ablate.report.sweep import Sweep, load_sweep

WEIGHTS = ".safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model")
FIGURE = "figures/layers"


@dataclass(frozen=True)
class Chosen:
    run_id: str
    schedule: str
    freeze: str
    seed: int
    twin: str | None = None  # its MLM twin (runs table `twin`), when that run is done
    note: str | None = None  # how an arm with several seeds was resolved

    @property
    def arm(self) -> str:
        return arm_label(self.schedule, self.freeze)


@dataclass(frozen=True)
class Exported:
    out: Path
    chosen: Chosen
    dtype: str
    notes: list[str]


# ---------------------------------------------------------------- which run


def _known(done: pd.DataFrame) -> str:
    arms = dict.fromkeys(arm_label(s, f) for s, f in zip(done["schedule"], done["freeze"]))
    return f"runs: {', '.join(done['run_id'])}; arms: {', '.join(arms)}" if len(done) else "(no finished run)"


def _twin(runs: pd.DataFrame, row: pd.Series) -> str | None:
    twin = str(row.get("twin") or "")
    done = set(done_runs(runs)["run_id"])
    return twin if twin and twin != row["run_id"] and twin in done else None


def _chosen(runs: pd.DataFrame, row: pd.Series, note: str | None = None) -> Chosen:
    return Chosen(
        str(row["run_id"]), str(row["schedule"]), str(row["freeze"]), int(row["seed"]), _twin(runs, row), note
    )


def choose_run(runs: pd.DataFrame, wanted: str, seed: int | None = None, file: str | None = None) -> Chosen:
    """The finished run `wanted` names: a run id, or an arm label (its lowest seed unless `seed`)."""
    done = done_runs(runs)
    if wanted in set(runs["run_id"]):
        row = runs[runs["run_id"] == wanted].iloc[0]
        if row.get("status", "done") != "done":
            raise SpecError(
                f"the run is {row['status']}, not done: only a finished run has a model to export",
                file=file,
                key="RUN_OR_ARM",
                value=wanted,
                allowed=_known(done),
            )
        if seed is not None and int(row["seed"]) != seed:
            raise SpecError("--seed is not the run's seed", key="--seed", value=seed, allowed=str(row["seed"]))
        return _chosen(runs, row)
    mine = done[[wanted in (arm_label(s, f), arm_name((s, f))) for s, f in zip(done["schedule"], done["freeze"])]]
    if mine.empty:
        raise SpecError(
            "no finished run or arm of this name in the sweep",
            file=file,
            key="RUN_OR_ARM",
            value=wanted,
            allowed=_known(done),
        )
    seeds = sorted({int(s) for s in mine["seed"]})
    pick = seeds[0] if seed is None else seed
    if pick not in seeds:
        raise SpecError(
            "the arm has no finished run of this seed",
            file=file,
            key="--seed",
            value=seed,
            allowed=", ".join(map(str, seeds)),
        )
    rows = mine[mine["seed"].astype(int) == pick]
    if len(rows) > 1:
        raise SpecError(
            "the arm has several finished runs of this seed (one per model): name the run",
            file=file,
            key="RUN_OR_ARM",
            value=wanted,
            allowed=", ".join(rows["run_id"]),
        )
    label = arm_label(rows.iloc[0]["schedule"], rows.iloc[0]["freeze"])
    note = (
        None
        if seed is not None or len(seeds) == 1
        else (
            f"arm {label!r} has finished runs of seeds {', '.join(map(str, seeds))}: exporting the lowest, seed {pick} "
            f"(run {rows.iloc[0]['run_id']}); --seed picks another"
        )
    )
    return _chosen(runs, rows.iloc[0], note)


# ---------------------------------------------------------------- what the card reports


def arm_scores(sweep: Sweep, chosen: Chosen, baseline: str | None) -> CardScores | None:
    """The arm's rows of the scores table (the very function `ablate report --table scores` calls, with its
    defaults) and this run's own scores; None when the arm has none. Without a `baseline`, a sweep lacking
    the default one shows the arm alone rather than failing the export."""
    from ablate.report.scores import primary_scores
    from ablate.report.paper_tables import score_table

    if sweep.scores is None or sweep.scores.empty:
        return None
    wanted, note = baseline or sweep.baseline, None
    try:
        table = score_table(sweep, baseline=wanted)
    except SpecError as exc:
        if exc.key == "scores":  # no done run has scores
            return None
        if baseline is not None or exc.key != "--baseline":
            raise
        table, note = (
            score_table(sweep, baseline=chosen.arm),
            (f"The sweep has no {wanted!r} baseline arm with scores: the arm is shown alone, with no comparison."),
        )
    rows = table[table["arm"] == chosen.arm].reset_index(drop=True)
    if rows.empty:
        return None
    ps = primary_scores(sweep)
    run = (
        ps[ps["run_id"] == chosen.run_id]
        .groupby(["task", "metric", "split"], sort=False)["score"]
        .agg(score="mean", n="count")
        .reset_index()
    )
    return CardScores(table=rows, run=run, baseline=str(rows["baseline"].iloc[0]), note=note)


def write_layer_figure(sweep: Sweep, chosen: Chosen, folder: Path, baseline: str | None) -> str | None:
    """The layers figure of the run and its MLM twin, into folder/figures; None when the run has no layer
    measures (its path inside the folder otherwise)."""
    from ablate.report.layers import layers_figure
    from ablate.report.style import save_figure

    if sweep.layers is None:
        return None
    ids = [chosen.run_id] + ([chosen.twin] if chosen.twin else [])
    measured = sweep.layers[(sweep.layers["run_id"] == chosen.run_id) & (sweep.layers["measure"] == "cka_vs_base")]
    if measured.empty:
        return None
    view = replace(sweep, runs=sweep.runs[sweep.runs["run_id"].isin(ids)])
    fig, data = layers_figure(view, baseline=baseline or sweep.baseline, panel=None)
    save_figure(fig, data, folder / FIGURE, "svg")
    return f"{FIGURE}.png"


# ---------------------------------------------------------------- the files


def _cast_bf16(source: Path, target: Path) -> int:
    """A safetensors file with its floating tensors in bfloat16 (its metadata kept); the tensors' bytes."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(source), framework="pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors = {k: t.to(torch.bfloat16) if t.is_floating_point() else t for k, t in tensors.items()}
    save_file(tensors, str(target), metadata=metadata)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _mark_bf16(folder: Path, total_bytes: int) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["dtype" if "dtype" in config or "torch_dtype" not in config else "torch_dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    index = folder / INDEX
    if index.is_file():  # sharded weights: the index says how many bytes they hold
        data = json.loads(index.read_text())
        data.setdefault("metadata", {})["total_size"] = total_bytes
        index.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def copy_model(model_dir: Path, folder: Path, bf16: bool) -> str:
    """The run's model/ folder into `folder` (weights cast with bf16); the dtype of the exported weights."""
    files = sorted(f for f in model_dir.iterdir() if f.is_file()) if model_dir.is_dir() else []
    if not any(f.suffix == WEIGHTS for f in files) or not (model_dir / "config.json").is_file():
        raise SpecError(
            "the run has no model to export (safetensors weights and config.json)",
            file=str(model_dir),
            key="model",
        )
    total = 0
    for f in files:
        if bf16 and f.suffix == WEIGHTS:
            total += _cast_bf16(f, folder / f.name)
        else:
            shutil.copy2(f, folder / f.name)
    if bf16:
        _mark_bf16(folder, total)
        return "bfloat16"
    config = json.loads((folder / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def missing_tokenizer(facts: RunFacts):
    """The tokenizer a model folder saved without one gets (the spec's tokenizer or model source); None when
    the run's model/ holds its own."""
    if any((facts.run_dir / "model" / name).is_file() for name in TOKENIZER_FILES):
        return None
    from ablate.models.loading import load_tokenizer

    return load_tokenizer(facts.spec.tokenizer or facts.spec.model)


def write_records(facts: RunFacts, scores: CardScores | None, folder: Path) -> None:
    records = folder / "ablate"
    records.mkdir()
    shutil.copy2(facts.run_dir / "spec.json", records / "spec.json")
    shutil.copy2(facts.run_dir / "records" / "run.json", records / "run.json")
    if (facts.run_dir / "records" / "frozen.json").is_file():
        shutil.copy2(facts.run_dir / "records" / "frozen.json", records / "frozen.json")
    if scores is not None:
        scores.table.to_csv(records / "scores.csv", index=False)


# ---------------------------------------------------------------- the folder


def check_out(out: Path, force: bool, sweep_dir: Path, run_dir: Path) -> None:
    """A new or empty folder (any folder with `force`), never the sweep, a folder holding it, or a run's."""
    where = out.resolve()
    if (
        where == sweep_dir.resolve()
        or sweep_dir.resolve().is_relative_to(where)
        or where.is_relative_to(run_dir.resolve())
    ):
        raise SpecError(
            "--out would replace the sweep or the run it exports",
            key="--out",
            value=str(out),
            allowed="a folder outside the run's folder that does not hold the sweep",
        )
    if out.exists() and not out.is_dir():
        raise SpecError("--out is a file", key="--out", value=str(out), allowed="a new or empty folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise SpecError(
            "--out is not empty",
            key="--out",
            value=str(out),
            allowed="a new or empty folder, or --force to replace it whole",
        )


def _fill(
    folder: Path,
    sweep: Sweep,
    chosen: Chosen,
    facts: RunFacts,
    scores: CardScores | None,
    tokenizer,
    bf16: bool,
    baseline: str | None,
    name: str,
    load_as: str,
) -> str:
    dtype = copy_model(facts.run_dir / "model", folder, bf16)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    write_records(facts, scores, folder)
    figure = write_layer_figure(sweep, chosen, folder, baseline)
    card = Card(
        name=name,
        load_as=load_as,
        sweep=sweep.name,
        arm=chosen.arm,
        facts=facts,
        scores=scores,
        figure=figure,
        dtype=dtype,
        twin=chosen.twin if figure else None,
    )
    (folder / "README.md").write_text(render_card(card))
    return dtype


def export_run(
    sweep_dir: str | Path,
    wanted: str,
    out: str | Path,
    *,
    bf16: bool = False,
    force: bool = False,
    seed: int | None = None,
    baseline: str | None = None,
    repo_id: str | None = None,
) -> Exported:
    """Write the export of run or arm `wanted` of a collected sweep to `out` (see the module's doc);
    `repo_id` names the model in its card (default: the folder's name)."""
    from ablate.models.loading import check_run_model
    from ablate.store.atomic import publish_dir

    sweep = load_sweep(sweep_dir)
    chosen = choose_run(sweep.runs, wanted, seed, file=str(sweep.path))
    out = Path(out).expanduser()
    run_dir = sweep.path / "runs" / chosen.run_id
    check_out(out, force, sweep.path, run_dir)
    facts = read_run_facts(run_dir)
    # every check before anything is written: the model folder, the tokenizer it lacks, a --baseline
    check_run_model(run_dir / "model", tokenizer=False)
    tokenizer = missing_tokenizer(facts)
    scores = arm_scores(sweep, chosen, baseline)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.export-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        dtype = _fill(
            tmp, sweep, chosen, facts, scores, tokenizer, bf16, baseline, repo_id or out.name, repo_id or str(out)
        )
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Exported(out, chosen, dtype, [chosen.note] if chosen.note else [])
