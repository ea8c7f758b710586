"""Figures over the tidy tables of a sweep (runs, scores, layers, curves).

Each figure is `FIGURES[name](sweep, **options) -> (Figure, DataFrame)`: the DataFrame holds exactly what
is drawn (means, 95% CI bounds, counts), so the CSV written next to the image is the figure's data.
`make_figure` loads a sweep folder, draws, and writes PNG (300 dpi) + SVG or PDF + CSV.

Conventions shared by every figure:
- only runs with status "done" are used;
- an arm is a (schedule, freeze) pair; the MLM baseline is schedule == `baseline` (default "mlm") with
  freeze == "none"; colour encodes the schedule, line style / marker the freeze mask;
- intervals are 95% t-intervals over the replicates named in each figure's doc (NaN when n < 2);
- `panel` facets by a runs column ("auto": by "model" when the sweep has several models).
Figures are drawn on `matplotlib.figure.Figure` objects (no pyplot state), so they render with Agg and
also display inline in notebooks.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.config.errors import SpecError
from ablate.plan.freezing import consecutive_runs
from ablate.config.paths import results_root

TABLES = ("runs", "scores", "layers", "curves")
HEAD_WARMUP = "head_warmup"
EMB = -1
DPI = 300


# --- loading ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sweep:
    """The tidy tables of one collected sweep; a table the sweep lacks is None."""
    path: Path
    runs: pd.DataFrame
    scores: pd.DataFrame | None = None
    layers: pd.DataFrame | None = None
    curves: pd.DataFrame | None = None

    @property
    def name(self) -> str:
        return self.path.name

    def require(self, table: str, figure: str) -> pd.DataFrame:
        df = getattr(self, table)
        if df is None or df.empty:
            raise SpecError(f"figure {figure!r} needs the {table} table, which is missing or empty in this sweep",
                            file=str(self.path), key=table)
        return df


def _runs_table(d: Path) -> Path | None:
    return next((p for p in (d / "runs.parquet", d / "runs.csv") if p.is_file()), None)


def list_sweeps(root: str | Path | None = None) -> list[Path]:
    """Collected sweeps under the results root (folders with a runs table), oldest first."""
    root = results_root(root)
    if not root.is_dir():
        return []
    found = [(t.stat().st_mtime, d) for d in root.iterdir() if d.is_dir() and (t := _runs_table(d))]
    return [d for _, d in sorted(found)]


def resolve_sweep(sweep: str | Path | None = None, root: str | Path | None = None) -> Path:
    """A sweep folder from a path or a name under the results root; None: the most recently collected."""
    if sweep is None or str(sweep) == "":
        sweeps = list_sweeps(root)
        if not sweeps:
            raise SpecError("no collected sweep (a folder with runs.parquet or runs.csv) under the results root; "
                            "run `ablate collect` first", key="--sweep", value=str(results_root(root)))
        return sweeps[-1]
    p = Path(sweep).expanduser()
    for cand in (p, results_root(root) / p):
        if cand.is_dir():
            if _runs_table(cand) is None:
                raise SpecError("sweep folder has no tidy tables (runs.parquet / runs.csv); run `ablate collect`",
                                key="--sweep", value=str(cand))
            return cand
    raise SpecError("no such sweep", key="--sweep", value=str(sweep),
                    allowed=", ".join(d.name for d in list_sweeps(root)) or "(none collected)")


def _read_table(d: Path, name: str) -> pd.DataFrame | None:
    if (d / f"{name}.parquet").is_file():
        return pd.read_parquet(d / f"{name}.parquet")
    if (d / f"{name}.csv").is_file():
        # only empty cells and "nan" are missing: pandas' default list would turn a freeze mask named
        # "None" or "NA" into NaN (empty `frozen` / `model_dir` cells become "" again in load_sweep)
        return pd.read_csv(d / f"{name}.csv", keep_default_na=False, na_values=["", "nan", "NaN"])
    return None


def load_sweep(sweep: str | Path | None = None) -> Sweep:
    path = resolve_sweep(sweep)
    tables = {name: _read_table(path, name) for name in TABLES}
    runs = tables.pop("runs")
    for col in ("frozen", "model_dir"):
        if col in runs.columns:
            runs[col] = runs[col].astype(object).fillna("").astype(str)
    for col in ("schedule", "freeze"):
        if col not in runs.columns:
            raise SpecError(f"runs table has no {col!r} column", file=str(path), key="runs")
        runs[col] = runs[col].astype(str)
    return Sweep(path=path, runs=runs, **tables)


# --- small pure helpers ----------------------------------------------------------------------------------

def mean_ci(values) -> tuple[float, float, float, int]:
    """Mean and 95% t-interval of the finite values; bounds are NaN with fewer than two."""
    from scipy import stats

    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    n = len(v)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    m = float(v.mean())
    if n < 2:
        return m, math.nan, math.nan, n
    h = float(stats.t.ppf(0.975, n - 1) * v.std(ddof=1) / math.sqrt(n))
    return m, m - h, m + h, n


def welch_ci(a, b) -> tuple[float, float, float]:
    """Difference of means a - b with a 95% Welch interval (NaN bounds when either side has n < 2)."""
    from scipy import stats

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return d, math.nan, math.nan
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return d, d, d
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    h = float(stats.t.ppf(0.975, df) * se)
    return d, d - h, d + h


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_frozen(frozen: str) -> dict[str, list[int]]:
    """"clm:0-1,4-5;mlm_decay:emb" -> {"clm": [0, 1, 4, 5], "mlm_decay": [-1]}; head_warmup is left out."""
    out: dict[str, list[int]] = {}
    for entry in filter(None, (e.strip() for e in str(frozen or "").split(";"))):
        phase, sep, ranges = entry.partition(":")
        if not sep:
            raise SpecError("bad frozen entry, expected 'phase:ranges'", key="runs.frozen", value=entry)
        if phase == HEAD_WARMUP:
            continue
        idx: set[int] = set()
        for part in filter(None, (p.strip() for p in ranges.split(","))):
            if part == "emb":
                idx.add(EMB)
            elif m := _RANGE.match(part):
                lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
                idx.update(range(lo, hi + 1))
            else:
                raise SpecError("bad layer range in frozen entry", key="runs.frozen", value=entry,
                                allowed="emb, N or N-M, comma-separated")
        out[phase] = sorted(idx)
    return out


def done_runs(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "done"] if "status" in runs.columns else runs


def arm_label(schedule: str, freeze: str) -> str:
    return schedule if freeze == "none" else f"{schedule}, freeze {freeze}"


def _ordered(values: Sequence, first=None) -> list:
    seen = list(dict.fromkeys(values))
    if first is not None and first in seen:
        seen.remove(first)
        seen.insert(0, first)
    return seen


def _arm_sorted(df: pd.DataFrame, runs: pd.DataFrame, baseline: str, pcol: str | None,
                then: Sequence[str] = ()) -> pd.DataFrame:
    """Rows ordered by panel, then arms as the grid lists them (baseline schedule and freeze "none" first)."""
    schedules = _ordered([*runs["schedule"], *df["schedule"]], first=baseline)
    freezes = _ordered([*runs["freeze"], *df["freeze"]], first="none")
    keyed = df.assign(_s=df["schedule"].map(schedules.index), _f=df["freeze"].map(freezes.index))
    by = [*([pcol] if pcol else []), "_s", "_f", *then]
    return keyed.sort_values(by, kind="stable").drop(columns=["_s", "_f"]).reset_index(drop=True)


# Columns of the scores / layers / curves tables: a runs column of the same name (e.g. an "lr" grid axis)
# cannot be a panel, since the join would clash with them.
_MEASURE_COLUMNS = {"run_id", "task", "language", "finetune_seed", "split", "metric", "value", "epoch", "primary",
                    "wall_time_s", "phase", "layer", "measure", "step", "tokens", "loss", "lr"}


def _panel_column(runs: pd.DataFrame, panel: str | None) -> str | None:
    if panel in (None, "", "none"):
        return None
    if panel == "auto":
        return "model" if "model" in runs.columns and runs["model"].nunique() > 1 else None
    allowed = [c for c in runs.columns if c not in _MEASURE_COLUMNS]
    if panel not in allowed:
        raise SpecError("panel must be a column of the runs table that the other tables do not have",
                        key="panel", value=panel, allowed="auto, none, " + ", ".join(map(str, allowed)))
    return panel


def _keys(pcol: str | None) -> list[str]:
    return ([pcol] if pcol else []) + ["schedule", "freeze"]


def _panels(data: pd.DataFrame, pcol: str | None) -> list:
    return _ordered(data[pcol]) if pcol else [None]


def _in_panel(data: pd.DataFrame, pcol: str | None, value) -> pd.DataFrame:
    return data[data[pcol] == value] if pcol else data


def _panel_title(pcol, value) -> str:
    return f"{pcol} = {value}" if pcol else ""


# --- style -----------------------------------------------------------------------------------------------

_FREEZE_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1.5)), "v"), ((0, (1, 1)), "P"),
                  ((0, (3, 1, 1, 1, 1, 1)), "X"), ((0, (8, 2)), "*")]


def _palette(schedules: Sequence[str]) -> dict[str, tuple]:
    import seaborn as sns
    colors = sns.color_palette("colorblind", max(len(schedules), 1))
    return {s: colors[i % len(colors)] for i, s in enumerate(schedules)}


def _freeze_styles(freezes: Sequence[str]) -> dict[str, tuple]:
    return {f: _FREEZE_STYLES[i % len(_FREEZE_STYLES)] for i, f in enumerate(freezes)}


def _arm_styles(data: pd.DataFrame, baseline: str) -> tuple[dict, dict]:
    """Colour per schedule and (line style, marker) per freeze mask; the baseline and "none" always come first,
    so an arm looks the same in every figure of a sweep, whether or not the baseline is drawn."""
    return (_palette(_ordered([baseline, *data["schedule"]])),
            _freeze_styles(_ordered(["none", *data["freeze"]])))


def style_context():
    """The one visual style: seaborn paper context, ticks style, 300 dpi, TrueType text in vector output."""
    import contextlib

    import matplotlib as mpl
    import seaborn as sns

    stack = contextlib.ExitStack()
    stack.enter_context(sns.axes_style("ticks"))
    stack.enter_context(sns.plotting_context("paper", font_scale=1.1))
    stack.enter_context(mpl.rc_context({"savefig.dpi": DPI, "figure.dpi": 100, "svg.fonttype": "none",
                                        "pdf.fonttype": 42, "legend.frameon": False,
                                        "axes.spines.top": False, "axes.spines.right": False}))
    return stack


def _styled(fn: Callable) -> Callable:
    """Draw a figure inside the shared style, whether called by make_figure or from a notebook."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with style_context():
            return fn(*args, **kwargs)
    return wrapper


