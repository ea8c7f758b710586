"""The downstream figures: `deltas` (each arm minus the MLM baseline, per task and on average) and `freeze`
(mean score per freeze mask x schedule), and the score summary `ablate report` prints.

A score is the primary metric of a task in points (x100); replicates are (pretraining seed, fine-tuning
seed) units. A task whose data comes from a download nothing pins (ablate.data.catalog.unverified_reason) has
its scores marked unverified (`unverified_data`: the summary's and the report page's `data` column).

May import: config, data (catalog), evaluate (tasks, units, bootstrap), report.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ablate.config.errors import SpecError
from ablate.evaluate.units import pairing_units
from ablate.evaluate.bootstrap import N_RESAMPLES, paired_bootstrap
from ablate.report.arms import (
    arm_keys,
    arm_label,
    arm_sorted,
    done_runs,
    in_panel,
    ordered,
    panel_column,
    panel_title,
    panels,
)
from ablate.report.stats import mean_ci, welch_ci
from ablate.report.style import arm_styles, figure_legend, new_figure, styled
from ablate.report.sweep import Sweep
from ablate.config.grid import DEFAULT_BASELINE


def pick_split(scores: pd.DataFrame, split: str | None) -> str:
    """The split asked for, checked; None: "test" when the table has it, else its first split."""
    splits = ordered(scores["split"])
    if split is None:
        return "test" if "test" in splits else splits[0]
    if split not in splits:
        raise SpecError("split not in the scores table", key="split", value=split, allowed=", ".join(splits))
    return split


def primary_scores(sweep: Sweep, *, split: str | None = None, figure: str = "scores") -> pd.DataFrame:
    """One row per (run_id, task, finetune_seed): the primary metric in points (x100) on `split`.

    The primary metric of a task is the one flagged by a `primary` column when the table has one, else the
    first metric listed for the task. If a fine-tuning run logged several epochs, the last one counts.
    """
    scores = sweep.require("scores", figure)
    split = pick_split(scores, split)
    s = scores[(scores["split"] == split) & scores["run_id"].isin(done_runs(sweep.runs)["run_id"])]
    metric_of = s.drop_duplicates("task").set_index("task")["metric"]
    if "primary" in s.columns:  # bool from parquet, "True"/"False" from csv
        flagged = s[s["primary"].astype(str).str.lower().isin(["true", "1"])]
        metric_of.update(flagged.drop_duplicates("task").set_index("task")["metric"])
    s = s[s["metric"] == s["task"].map(metric_of)]
    if "epoch" in s.columns:
        s = s.sort_values("epoch", kind="stable")
    s = s.drop_duplicates(["run_id", "task", "finetune_seed"], keep="last")
    out = s[["run_id", "task", "finetune_seed", "metric"]].copy()
    out["score"] = 100.0 * s["value"].astype(float)
    out["split"] = split
    for extra in ("language", "n_examples"):  # absent from tables of older score files
        if extra in s.columns:
            out[extra] = s[extra].to_numpy()
    return out.reset_index(drop=True)


def unit_scores(sweep: Sweep, split: str | None, pcol: str | None, figure: str) -> pd.DataFrame:
    """Scores per (run, finetune seed) and task, plus task "average" over a panel's tasks (complete units only)."""
    ps = primary_scores(sweep, split=split, figure=figure)
    runs = done_runs(sweep.runs)
    df = ps.merge(runs[["run_id", *arm_keys(pcol), "seed"]], on="run_id")
    if df.empty:
        raise SpecError("no scores for done runs", file=str(sweep.path), key="scores")
    parts = [df]
    for p in panels(df, pcol):
        unit = [*arm_keys(pcol), "run_id", "seed", "finetune_seed"]
        parts += [*averages(in_panel(df, pcol, p), unit)]
    return pd.concat(parts, ignore_index=True)


AVERAGE = "average"


def language_average(language: str) -> str:
    """The task name of a language's average row: "average (fr)"."""
    return f"{AVERAGE} ({language})"


def is_average(task) -> bool:
    """Whether a task name is an average row ("average", "average (en)"), not a task."""
    return str(task) == AVERAGE or str(task).startswith(AVERAGE + " (")


