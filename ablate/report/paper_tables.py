"""The paper's results tables: `scores` (rows = arms, columns = tasks grouped by language + average; cells
mean ± std over seeds, the difference from the baseline arm with significance marks, the best per column in
bold) and `freeze` (arm, what each phase froze, average score, difference from the unfrozen arm of the same
schedule and from the baseline) and `transplant` (per hybrid and task, the share of the gap between its two
arms it recovers: ablate.report.recovery). Each is written as a tidy CSV, Markdown and LaTeX (booktabs).

Differences, CIs and p-values come from a paired bootstrap (ablate.evaluate.bootstrap) over the pairing units
both arms were measured on: (pretraining seed, fine-tuning seed) when the sweep's pretraining seeds are
independent replicates, fine-tuning seeds alone when they are not (ablate.evaluate.units.pairing_units; `units`
overrides). With fewer than two units a test is impossible: the table says so and has no p-values. `tasks`
(e.g. `--set tasks=[ncbi_disease]`) limits the columns; a task an arm has no score for is a SpecError.
`tokens_match` says whether an arm's runs read the same tokens as their MLM twins (`ablate collect`'s check);
an arm whose tokens differ carries a dagger in Markdown and LaTeX.

May import: config, plan (freezing), evaluate, report.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.config.errors import SpecError
from ablate.evaluate.units import pairing_units, require_task_scores
from ablate.report.arms import arm_label, arm_tokens_match, done_runs
from ablate.report.beside import (
    BASE_MODEL,
    arm_models,
    beside_freeze,
    beside_scores,
    check_fractions,
    freeze_block,
    is_base_model,
    score_blocks,
)
from ablate.report.divergence import divergence_table
from ablate.report.recovery import recovery_table
from ablate.report.references import check_reference, load_reference
from ablate.evaluate.sizes import min_test_examples
from ablate.report.scores import (
    AVERAGE,
    arm_vs_baseline,
    average_names,
    averages,
    is_average,
    task_languages,
    unit_scores,
)
from ablate.report.sweep import Sweep, load_sweep

MARKS = ((0.01, "**"), (0.05, "*"))  # p below -> mark
DAGGER = {"md": "†", "tex": "$^\\dagger$"}
TOKENS_NOTE = (
    "† the arm's runs read other tokens than their MLM twins (runs table: twin_tokens): its comparison "
    "does not rest on identical data."
)
SMALL_MARK = {"md": "‡", "tex": "$^\\ddagger$"}
SMALL_NOTE = (
    "‡ too few test examples for the metric ({tasks}; ablate.evaluate.sizes.MIN_TEST_EXAMPLES): one "
    "example moves the score by about as much as the differences between arms."
)


def _marks(p: float) -> str:
    return next((m for cut, m in MARKS if p == p and p < cut), "")


def _baseline_arm(u: pd.DataFrame, baseline: str, sweep: Sweep) -> tuple[str, str]:
    arms = list(dict.fromkeys(zip(u["schedule"], u["freeze"])))
    wanted = next((a for a in arms if arm_label(*a) == baseline), None) or next(
        (a for a in arms if a == (baseline, "none")), None
    )
    if wanted is None:
        raise SpecError(
            "the baseline arm has no scores in this sweep",
            file=str(sweep.path),
            key="--baseline",
            value=baseline,
            allowed=", ".join(arm_label(*a) for a in arms),
        )
    return wanted


def _units(sweep: Sweep, units) -> tuple[str, ...]:
    return tuple(units) if units else tuple(pairing_units(done_runs(sweep.runs)))


def _only_tasks(sweep: Sweep, u: pd.DataFrame, tasks) -> pd.DataFrame:
    """The unit scores of `tasks` (a list or "a,b"), their average recomputed; every arm must have each."""
    if tasks is None:
        return u
    wanted = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks)]
    require_task_scores(u.loc[~u["task"].map(is_average), ["run_id", "task"]], done_runs(sweep.runs), wanted)
    u = u[u["task"].isin(wanted)]
    unit = ["schedule", "freeze", "run_id", "seed", "finetune_seed"]
    return pd.concat([u, *averages(u, unit)], ignore_index=True)


def base_models_apart(sweep: Sweep) -> Sweep:
    """The sweep with each base model (`ablate evaluate --base`) an arm of its own, `base (SOURCE)`, when it
    has several (one keeps the name `base`): their scores would otherwise be averaged into one row."""
    runs = sweep.runs
    if "model_source" not in runs.columns:
        return sweep
    is_base = runs["schedule"] == BASE_MODEL
    if runs.loc[is_base, "model_source"].nunique() < 2:
        return sweep
    named = runs["schedule"].where(~is_base, BASE_MODEL + " (" + runs["model_source"].astype(str) + ")")
    return replace(sweep, runs=runs.assign(schedule=named))


def score_table(
    sweep: Sweep,
    *,
    baseline: str | None = None,
    split: str | None = None,
    units: tuple[str, ...] | None = None,
    tasks=None,
    seed: int = 0,
    reference: str | None = None,
) -> pd.DataFrame:
    """Tidy: one row per (arm, task) with language, mean, std, n, and delta / ci_low / ci_high / p_value
    against the baseline arm (a schedule name, meaning its unfrozen arm, or an arm label), and the pairing
    units used (column `units`). `reference` (e.g. "paper"): the published numbers beside the measured ones
    (ablate.report.beside: paper_row, paper, measured, paper_delta, paper_tasks, ...)."""
    ref = load_reference(reference) if reference else None
    sweep = base_models_apart(sweep)
    baseline = baseline or sweep.baseline
    units = _units(sweep, units)
    u = _only_tasks(sweep, unit_scores(sweep, split, None, "table"), tasks)
    base_arm = _baseline_arm(u, baseline, sweep)
    language = task_languages(sweep.scores)
    tasks = list(dict.fromkeys(t for t in u["task"] if not is_average(t))) + average_names(u["task"])
    test_size = _test_sizes(u)
    tokens_match = arm_tokens_match(sweep.runs)
    rows = []
    for arm in dict.fromkeys(zip(u["schedule"], u["freeze"])):
        mine = u[(u["schedule"] == arm[0]) & (u["freeze"] == arm[1])]
        base = u[(u["schedule"] == base_arm[0]) & (u["freeze"] == base_arm[1])]
        by = ["finetune_seed"] if is_base_model(arm[0]) else list(units)  # the base model has no pretraining seed
        for task in tasks:
            a = mine[mine["task"] == task].groupby(by)["score"].mean()
            if a.empty:
                continue
            b = base[base["task"] == task].groupby(by)["score"].mean()
            delta = lo = hi = p = np.nan
            n_pairs, method = 0, "baseline"
            if arm != base_arm and not b.empty:
                delta, lo, hi, p, n_pairs, method = arm_vs_baseline(a, b, seed=seed)
            rows.append(
                {
                    "arm": arm_label(*arm),
                    "schedule": arm[0],
                    "freeze": arm[1],
                    "task": task,
                    "language": _language_of(task, language),
                    **test_size.get(task, _NO_SIZE),
                    "mean": float(a.mean()),
                    "std": float(a.std()) if len(a) > 1 else np.nan,
                    "n": len(a),
                    "delta": delta,
                    "ci_low": lo,
                    "ci_high": hi,
                    "p_value": p,
                    "n_pairs": n_pairs,
                    "test": method,
                    "baseline": arm_label(*base_arm),
                    "units": "+".join(units),
                    "tokens_match": tokens_match.get(arm),
                }
            )
    out = pd.DataFrame(rows)
    if out.empty:
        raise SpecError("no scores for done runs", file=str(sweep.path), key="scores")
    if ref is None:
        return out
    check_fractions(sweep.scores, [t for main in ref.main for t in main.tasks])
    return beside_scores(out, arm_models(sweep.runs), ref)


_NO_SIZE = {"test_examples": np.nan, "small_test": False}


def _language_of(task: str, language: dict[str, str]) -> str:
    if task == AVERAGE:
        return "all"
    if is_average(task):
        return task[len(AVERAGE) + 2 : -1]  # "average (fr)" -> fr
    return language.get(task, "")


def _test_sizes(u: pd.DataFrame) -> dict[str, dict]:
    """task -> its test examples (the fewest any score used) and whether that is fewer than its metric's
    threshold (ablate.evaluate.sizes.MIN_TEST_EXAMPLES); tasks whose score files predate the count: none."""
    if "n_examples" not in u.columns or (u["split"] != "test").all():
        return {}
    out = {}
    for task, g in u[~u["task"].map(is_average)].groupby("task", sort=False):
        n = pd.to_numeric(g["n_examples"], errors="coerce").min()
        if n == n:
            out[task] = {"test_examples": int(n), "small_test": bool(n < min_test_examples(g["metric"].iloc[0]))}
    return out


def freeze_table(
    sweep: Sweep,
    *,
    baseline: str | None = None,
    split: str | None = None,
    units: tuple[str, ...] | None = None,
    tasks=None,
    seed: int = 0,
    reference: str | None = None,
) -> pd.DataFrame:
    """One row per arm: what each phase froze (from the `frozen` table), the average score, and its
    difference from the same schedule without freezing and from the baseline arm. `reference`: the
    paper's freezing rows beside them (ablate.report.beside)."""
    ref = load_reference(reference) if reference else None
    sweep = base_models_apart(sweep)
    baseline = baseline or sweep.baseline
    units = _units(sweep, units)
    scores = score_table(sweep, baseline=baseline, split=split, units=units, tasks=tasks, seed=seed)
    avg = scores
    summary = AVERAGE if (avg["task"] == AVERAGE).any() else avg["task"].iloc[0]  # one task: no average of it
    avg = avg[avg["task"] == summary].set_index("arm")
    u = _only_tasks(sweep, unit_scores(sweep, split, None, "table"), tasks)
    u = u[u["task"] == summary]
    frozen = _frozen_by_arm(sweep)
    rows = []
    for arm, row in avg.iterrows():
        twin = u[(u["schedule"] == row["schedule"]) & (u["freeze"] == "none")]
        mine = u[(u["schedule"] == row["schedule"]) & (u["freeze"] == row["freeze"])]
        d_twin = p_twin = np.nan
        if row["freeze"] != "none" and not twin.empty:
            d_twin, _, _, p_twin, _, _ = arm_vs_baseline(
                mine.groupby(list(units))["score"].mean(), twin.groupby(list(units))["score"].mean(), seed=seed
            )
        rows.append(
            {
                "arm": arm,
                "schedule": row["schedule"],
                "freeze": row["freeze"],
                "frozen": frozen.get((row["schedule"], row["freeze"]), "-"),
                "mean": row["mean"],
                "std": row["std"],
                "n": row["n"],
                "delta_vs_unfrozen": d_twin,
                "p_vs_unfrozen": p_twin,
                "delta_vs_baseline": row["delta"],
                "p_vs_baseline": row["p_value"],
            }
        )
    out = pd.DataFrame(rows)
    if ref is None:
        return out
    check_fractions(sweep.scores, ref.main_table(ref.freeze.language).tasks)
    return beside_freeze(out, scores, arm_models(sweep.runs), _frozen_by_arm(sweep), ref)