def _figure(width: float, height: float):
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), layout="constrained")


def _legend(fig, axes, loc: str = "outside right upper", **kw):
    """One figure legend for all panels (a panel may lack some arms)."""
    entries: dict[str, object] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, h)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc=loc, **kw)


def _layer_ticks(ax, layers: Sequence[int]):
    lo, hi = min(layers), max(layers)
    step = max(1, math.ceil((hi - lo + 1) / 12))
    ticks = [EMB] if lo == EMB else []
    # labelled ticks every `step` layers; with step > 1, "0" would crowd "emb", so numbering starts at step
    ticks += list(range(0 if step == 1 or lo != EMB else step, hi + 1, step))
    ax.set_xticks(ticks, ["emb" if t == EMB else str(t) for t in ticks])
    ax.set_xticks(range(lo, hi + 1), minor=True)
    ax.set_xlim(lo - 0.5, hi + 0.5)


# --- layers ----------------------------------------------------------------------------------------------

MEASURE_LABELS = {
    "cka_vs_base": "1 − CKA vs base model",
    "weight_rel_change": "relative weight change\n‖W − W₀‖ / ‖W₀‖",
    "grad_norm": "gradient norm (L2)",
    "cka_ratio_vs_mlm": "1 − CKA vs MLM, in units of\nMLM seed-to-seed (1 − CKA)",
}
# CKA is a similarity; the figure shows how far a layer moved, so it plots 1 - CKA.
_ONE_MINUS = {"cka_vs_base"}