def task_languages(scores: pd.DataFrame) -> dict[str, str]:
    """task -> its language, from the scores' `language` column (empty when the table has none)."""
    if "language" not in scores.columns:
        return {}
    known = scores.dropna(subset=["language"]).drop_duplicates("task")
    return {t: str(lang) for t, lang in zip(known["task"], known["language"]) if not is_average(t) and lang}


def language_averages(scores: pd.DataFrame, unit: list[str]) -> list[pd.DataFrame]:
    """Rows of task "average (LANG)" per language, the mean over that language's tasks per unit (complete
    units only, as task_average), when the tasks span two languages or more (else it is the average)."""
    tasks = scores[~scores["task"].map(is_average)]
    languages = task_languages(tasks)
    if len(set(languages.values())) < 2:
        return []
    out = []
    for lang in dict.fromkeys(languages.values()):
        mine = tasks[tasks["task"].map(languages) == lang]
        out.append(task_average(mine, unit).assign(task=language_average(lang), language=lang))
    return out


def averages(scores: pd.DataFrame, unit: list[str]) -> list[pd.DataFrame]:
    """The average rows of `scores`: the overall one (none for a single task: it would repeat the task) and the
    per-language ones."""
    several = scores.loc[~scores["task"].map(is_average), "task"].nunique() > 1
    return [*([task_average(scores, unit)] if several else []), *language_averages(scores, unit)]


def task_average(scores: pd.DataFrame, unit: list[str]) -> pd.DataFrame:
    """Rows of task "average": per unit, the mean score over the tasks of `scores`, for the units that have
    every one of them."""
    tasks = scores["task"].nunique()
    avg = scores.groupby(unit, sort=False).agg(score=("score", "mean"), k=("task", "nunique")).reset_index()
    return avg[avg["k"] == tasks].drop(columns="k").assign(task=AVERAGE)


def average_names(tasks) -> list[str]:
    """The average rows among `tasks` in display order: the per-language ones, then the overall one."""
    names = [t for t in dict.fromkeys(tasks) if is_average(t)]
    return sorted(n for n in names if n != AVERAGE) + ([AVERAGE] if AVERAGE in names else [])


def arm_vs_baseline(a: pd.Series, b: pd.Series, n_resamples: int = N_RESAMPLES, seed: int = 0) -> tuple:
    """(delta, ci_low, ci_high, p_value, n_pairs, method) of arm scores `a` against baseline scores `b`, both
    indexed by pairing unit: a paired bootstrap over the units both have (two or more); with one shared unit
    the difference alone; with none, Welch on the unpaired scores (no p-value)."""
    shared = a.index.intersection(b.index)
    if len(shared) >= 2:
        r = paired_bootstrap(a[shared].to_numpy(), b[shared].to_numpy(), n_resamples=n_resamples, seed=seed)
        return r.delta, r.ci_low, r.ci_high, r.p_value, r.n_units, "paired bootstrap"
    if len(shared) == 1:
        d = float(a[shared].iloc[0] - b[shared].iloc[0])
        return d, np.nan, np.nan, np.nan, 1, "one pair: no test"
    return (*welch_ci(a, b), np.nan, 0, "welch")