def _frozen_by_arm(sweep: Sweep) -> dict[tuple[str, str], str]:
    """(schedule, freeze) -> 'clm: 0-7; mlm_decay: emb,0-7' from the frozen table, by the layers figure's
    rule (a phase that froze every layer, such as a head warm-up, is left out)."""
    from ablate.plan.freezing import consecutive_runs
    from ablate.report.layers import drawn_frozen

    if sweep.layers is None:
        return {}
    rows = drawn_frozen(sweep.frozen, sweep.layers)
    runs = done_runs(sweep.runs)
    out = {}
    for (s, f), g in runs.groupby(["schedule", "freeze"], sort=False):
        mine = rows[rows["run_id"] == g["run_id"].iloc[0]]
        parts = []
        for phase, fp in mine.groupby("phase", sort=False):
            layers = sorted(fp["layer"])
            spans = [str(a) if a == b else f"{a}-{b}" for a, b in consecutive_runs([x for x in layers if x >= 0])]
            parts.append(f"{phase}: " + ",".join((["emb"] if -1 in layers else []) + spans))
        out[(s, f)] = "; ".join(parts) or "-"
    return out


# ------------------------------------------------------------------ rendering


def _tex(text: str) -> str:
    return str(text).replace("_", "\\_").replace("%", "\\%").replace("±", "$\\pm$")