def phase_positions(layers: pd.DataFrame, curves: pd.DataFrame | None = None) -> pd.DataFrame:
    """(run_id, phase, position): each run's measured phases numbered 1, 2, ... in training order.

    Order: first logged step in `curves` (phases without curves, like the cross-run "final", go last),
    ties and runs without curves by first appearance in the `layers` table.
    """
    pos = layers[["run_id", "phase"]].drop_duplicates().reset_index(drop=True)
    pos["_row"] = np.arange(len(pos))
    first_step = math.inf
    if curves is not None and not curves.empty:
        steps = curves.groupby(["run_id", "phase"], sort=False)["step"].min().rename("_step").reset_index()
        pos = pos.merge(steps, on=["run_id", "phase"], how="left")
        first_step = pos["_step"].fillna(math.inf)
    pos["_step"] = first_step
    pos = pos.sort_values(["run_id", "_step", "_row"], kind="stable")
    pos["position"] = pos.groupby("run_id").cumcount() + 1
    return pos.sort_values("_row")[["run_id", "phase", "position"]].reset_index(drop=True)


def ordered_phases(sweep: Sweep) -> list[str]:
    """The phases of the layers table in training order (mean position of the phase within its runs)."""
    pos = phase_positions(sweep.require("layers", "layers"), sweep.curves)
    return pos.groupby("phase", sort=False)["position"].mean().sort_values(kind="stable").index.tolist()


def layer_data(sweep: Sweep, *, measure: str = "cka_vs_base", phase: str = "last", baseline: str = "mlm",
               panel: str | None = "auto") -> pd.DataFrame:
    """Per arm and layer: mean over seeds of the plotted measure at the end of `phase`, with a 95% CI.

    phase "last" takes each run's last measured phase. `frozen_in` names the phases (head warm-up aside)
    in which the arm froze that layer.
    """
    table = sweep.require("layers", "layers")
    runs = done_runs(sweep.runs)
    measures = _ordered(table["measure"])
    if measure not in measures:
        raise SpecError("measure not in the sweep's layers table", key="measure", value=measure,
                        allowed=", ".join(measures))
    table = table[(table["measure"] == measure) & table["run_id"].isin(runs["run_id"])]
    if phase == "last":
        pos = phase_positions(table, sweep.curves)
        last = pos.loc[pos.groupby("run_id")["position"].idxmax(), ["run_id", "phase"]]
        table = table.merge(last, on=["run_id", "phase"])
    else:
        phases = _ordered(table["phase"])
        if phase not in phases:
            raise SpecError(f"phase not measured for {measure}", key="phase", value=phase,
                            allowed="last, " + ", ".join(phases))
        table = table[table["phase"] == phase]
    if table.empty:
        raise SpecError(f"no done runs with layer measure {measure!r}", file=str(sweep.path), key="layers")
    pcol = _panel_column(runs, panel)
    df = table.merge(runs[["run_id", *_keys(pcol), *(["frozen"] if "frozen" in runs.columns else [])]],
                     on="run_id")
    df["y"] = 1.0 - df["value"] if measure in _ONE_MINUS else df["value"]

    rows = []
    for key, g in df.groupby(_keys(pcol), sort=False):
        frozen: dict[int, set[str]] = {}
        for s in g.get("frozen", pd.Series(dtype=str)).drop_duplicates():
            for ph, idx in parse_frozen(s).items():
                for layer in idx:
                    frozen.setdefault(layer, set()).add(ph)
        for layer, gl in g.groupby("layer"):
            m, lo, hi, n = mean_ci(gl["y"])
            rows.append((*key, arm_label(key[-2], key[-1]), int(layer), ";".join(_ordered(gl["phase"])),
                         ("1 - " if measure in _ONE_MINUS else "") + measure, m, lo, hi, n,
                         ";".join(sorted(frozen.get(int(layer), ())))))
    out = pd.DataFrame(rows, columns=[*_keys(pcol), "arm", "layer", "phase", "measure", "mean", "ci_low",
                                      "ci_high", "n", "frozen_in"])
    return _arm_sorted(out, runs, baseline, pcol, then=["layer"])