def delta_data(
    sweep: Sweep, *, baseline: str | None = None, split: str | None = None, panel: str | None = "auto"
) -> pd.DataFrame:
    """Per arm and task (and "average" over tasks): arm minus MLM baseline in points, with a 95% CI.

    Replicates are (pretraining seed, fine-tuning seed) units, or fine-tuning seeds alone when the pretraining
    seeds are not independent (ablate.evaluate.units.pairing_units). Arm and baseline units sharing them
    are paired (the twins see the same token stream and fine-tuning seed): the CI and p-value come from a
    paired bootstrap of the differences (ablate.evaluate.bootstrap). With no shared units, a Welch interval
    on the unpaired scores and no p-value.
    """
    baseline = baseline or sweep.baseline
    pcol = panel_column(done_runs(sweep.runs), panel)
    u = unit_scores(sweep, split, pcol, "deltas")
    is_base = (u["schedule"] == baseline) & (u["freeze"] == "none")
    if not is_base.any():
        have = ", ".join(sorted({arm_label(s, f) for s, f in zip(u["schedule"], u["freeze"])}))
        raise SpecError(
            f"figure 'deltas' needs MLM-baseline runs (schedule {baseline!r}, freeze 'none') with "
            f"scores; the sweep's scored arms are: {have}",
            file=str(sweep.path),
            key="baseline",
            value=baseline,
        )
    if is_base.all():
        raise SpecError("figure 'deltas' needs at least one arm besides the MLM baseline", file=str(sweep.path))
    tasks = ordered(u.loc[~u["task"].map(is_average), "task"]) + average_names(u["task"])
    units = pairing_units(done_runs(sweep.runs))
    rows = []
    for p in panels(u, pcol):
        up = in_panel(u, pcol, p)
        base = up[is_base.loc[up.index]]
        if base.empty:
            continue
        arms = up[~is_base.loc[up.index]]
        for s, f in dict.fromkeys(zip(arms["schedule"], arms["freeze"])):
            a_all = arms[(arms["schedule"] == s) & (arms["freeze"] == f)]
            for task in tasks:
                a = a_all[a_all["task"] == task].groupby(units)["score"].mean()
                b = base[base["task"] == task].groupby(units)["score"].mean()
                if a.empty or b.empty:
                    continue
                d, lo, hi, pv, n, method = arm_vs_baseline(a, b)
                rows.append(
                    ((p,) if pcol else ())
                    + (
                        s,
                        f,
                        arm_label(s, f),
                        task,
                        d,
                        lo,
                        hi,
                        pv,
                        n,
                        len(a),
                        len(b),
                        method,
                        float(a.mean()),
                        float(b.mean()),
                    )
                )
    out = pd.DataFrame(
        rows,
        columns=[
            *arm_keys(pcol),
            "arm",
            "task",
            "delta",
            "ci_low",
            "ci_high",
            "p_value",
            "n_pairs",
            "n_arm",
            "n_baseline",
            "ci_method",
            "arm_mean",
            "baseline_mean",
        ],
    )
    return arm_sorted(out, sweep.runs, baseline, pcol)  # stable: tasks keep their order within an arm


def score_summary(sweep: Sweep, *, baseline: str | None = None, split: str | None = None) -> pd.DataFrame:
    """Per arm and task: mean and standard deviation of the primary metric (points) over all
    (pretraining seed, fine-tuning seed) units, their count, the difference from the MLM baseline, and `data`:
    "unverified" for a task (or an average over tasks) whose data is (data_marks)."""
    baseline = baseline or sweep.baseline
    u = unit_scores(sweep, split, None, "summary")
    out = (
        u.groupby(["schedule", "freeze", "task"], sort=False)["score"]
        .agg(mean="mean", std="std", n="count")
        .reset_index()
    )
    base = out[(out["schedule"] == baseline) & (out["freeze"] == "none")].set_index("task")["mean"]
    out["delta_pp"] = out["mean"] - out["task"].map(base)
    out["data"] = out["task"].map(data_marks(out["task"], task_languages(sweep.scores)))
    return out.round(2)


UNVERIFIED = "unverified"


def unverified_data(tasks) -> dict[str, str]:
    """task -> why its data is unverified (the datasets its split files come from whose download nothing
    pins: ablate.data.catalog.unverified_reason), for the tasks whose data is; averages, tasks not in the
    registry, `datasets` tasks and data outside the catalogue (brought) are left out."""
    from ablate.data.catalog import dataset, dataset_of_path, unverified_reason
    from ablate.evaluate.tasks import load_task

    out = {}
    for task in dict.fromkeys(str(t) for t in tasks if not is_average(t)):
        try:
            spec = load_task(task)
        except SpecError:
            continue
        if spec.data.format == "hf":
            continue
        splits = spec.data.splits
        names = sorted({n for p in (splits.train, splits.dev, splits.test) if (n := dataset_of_path(p))})
        reasons = [f"{n}: {reason}" for n in names if (reason := unverified_reason(dataset(n)))]
        if reasons:
            out[task] = "; ".join(reasons)
    return out