def _cell(row, best: bool, fmt: str) -> str:
    text = f"{row['mean']:.1f}" + ("" if row["std"] != row["std"] else f" ± {row['std']:.1f}")
    if fmt == "tex":
        text = _tex(text)
    if best:
        text = f"**{text}**" if fmt == "md" else f"\\textbf{{{text}}}"
    if row["delta"] == row["delta"]:
        text += f" ({row['delta']:+.1f}{_marks(row['p_value'])})"
    return text


def render_scores(data: pd.DataFrame, fmt: str) -> str:
    """The wide scores table as Markdown (`md`) or LaTeX booktabs (`tex`): tasks grouped by language."""
    groups: dict[str, list[str]] = {}
    for task in dict.fromkeys(data["task"]):
        groups.setdefault(data.loc[data["task"] == task, "language"].iloc[0] or "?", []).append(task)
    tasks = [t for ts in groups.values() for t in ts]
    arms = list(dict.fromkeys(data["arm"]))
    best = data.loc[data.groupby("task")["mean"].idxmax()].set_index("task")["arm"]
    cell = {(r["arm"], r["task"]): _cell(r, best.get(r["task"]) == r["arm"], fmt) for _, r in data.iterrows()}
    differ = _tokens_differ(data)
    small = small_tests(data)
    body = [[_arm_name(arm, arm in differ, fmt)] + [cell.get((arm, t), "") for t in tasks] for arm in arms]
    units = (
        data["units"].iloc[0].replace("finetune_seed", "fine-tuning seed").replace("seed+", "pretraining seed x ")
    )
    note = (
        f"Cells: mean ± std over pairing units ({units}); (delta vs baseline; * p < 0.05, ** p < 0.01, "
        "paired bootstrap)."
    )
    if data["p_value"].isna().all() and (data["test"] != "baseline").any():
        note += " No p-values: fewer than two pairing units are shared with the baseline, so no test is possible."
    if differ:
        note += " " + TOKENS_NOTE
    if small:
        note += " " + SMALL_NOTE.format(tasks=", ".join(f"{t} ({n})" for t, n in small.items()))
    if fmt == "md":
        head = ["arm"] + [
            (t if is_average(t) else f"{t} ({lang})") + (SMALL_MARK["md"] if t in small else "")
            for lang, ts in groups.items()
            for t in ts
        ]
        return _markdown(head, body) + "\n" + note + "\n"
    spans = " & ".join(f"\\multicolumn{{{len(ts)}}}{{c}}{{{_tex(lang)}}}" for lang, ts in groups.items())
    rules, start = [], 2
    for ts in groups.values():
        rules.append(f"\\cmidrule(lr){{{start}-{start + len(ts) - 1}}}")
        start += len(ts)
    lines = [
        "\\begin{tabular}{l" + "c" * len(tasks) + "}",
        "\\toprule",
        f" & {spans} \\\\",
        " ".join(rules),
        "arm & " + " & ".join(_tex(t) + (SMALL_MARK["tex"] if t in small else "") for t in tasks) + " \\\\",
        "\\midrule",
    ]
    lines += [" & ".join(r) + " \\\\" for r in body]
    return "\n".join(lines + ["\\bottomrule", "\\end{tabular}", "% " + note]) + "\n"