def _frozen_rows(data: pd.DataFrame) -> list[tuple[str, str, str, list[int]]]:
    """(schedule, freeze, phase, layers) for every arm and phase that froze something."""
    rows = []
    for (s, f), g in data.groupby(["schedule", "freeze"], sort=False):
        by_phase: dict[str, list[int]] = {}
        for layer, phases in zip(g["layer"], g["frozen_in"]):
            for ph in filter(None, phases.split(";")):
                by_phase.setdefault(ph, []).append(int(layer))
        rows += [(s, f, ph, sorted(ls)) for ph, ls in by_phase.items()]
    return rows


def plot_layers(data: pd.DataFrame, *, panel_col: str | None = None, baseline: str = "mlm", logy: bool = False):
    measure = data["measure"].iloc[0]
    base_measure = measure.removeprefix("1 - ")
    panels = _panels(data, panel_col)
    colors, styles = _arm_styles(data, baseline)
    strip = [_frozen_rows(_in_panel(data, panel_col, p)) for p in panels]
    n_strip = max(len(s) for s in strip)
    strip_h = 0.35 + 0.2 * n_strip
    fig = _figure(2.9 + 3.1 * len(panels), 2.6 + (strip_h if n_strip else 0))
    gs = fig.add_gridspec(2 if n_strip else 1, len(panels), height_ratios=[2.6, strip_h] if n_strip else None)
    for j, p in enumerate(panels):
        d = _in_panel(data, panel_col, p)
        ax = fig.add_subplot(gs[0, j])
        for (s, f), g in d.groupby(["schedule", "freeze"], sort=False):
            ls, marker = styles[f]
            ax.fill_between(g["layer"], g["ci_low"], g["ci_high"], color=colors[s], alpha=0.18, lw=0)
            ax.plot(g["layer"], g["mean"], color=colors[s], ls=ls, marker=marker, ms=3.5,
                    label=arm_label(s, f))
        if base_measure == "cka_ratio_vs_mlm":
            ax.axhline(1.0, color="0.4", lw=0.8, ls=":", label="_seed noise")
        if logy:
            ax.set_yscale("log")
        ax.set_ylabel(MEASURE_LABELS.get(base_measure, measure) if j == 0 else "")
        phases = _ordered(";".join(d["phase"]).split(";"))
        when = "final models" if phases == ["final"] else f"end of phase {' / '.join(phases)}"
        ax.set_title("\n".join(filter(None, [_panel_title(panel_col, p), when])))
        _layer_ticks(ax, d["layer"].tolist())
        ax.grid(axis="y", lw=0.4, alpha=0.5)
        if n_strip:
            ax.tick_params(labelbottom=False)
            sx = fig.add_subplot(gs[1, j], sharex=ax)
            for i, (s, f, ph, idx) in enumerate(strip[j]):
                for lo, hi in consecutive_runs(idx):
                    sx.barh(i, hi - lo + 0.8, left=lo - 0.4, height=0.7, color=colors[s], alpha=0.45,
                            edgecolor=colors[s], lw=0.8)
            same_rows = j > 0 and [r[:3] for r in strip[j]] == [r[:3] for r in strip[0]]
            sx.set_yticks(range(len(strip[j])), [] if same_rows else [f"{f} · {ph}" for _, f, ph, _ in strip[j]],
                          fontsize=7.5)
            sx.set_ylim(n_strip - 0.5, -0.5)
            sx.tick_params(axis="y", length=0)
            sx.spines["left"].set_visible(False)
            sx.set_xlabel("layer (emb = embeddings output)")
            sx.set_title("frozen layers (mask · phase)", loc="left", fontsize=7.5, color="0.3")
        else:
            ax.set_xlabel("layer (emb = embeddings output)")
    _legend(fig, [a for a in fig.axes if a.get_lines()])
    return fig


@_styled
def layers(sweep: Sweep, *, measure: str = "cka_vs_base", phase: str = "last", baseline: str = "mlm",
           panel: str | None = "auto", logy: bool = False):
    """How far each layer moved, per arm: 1 - CKA vs the base model (or another layer measure)."""
    pcol = _panel_column(done_runs(sweep.runs), panel)
    data = layer_data(sweep, measure=measure, phase=phase, baseline=baseline, panel=pcol)
    return plot_layers(data, panel_col=pcol, baseline=baseline, logy=logy), data


# --- downstream scores -----------------------------------------------------------------------------------

def _pick_split(scores: pd.DataFrame, split: str | None) -> str:
    splits = _ordered(scores["split"])
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
    split = _pick_split(scores, split)
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
    return out.reset_index(drop=True)