def data_marks(tasks, languages: dict[str, str] | None = None) -> dict[str, str]:
    """task -> "unverified" for each task whose data is (unverified_data), and for each average row over
    such a task ("unverified: includes T, ..."; a language's average over that language's tasks only);
    "" for the others."""
    tasks = list(dict.fromkeys(str(t) for t in tasks))
    plain = [t for t in tasks if not is_average(t)]
    marked = unverified_data(plain)
    languages = languages or {}
    out = {t: UNVERIFIED if t in marked else "" for t in plain}
    for average in (t for t in tasks if is_average(t)):
        language = average[len(AVERAGE) + 2 : -1] if average != AVERAGE else None
        inside = [t for t in plain if t in marked and (language is None or languages.get(t) == language)]
        out[average] = f"{UNVERIFIED}: includes {', '.join(inside)}" if inside else ""
    return out


def plot_deltas(
    data: pd.DataFrame, *, panel_col: str | None = None, baseline: str = DEFAULT_BASELINE, split: str = "test"
):
    names = panels(data, panel_col)
    plain = ordered(data.loc[~data["task"].map(is_average), "task"])
    averages = average_names(data["task"])
    tasks = plain + averages
    arms = list(dict.fromkeys(zip(data["schedule"], data["freeze"])))
    colors, styles = arm_styles(data, baseline)
    # the averages (per language, then overall) right of a dotted rule, a little apart from the tasks
    x = {t: i for i, t in enumerate(plain)} | {t: len(plain) + 0.4 + i for i, t in enumerate(averages)}
    width = min(0.8, 0.18 * len(arms))
    offsets = np.linspace(-width / 2, width / 2, len(arms)) if len(arms) > 1 else [0.0]
    fig = new_figure(min(7.2, max(3.6, 1.2 + len(tasks) * max(0.5, 0.2 * len(arms)))), 1.3 + 2.3 * len(names))
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    long_names = max(len(t) for t in tasks) > 6 or len(tasks) > 6
    for ax, p in zip(axes, names):
        d = in_panel(data, panel_col, p)
        ax.axhline(0.0, color="0.3", lw=0.8)
        ax.axvline(len(plain) - 0.3, color="0.7", lw=0.6, ls=":")
        for off, (s, f) in zip(offsets, arms):
            g = d[(d["schedule"] == s) & (d["freeze"] == f)]
            if g.empty:
                continue
            xs = np.array([x[t] for t in g["task"]]) + off
            yerr = np.vstack([g["delta"] - g["ci_low"], g["ci_high"] - g["delta"]])
            ax.errorbar(
                xs,
                g["delta"],
                yerr=yerr,
                fmt=styles[f][1],
                color=colors[s],
                ms=4,
                capsize=2,
                elinewidth=1,
                lw=0,
                label=arm_label(s, f),
            )
        ax.set_ylabel(f"Δ vs {baseline} baseline\n(points)")
        ax.set_title(panel_title(panel_col, p))
        ax.grid(axis="y", lw=0.4, alpha=0.5)
    axes[-1].set_xticks(
        [x[t] for t in tasks], tasks, rotation=30 if long_names else 0, ha="right" if long_names else "center"
    )
    axes[-1].set_xlabel(f"task (primary metric, {split} split)")
    figure_legend(fig, axes, loc="outside upper center", ncols=min(len(arms), 3))
    return fig


@styled
def deltas_figure(
    sweep: Sweep, *, baseline: str | None = None, split: str | None = None, panel: str | None = "auto"
):
    """Downstream difference from the MLM baseline per task and on average, per arm, 95% paired-bootstrap CIs."""
    baseline = baseline or sweep.baseline
    pcol = panel_column(done_runs(sweep.runs), panel)
    data = delta_data(sweep, baseline=baseline, split=split, panel=pcol)
    if data.empty:
        raise SpecError("no arm shares a panel with an MLM baseline that has scores", file=str(sweep.path))
    return plot_deltas(data, panel_col=pcol, baseline=baseline, split=pick_split(sweep.scores, split)), data