def small_tests(data: pd.DataFrame) -> dict[str, int]:
    """task -> its test examples, for the tasks flagged `small_test` (too few for their metric)."""
    if "small_test" not in data.columns:
        return {}
    flagged = data[data["small_test"].astype(str) == "True"].drop_duplicates("task")
    return {t: int(n) for t, n in zip(flagged["task"], flagged["test_examples"])}


def _tokens_differ(data: pd.DataFrame) -> set[str]:
    """The arms whose runs read other tokens than their MLM twins (tokens_match False)."""
    if "tokens_match" not in data.columns:
        return set()
    return set(data.loc[data["tokens_match"].astype(str) == "False", "arm"])


def _arm_name(arm: str, tokens_differ: bool, fmt: str) -> str:
    return (arm if fmt == "md" else _tex(arm)) + (DAGGER[fmt] if tokens_differ else "")


def render_plain(frame: pd.DataFrame, fmt: str) -> str:
    """Any tidy frame as a Markdown or booktabs table, one row per row."""
    head = list(frame.columns)
    body = [
        ["" if v != v else (f"{v:.2f}" if isinstance(v, float) else str(v)) for v in row]
        for row in frame.itertuples(index=False)
    ]
    if fmt == "md":
        return _markdown(head, body)
    lines = [
        "\\begin{tabular}{" + "l" * len(head) + "}",
        "\\toprule",
        " & ".join(map(_tex, head)) + " \\\\",
        "\\midrule",
    ] + [" & ".join(map(_tex, r)) + " \\\\" for r in body]
    return "\n".join(lines + ["\\bottomrule", "\\end{tabular}"]) + "\n"