def _unit_scores(sweep: Sweep, split: str | None, pcol: str | None, figure: str) -> pd.DataFrame:
    """Scores per (run, finetune seed) and task, plus task "average" over a panel's tasks (complete units only)."""
    ps = primary_scores(sweep, split=split, figure=figure)
    runs = done_runs(sweep.runs)
    df = ps.merge(runs[["run_id", *_keys(pcol), "seed"]], on="run_id")
    if df.empty:
        raise SpecError("no scores for done runs", file=str(sweep.path), key="scores")
    parts = [df]
    for p in _panels(df, pcol):
        d = _in_panel(df, pcol, p)
        tasks = d["task"].nunique()
        unit = [*_keys(pcol), "run_id", "seed", "finetune_seed"]
        avg = d.groupby(unit, sort=False).agg(score=("score", "mean"), k=("task", "nunique")).reset_index()
        avg = avg[avg["k"] == tasks].drop(columns="k")
        avg["task"] = "average"
        parts.append(avg)
    return pd.concat(parts, ignore_index=True)


def delta_data(sweep: Sweep, *, baseline: str = "mlm", split: str | None = None,
               panel: str | None = "auto") -> pd.DataFrame:
    """Per arm and task (and "average" over tasks): arm minus MLM baseline in points, with a 95% CI.

    Replicates are (pretraining seed, fine-tuning seed) units. Arm and baseline units sharing both seeds
    are paired (the twins see the same token stream and fine-tuning seed): the CI is a t-interval of the
    paired differences. With no shared units, a Welch interval on the unpaired scores.
    """
    pcol = _panel_column(done_runs(sweep.runs), panel)
    u = _unit_scores(sweep, split, pcol, "deltas")
    is_base = (u["schedule"] == baseline) & (u["freeze"] == "none")
    if not is_base.any():
        have = ", ".join(sorted({arm_label(s, f) for s, f in zip(u["schedule"], u["freeze"])}))
        raise SpecError(f"figure 'deltas' needs MLM-baseline runs (schedule {baseline!r}, freeze 'none') with "
                        f"scores; the sweep's scored arms are: {have}", file=str(sweep.path), key="baseline",
                        value=baseline)
    if is_base.all():
        raise SpecError("figure 'deltas' needs at least one arm besides the MLM baseline", file=str(sweep.path))
    tasks = _ordered(u.loc[u["task"] != "average", "task"]) + ["average"]
    rows = []
    for p in _panels(u, pcol):
        up = _in_panel(u, pcol, p)
        base = up[is_base.loc[up.index]]
        if base.empty:
            continue
        arms = up[~is_base.loc[up.index]]
        for (s, f) in dict.fromkeys(zip(arms["schedule"], arms["freeze"])):
            a_all = arms[(arms["schedule"] == s) & (arms["freeze"] == f)]
            for task in tasks:
                a = a_all[a_all["task"] == task].groupby(["seed", "finetune_seed"])["score"].mean()
                b = base[base["task"] == task].groupby(["seed", "finetune_seed"])["score"].mean()
                if a.empty or b.empty:
                    continue
                shared = a.index.intersection(b.index)
                if len(shared):
                    d, lo, hi, n = mean_ci(a[shared] - b[shared])
                    method = "paired"
                else:
                    (d, lo, hi), n, method = welch_ci(a, b), 0, "welch"
                rows.append(((p,) if pcol else ()) + (s, f, arm_label(s, f), task, d, lo, hi, n, len(a), len(b),
                                                      method, float(a.mean()), float(b.mean())))
    out = pd.DataFrame(rows, columns=[*_keys(pcol), "arm", "task", "delta", "ci_low", "ci_high", "n_pairs",
                                      "n_arm", "n_baseline", "ci_method", "arm_mean", "baseline_mean"])
    return _arm_sorted(out, sweep.runs, baseline, pcol)  # stable: tasks keep their order within an arm


def score_summary(sweep: Sweep, *, baseline: str = "mlm", split: str | None = None) -> pd.DataFrame:
    """Per arm and task: mean and standard deviation of the primary metric (points) over all
    (pretraining seed, fine-tuning seed) units, their count, and the difference from the MLM baseline."""
    u = _unit_scores(sweep, split, None, "summary")
    out = (u.groupby(["schedule", "freeze", "task"], sort=False)["score"]
           .agg(mean="mean", std="std", n="count").reset_index())
    base = out[(out["schedule"] == baseline) & (out["freeze"] == "none")].set_index("task")["mean"]
    out["delta_pp"] = out["mean"] - out["task"].map(base)
    return out.round(2)