def freeze_data(
    sweep: Sweep, *, baseline: str | None = None, split: str | None = None, panel: str | None = "auto"
) -> pd.DataFrame:
    """Mean downstream score (average over tasks, points) per freeze mask x schedule, 95% CI over seeds.

    A run's score is its average over tasks of the mean over fine-tuning seeds; the interval is over runs.
    """
    baseline = baseline or sweep.baseline
    pcol = panel_column(done_runs(sweep.runs), panel)
    keys = arm_keys(pcol)
    u = unit_scores(sweep, split, pcol, "freeze")
    u = u[~u["task"].map(is_average)]
    per_task = u.groupby([*keys, "run_id", "task"], sort=False)["score"].mean().reset_index()
    # only runs scored on every task of their panel, so that cells average the same tasks
    n_tasks = per_task.groupby(pcol)["task"].transform("nunique") if pcol else per_task["task"].nunique()
    per_task = per_task.assign(n_tasks=n_tasks)
    per_run = (
        per_task.groupby([*keys, "run_id"], sort=False)
        .agg(score=("score", "mean"), k=("task", "nunique"), n_tasks=("n_tasks", "first"))
        .reset_index()
    )
    per_run = per_run[per_run["k"] == per_run["n_tasks"]]
    rows = [(*key, *mean_ci(g["score"])) for key, g in per_run.groupby(keys, sort=False)]
    out = pd.DataFrame(rows, columns=[*keys, "mean", "ci_low", "ci_high", "n"])
    return arm_sorted(out, sweep.runs, baseline, pcol)


def plot_freeze(data: pd.DataFrame, *, panel_col: str | None = None, split: str = "test"):
    import seaborn as sns

    names = panels(data, panel_col)
    freezes, schedules = ordered(data["freeze"]), ordered(data["schedule"])
    vmin, vmax = data["mean"].min(), data["mean"].max()
    fig = new_figure(1.6 + (1.0 + 0.95 * len(schedules)) * len(names), 1.1 + 0.42 * len(freezes))
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for j, (ax, p) in enumerate(zip(axes, names)):
        d = in_panel(data, panel_col, p)
        grid = d.pivot(index="freeze", columns="schedule", values="mean").reindex(index=freezes, columns=schedules)
        half = (
            d.assign(h=(d["ci_high"] - d["ci_low"]) / 2)
            .pivot(index="freeze", columns="schedule", values="h")
            .reindex(index=freezes, columns=schedules)
        )
        annot = np.vectorize(
            lambda m, h: "" if np.isnan(m) else f"{m:.1f}" + ("" if np.isnan(h) else f"\n±{h:.1f}"),
            otypes=[object],
        )(grid.to_numpy(), half.to_numpy())
        sns.heatmap(
            grid,
            ax=ax,
            annot=annot,
            fmt="",
            cmap="crest",
            vmin=vmin,
            vmax=vmax,
            linewidths=0.5,
            linecolor="white",
            cbar=j == len(names) - 1,
            annot_kws={"fontsize": 7.5},
            cbar_kws={"label": f"mean score over tasks (points, {split})"},
        )
        ax.set_xlabel("schedule")
        ax.set_ylabel("freeze mask" if j == 0 else "")
        ax.set_title(panel_title(panel_col, p))
        ax.tick_params(axis="x", rotation=0)
        ax.tick_params(axis="y", rotation=0)
    return fig


@styled
def freeze_figure(
    sweep: Sweep, *, baseline: str | None = None, split: str | None = None, panel: str | None = "auto"
):
    """Heatmap of mean downstream score per freeze mask x schedule (cells: mean, ± CI half-width)."""
    baseline = baseline or sweep.baseline
    pcol = panel_column(done_runs(sweep.runs), panel)
    data = freeze_data(sweep, baseline=baseline, split=split, panel=pcol)
    if data.empty:
        raise SpecError("no done run has scores on every task", file=str(sweep.path), key="scores")
    return plot_freeze(data, panel_col=pcol, split=pick_split(sweep.scores, split)), data