def _markdown(head: list[str], body: list[list[str]]) -> str:
    rows = [head, ["---"] * len(head), *body]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows) + "\n"


def transplant_table(
    sweep: Sweep, *, split: str | None = None, units: tuple[str, ...] | None = None, tasks=None, seed: int = 0
) -> pd.DataFrame:
    """One row per transplant arm and task (and their average): the hybrid's score, its from and into arms'
    and the share of their gap it recovers, with a bootstrap interval (ablate.report.recovery)."""
    units = _units(sweep, units)
    u = unit_scores(sweep, split, None, "table")
    u = u[~u["task"].map(is_average)]
    if tasks is not None:
        wanted = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks)]
        u = u[u["task"].isin(wanted)]
    return recovery_table(u, done_runs(sweep.runs), units, seed, file=str(sweep.path))


TABLES = {
    "scores": score_table,
    "freeze": freeze_table,
    "divergence": divergence_table,
    "transplant": transplant_table,
}
REFERENCE_TABLES = ("scores", "freeze")  # the tables a reference's rows can be set beside


def check_reference_table(name: str, reference) -> None:
    """`reference` (--reference) is a known reference, and table `name` one with reference rows."""
    if reference is None:
        return
    check_reference(str(reference))
    if name not in REFERENCE_TABLES:
        raise SpecError(
            f"table {name!r} has no reference rows",
            key="--reference",
            value=reference,
            allowed="--table " + ", ".join(REFERENCE_TABLES),
        )