def plot_deltas(data: pd.DataFrame, *, panel_col: str | None = None, baseline: str = "mlm", split: str = "test"):
    panels = _panels(data, panel_col)
    tasks = _ordered(data.loc[data["task"] != "average", "task"]) + ["average"]
    arms = list(dict.fromkeys(zip(data["schedule"], data["freeze"])))
    colors, styles = _arm_styles(data, baseline)
    x = {t: i for i, t in enumerate(tasks[:-1])} | {"average": len(tasks) - 0.6}
    width = min(0.8, 0.18 * len(arms))
    offsets = np.linspace(-width / 2, width / 2, len(arms)) if len(arms) > 1 else [0.0]
    fig = _figure(min(7.2, max(3.6, 1.2 + len(tasks) * max(0.5, 0.2 * len(arms)))), 1.3 + 2.3 * len(panels))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    long_names = max(len(t) for t in tasks) > 6 or len(tasks) > 6
    for ax, p in zip(axes, panels):
        d = _in_panel(data, panel_col, p)
        ax.axhline(0.0, color="0.3", lw=0.8)
        ax.axvline(len(tasks) - 1.3, color="0.7", lw=0.6, ls=":")
        for off, (s, f) in zip(offsets, arms):
            g = d[(d["schedule"] == s) & (d["freeze"] == f)]
            if g.empty:
                continue
            xs = np.array([x[t] for t in g["task"]]) + off
            yerr = np.vstack([g["delta"] - g["ci_low"], g["ci_high"] - g["delta"]])
            ax.errorbar(xs, g["delta"], yerr=yerr, fmt=styles[f][1], color=colors[s], ms=4, capsize=2,
                        elinewidth=1, lw=0, label=arm_label(s, f))
        ax.set_ylabel(f"Δ vs {baseline} baseline\n(points)")
        ax.set_title(_panel_title(panel_col, p))
        ax.grid(axis="y", lw=0.4, alpha=0.5)
    axes[-1].set_xticks([x[t] for t in tasks], tasks, rotation=30 if long_names else 0,
                        ha="right" if long_names else "center")
    axes[-1].set_xlabel(f"task (primary metric, {split} split)")
    _legend(fig, axes, loc="outside upper center", ncols=min(len(arms), 3))
    return fig


@_styled
def deltas(sweep: Sweep, *, baseline: str = "mlm", split: str | None = None, panel: str | None = "auto"):
    """Downstream difference from the MLM baseline per task and on average, per arm, 95% CIs."""
    pcol = _panel_column(done_runs(sweep.runs), panel)
    data = delta_data(sweep, baseline=baseline, split=split, panel=pcol)
    if data.empty:
        raise SpecError("no arm shares a panel with an MLM baseline that has scores", file=str(sweep.path))
    return plot_deltas(data, panel_col=pcol, baseline=baseline, split=_pick_split(sweep.scores, split)), data


def freeze_data(sweep: Sweep, *, baseline: str = "mlm", split: str | None = None,
                panel: str | None = "auto") -> pd.DataFrame:
    """Mean downstream score (average over tasks, points) per freeze mask x schedule, 95% CI over seeds.

    A run's score is its average over tasks of the mean over fine-tuning seeds; the interval is over runs.
    """
    pcol = _panel_column(done_runs(sweep.runs), panel)
    u = _unit_scores(sweep, split, pcol, "freeze")
    u = u[u["task"] != "average"]
    per_task = u.groupby([*_keys(pcol), "run_id", "task"], sort=False)["score"].mean().reset_index()
    # only runs scored on every task of their panel, so that cells average the same tasks
    n_tasks = per_task.groupby(pcol)["task"].transform("nunique") if pcol else per_task["task"].nunique()
    per_task = per_task.assign(n_tasks=n_tasks)
    per_run = per_task.groupby([*_keys(pcol), "run_id"], sort=False).agg(
        score=("score", "mean"), k=("task", "nunique"), n_tasks=("n_tasks", "first")).reset_index()
    per_run = per_run[per_run["k"] == per_run["n_tasks"]]
    rows = []
    for key, g in per_run.groupby(_keys(pcol), sort=False):
        m, lo, hi, n = mean_ci(g["score"])
        rows.append((*key, m, lo, hi, n))
    out = pd.DataFrame(rows, columns=[*_keys(pcol), "mean", "ci_low", "ci_high", "n"])
    return _arm_sorted(out, sweep.runs, baseline, pcol)


def plot_freeze(data: pd.DataFrame, *, panel_col: str | None = None, split: str = "test"):
    import seaborn as sns

    panels = _panels(data, panel_col)
    freezes, schedules = _ordered(data["freeze"]), _ordered(data["schedule"])
    vmin, vmax = data["mean"].min(), data["mean"].max()
    fig = _figure(1.6 + (1.0 + 0.95 * len(schedules)) * len(panels), 1.1 + 0.42 * len(freezes))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for j, (ax, p) in enumerate(zip(axes, panels)):
        d = _in_panel(data, panel_col, p)
        grid = d.pivot(index="freeze", columns="schedule", values="mean").reindex(index=freezes, columns=schedules)
        half = (d.assign(h=(d["ci_high"] - d["ci_low"]) / 2)
                .pivot(index="freeze", columns="schedule", values="h").reindex(index=freezes, columns=schedules))
        annot = np.vectorize(lambda m, h: "" if np.isnan(m) else f"{m:.1f}" + ("" if np.isnan(h) else f"\n±{h:.1f}"),
                             otypes=[object])(grid.to_numpy(), half.to_numpy())
        sns.heatmap(grid, ax=ax, annot=annot, fmt="", cmap="crest", vmin=vmin, vmax=vmax, linewidths=0.5,
                    linecolor="white", cbar=j == len(panels) - 1, annot_kws={"fontsize": 7.5},
                    cbar_kws={"label": f"mean score over tasks (points, {split})"})
        ax.set_xlabel("schedule")
        ax.set_ylabel("freeze mask" if j == 0 else "")
        ax.set_title(_panel_title(panel_col, p))
        ax.tick_params(axis="x", rotation=0)
        ax.tick_params(axis="y", rotation=0)
    return fig


@_styled
def freeze(sweep: Sweep, *, baseline: str = "mlm", split: str | None = None, panel: str | None = "auto"):
    """Heatmap of mean downstream score per freeze mask x schedule (cells: mean, ± CI half-width)."""
    pcol = _panel_column(done_runs(sweep.runs), panel)
    data = freeze_data(sweep, baseline=baseline, split=split, panel=pcol)
    if data.empty:
        raise SpecError("no done run has scores on every task", file=str(sweep.path), key="scores")
    return plot_freeze(data, panel_col=pcol, split=_pick_split(sweep.scores, split)), data


# --- training curves -------------------------------------------------------------------------------------

def curve_data(sweep: Sweep, *, baseline: str = "mlm", smooth: int = 1, panel: str | None = "auto") -> pd.DataFrame:
    """Loss and LR per arm, phase and step, averaged over seeds (loss with a 95% CI).

    `smooth` > 1 first takes a trailing rolling mean of the loss over that many logged points within each
    run and phase.
    """
    curves = sweep.require("curves", "curves")
    if smooth < 1:
        raise SpecError("smooth must be at least 1 (logged points in the rolling mean)", key="smooth", value=smooth)
    runs = done_runs(sweep.runs)
    pcol = _panel_column(runs, panel)
    df = curves.merge(runs[["run_id", *_keys(pcol)]], on="run_id")
    if df.empty:
        raise SpecError("no curves for done runs", file=str(sweep.path), key="curves")
    df = df.sort_values(["run_id", "step"], kind="stable")
    if smooth > 1:
        df["loss"] = df.groupby(["run_id", "phase"], sort=False)["loss"].transform(
            lambda s: s.rolling(smooth, min_periods=1).mean())
    rows = []
    for key, g in df.groupby([*_keys(pcol), "phase", "step"], sort=False):
        m, lo, hi, n = mean_ci(g["loss"])
        rows.append((*key, float(g["tokens"].mean()), m, lo, hi, float(g["lr"].mean()), n))
    out = pd.DataFrame(rows, columns=[*_keys(pcol), "phase", "step", "tokens", "loss", "loss_ci_low",
                                      "loss_ci_high", "lr", "n"])
    out.insert(len(_keys(pcol)), "arm", [arm_label(s, f) for s, f in zip(out["schedule"], out["freeze"])])
    return _arm_sorted(out, runs, baseline, pcol, then=["step"])


def _token_unit(max_tokens: float) -> tuple[float, str]:
    for scale, name in ((1e9, "billions"), (1e6, "millions"), (1e3, "thousands")):
        if max_tokens >= 2 * scale:
            return scale, name
    return 1.0, ""


def phase_spans(data: pd.DataFrame) -> list[tuple[str, str, float, float]]:
    """(schedule, phase, start, end) in tokens: a phase ends at its last logged point, the next starts there."""
    spans = []
    for s, g in data.groupby("schedule", sort=False):
        start = 0.0
        for ph, end in g.groupby("phase", sort=False)["tokens"].max().sort_values(kind="stable").items():
            spans.append((s, str(ph), start, float(end)))
            start = float(end)
    return spans


def _timeline(ax, spans, colors, scale: float):
    """One row per schedule: its phases as bars along the token axis, named where the name fits."""
    schedules = _ordered([s for s, *_ in spans])
    total = max(e for *_, e in spans) / scale or 1.0
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    for i, s in enumerate(schedules):
        for k, (_, ph, lo, hi) in enumerate(x for x in spans if x[0] == s):
            lo, hi = lo / scale, hi / scale
            ax.barh(i, hi - lo, left=lo, height=0.75, color=colors[s], alpha=0.25 if k % 2 else 0.45, lw=0)
            if (hi - lo) / total * width_in > 0.06 * len(ph) + 0.05:  # ~7 pt characters
                ax.text((lo + hi) / 2, i, ph, ha="center", va="center", fontsize=7, color="0.15")
    ax.set_yticks(range(len(schedules)), schedules, fontsize=7.5)
    ax.set_ylim(len(schedules) - 0.5, -0.5)
    ax.tick_params(axis="both", length=0, labelbottom=False)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title("phases", loc="left", fontsize=7.5, color="0.3")