def make_table(
    name: str, sweep_dir: str | Path | None = None, out: str | Path | None = None, **options
) -> dict[str, Path]:
    """Write table `name` of a sweep as CSV (tidy), Markdown and LaTeX (default <sweep>/tables/); returns
    their paths."""
    if name not in TABLES:
        raise SpecError("unknown table", key="--table", value=name, allowed=", ".join(TABLES))
    check_reference_table(name, options.get("reference"))
    sweep = load_sweep(sweep_dir)
    data = TABLES[name](sweep, **options)
    folder = Path(out).expanduser() if out else sweep.path / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"csv": folder / f"{name}.csv", "md": folder / f"{name}.md", "tex": folder / f"{name}.tex"}
    data.to_csv(paths["csv"], index=False)
    reference = options.get("reference")
    shown = data[[c for c in data.columns if not c.startswith("paper_") and c not in ("paper", "measured")]]
    for fmt in ("md", "tex"):
        text = render_scores(shown, fmt) if name == "scores" else render_plain(shown, fmt)
        if reference:
            text += "".join(render_block(*block, fmt) for block in reference_blocks(name, data, reference))
        paths[fmt].write_text(text)
    return paths


# The metric behind each of the paper's English numbers. Its English recipe is BioClinical-ModernBERT's harness
# (github lindvalllab/BioClinical-ModernBERT at fb40fb6), which reports sklearn's weighted F1 for classification
# and evaluate's seqeval F1 (default mode) for NER; the six BigBIO tasks are not in it and the paper names no
# metric for them: its conventions are assumed (ablate.evaluate.protocol, docs/differences.md).
_HARNESS_CLS = "weighted F1 (the harness: src/metrics/metrics.py:{line})"
_HARNESS_NER = "seqeval F1, default mode (the harness: src/metrics/metrics.py:54-73)"
_NOT_STATED = "not stated (not a harness task): the harness's {what} assumed"
PAPER_METRICS: dict[str, tuple[str, str]] = {  # task -> (ablate's metric name, what the paper's number is)
    "chemprot_blue": ("weighted_f1", _HARNESS_CLS.format(line=38)),
    "phenotyping": ("weighted_f1", _HARNESS_CLS.format(line=18)),
    **{t: ("seqeval_f1", _HARNESS_NER) for t in ("cos", "social_history", "deid")},
    **{
        t: ("seqeval_f1", _NOT_STATED.format(what="seqeval F1"))
        for t in ("anatem", "bc5cdr", "jnlpba", "ncbi_disease")
    },
    **{t: ("weighted_f1", _NOT_STATED.format(what="weighted F1")) for t in ("gad", "hoc")},
}


def metric_note(tasks) -> str | None:
    """For each of `tasks` whose paper number's metric is known (PAPER_METRICS), that metric and whether the
    measured score (the task file's first metric) is the same one; None when none is."""
    from ablate.evaluate.tasks import load_task

    parts = []
    for task in tasks:
        if task not in PAPER_METRICS:
            continue
        theirs, what = PAPER_METRICS[task]
        ours = load_task(task).primary_metric
        parts.append(
            f"{task}: {what}; measured {ours}: " + ("the same metric" if ours == theirs else "another metric")
        )
    return "The paper's numbers by metric: " + "; ".join(parts) + "." if parts else None


def reference_blocks(name: str, data: pd.DataFrame, reference: str) -> list[tuple[str, pd.DataFrame, list[str]]]:
    """The compact paper-beside-measured blocks of table `name`'s data (made with `reference`); the scores
    blocks say, for each column of the paper's English table, which metric its number is and whether the
    measured one is the same (metric_note)."""
    ref = load_reference(reference)
    if name != "scores":
        return [freeze_block(data, ref)]
    blocks = []
    for title, frame, notes in score_blocks(data, ref):
        note = metric_note(frame.columns)
        blocks.append((title, frame, notes + ([note] if note else [])))
    return blocks


def render_block(title: str, frame: pd.DataFrame, notes: list[str], fmt: str) -> str:
    """A titled table of strings with its notes under it, as Markdown or LaTeX (notes as comments)."""
    if fmt == "md":
        return f"\n{title}\n\n" + render_plain(frame, "md") + "".join(f"\n{n}" for n in notes) + "\n"
    return f"\n% {_tex(title)}\n" + render_plain(frame, "tex") + "".join(f"% {n}\n" for n in notes)