def plot_curves(data: pd.DataFrame, *, panel_col: str | None = None, baseline: str = "mlm"):
    from matplotlib.ticker import ScalarFormatter

    panels = _panels(data, panel_col)
    colors, styles = _arm_styles(data, baseline)
    scale, unit = _token_unit(float(data["tokens"].max()))
    n_sched = data["schedule"].nunique()
    strip_h = 0.3 + 0.17 * n_sched
    fig = _figure(2.9 + 3.3 * len(panels), 4.2 + strip_h)
    axes = fig.subplots(3, len(panels), sharex="col", squeeze=False,
                        gridspec_kw={"height_ratios": [strip_h, 2.1, 2.1]})
    for j, p in enumerate(panels):
        d = _in_panel(data, panel_col, p)
        ax_ph, ax_loss, ax_lr = axes[:, j]
        for (s, f), g in d.groupby(["schedule", "freeze"], sort=False):
            ls = styles[f][0]
            for k, (_, gp) in enumerate(g.groupby("phase", sort=False)):
                x = gp["tokens"] / scale
                label = arm_label(s, f) if k == 0 else "_" + arm_label(s, f)
                ax_loss.fill_between(x, gp["loss_ci_low"], gp["loss_ci_high"], color=colors[s], alpha=0.18, lw=0)
                ax_loss.plot(x, gp["loss"], color=colors[s], ls=ls, lw=1.1, label=label)
                ax_lr.plot(x, gp["lr"], color=colors[s], ls=ls, lw=1.1, label=label)
        spans = phase_spans(d)
        _timeline(ax_ph, spans, colors, scale)
        ends = sorted({e for *_, e in spans})[:-1]
        for ax in (ax_loss, ax_lr):
            for x0 in ends:
                ax.axvline(x0 / scale, color="0.75", lw=0.6, ls=":", zorder=0)
            ax.grid(axis="y", lw=0.4, alpha=0.5)
        ax_ph.set_title(_panel_title(panel_col, p))
        ax_loss.set_ylabel("training loss\n(nats/token)" if j == 0 else "")
        ax_lr.set_ylabel("learning rate" if j == 0 else "")
        fmt = ScalarFormatter(useMathText=True)
        fmt.set_powerlimits((-2, 3))
        ax_lr.yaxis.set_major_formatter(fmt)
        ax_lr.set_ylim(bottom=0)
        ax_lr.set_xlabel(f"tokens seen ({unit})" if unit else "tokens seen")
        ax_lr.set_xlim(left=0)
    _legend(fig, axes[1, :])
    return fig


@_styled
def curves(sweep: Sweep, *, baseline: str = "mlm", smooth: int = 1, panel: str | None = "auto"):
    """Training loss (top) and learning rate (bottom) against tokens seen, per arm; phase starts marked."""
    pcol = _panel_column(done_runs(sweep.runs), panel)
    data = curve_data(sweep, baseline=baseline, smooth=smooth, panel=pcol)
    return plot_curves(data, panel_col=pcol, baseline=baseline), data


# --- registry and output ---------------------------------------------------------------------------------

def tune(sweep: Sweep, *, study: str = "", storage: str = ""):
    """Optimisation history and parameter importances of the Optuna study behind a tune's folder."""
    from ablate.tune.figure import tune_figure

    return tune_figure(sweep, study=study, storage=storage)


FIGURES: dict[str, Callable] = {"layers": layers, "deltas": deltas, "curves": curves, "freeze": freeze, "tune": tune}


def _coerce_options(name: str, fn: Callable, options: dict) -> dict:
    """Check option names against the figure's keywords; convert CLI strings to the default's type."""
    params = {k: p for k, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}
    out = {}
    for key, value in options.items():
        if key not in params:
            raise SpecError(f"unknown option for figure {name!r}", key=key, value=value,
                            allowed=", ".join(params) or "(none)")
        default = params[key].default
        if isinstance(value, str) and isinstance(default, (bool, int, float)) and not isinstance(default, str):
            try:
                if isinstance(default, bool):
                    if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                        raise ValueError(value)
                    value = value.lower() in ("true", "1", "yes")
                else:
                    value = type(default)(value)
            except ValueError:
                raise SpecError(f"option of figure {name!r} has the wrong type", key=key, value=value,
                                allowed=type(default).__name__) from None
        out[key] = value
    return out


def _output_stem(name: str, sweep_dir: Path, out: str | Path | None) -> tuple[Path, str]:
    if out is None:
        return sweep_dir / "figures" / name, "svg"
    out = Path(out).expanduser()
    if out.is_dir() or not out.suffix:
        return out / name, "svg"
    if out.suffix.lower() not in (".png", ".svg", ".pdf", ".csv"):
        raise SpecError("figure output must be a folder or a .png/.svg/.pdf/.csv path", key="--out",
                        value=str(out))
    return out.with_suffix(""), "pdf" if out.suffix.lower() == ".pdf" else "svg"


def save_figure(fig, data: pd.DataFrame, stem: Path, vector: str = "svg") -> dict[str, Path]:
    """Write stem.png (300 dpi), stem.svg|pdf and stem.csv (the plotted data); return their paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = {"png": stem.with_suffix(".png"), vector: stem.with_suffix(f".{vector}"), "csv": stem.with_suffix(".csv")}
    with style_context():
        fig.savefig(paths["png"], dpi=DPI, bbox_inches="tight")
        fig.savefig(paths[vector], bbox_inches="tight")
    data.to_csv(paths["csv"], index=False)
    return paths


def make_figure(name: str, sweep_dir: str | Path | None = None, out: str | Path | None = None,
                **options) -> dict[str, Path]:
    """Draw figure `name` for a sweep (None: the most recent) and write PNG, SVG/PDF and CSV.

    `out`: a folder (files named after the figure) or a file path whose suffix picks PDF over SVG;
    default <sweep>/figures/. Returns {"png": path, "svg"|"pdf": path, "csv": path}.
    """
    if name not in FIGURES:
        raise SpecError("unknown figure", key="--figure", value=name, allowed=", ".join(FIGURES))
    fn = FIGURES[name]
    options = _coerce_options(name, fn, options)
    sweep = load_sweep(sweep_dir)
    stem, vector = _output_stem(name, sweep.path, out)
    fig, data = fn(sweep, **options)
    return save_figure(fig, data, stem, vector)
