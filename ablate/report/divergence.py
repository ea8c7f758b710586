"""Divergence between arms, from the `pairs` table (`ablate collect --pairs`; the pairing rule is
ablate.analysis.pairs'): the `divergence` figure (1 - CKA per layer between each arm and its MLM twin, with
the MLM seed-to-seed noise band, one panel per phase end), the `regions` figure (that divergence per
region, low / mid / high thirds and all blocks, at each phase end: does it survive the decay?), the whole
model's divergence per pair kind and phase end (model_summary; drawn by ablate.report.persistence) and the
`divergence` table (the region summaries and the whole model's rows, region "model").

Intervals are 95% t-intervals over pairs, i.e. over seeds (one twin pair per seed); the whole model's rows
also carry the standard deviation over seeds (ddof 0), the paper's "+-" (docs/divergence.md).

May import: config, analysis, report.
"""

from __future__ import annotations

import pandas as pd

import numpy as np

from ablate.analysis.pairs import MODEL_MEASURE, NOISE, TWIN, region_values
from ablate.config.errors import SpecError
from ablate.report.arms import arm_label, done_runs, ordered
from ablate.report.stats import mean_ci
from ablate.report.style import arm_styles, figure_legend, layer_ticks, new_figure, styled
from ablate.report.sweep import Sweep

MEASURES = {
    "cka": "1 − CKA vs MLM twin",
    "cka_ratio": "1 − CKA vs MLM twin, in units of\nMLM seed-to-seed (1 − CKA)",
}
NOISE_ARM = "MLM seed noise"
REGIONS = ("low", "mid", "high", "all")
styles_list = ("-", "--", ":", "-.")  # line styles of the seed-noise bands (one per baseline schedule)


def _pairs(sweep: Sweep, measure: str) -> pd.DataFrame:
    if measure not in MEASURES:
        raise SpecError("unknown divergence measure", key="measure", value=measure, allowed=", ".join(MEASURES))
    if sweep.pairs is None or sweep.pairs.empty:
        raise SpecError(
            "this sweep has no pairs table: run `ablate collect SWEEP --pairs` first (it needs each "
            "arm's MLM twin and two MLM seeds for the seed-noise band)",
            file=str(sweep.path),
            key="pairs",
        )
    runs = done_runs(sweep.runs)[["run_id", "schedule", "freeze"]].rename(columns={"run_id": "run_a"})
    return sweep.pairs.merge(runs, on="run_a")


def _arm(schedule: str, freeze: str, relation: str) -> str:
    """An arm's label; seed noise is labelled with its baseline schedule (one band per decay share, say)."""
    return f"{NOISE_ARM} ({schedule})" if relation == NOISE else arm_label(schedule, freeze)


def divergence_data(sweep: Sweep, *, measure: str = "cka") -> pd.DataFrame:
    """Per arm, phase end and layer: mean over seeds of 1 - CKA with its twin (or of the ratio), with a 95%
    CI; with measure "cka" also the MLM seed-noise rows (arm "MLM seed noise") at the same phase ends."""
    p = _pairs(sweep, measure)
    p = p[(p["measure"] == measure) & ((p["relation"] == TWIN) | (measure == "cka"))]
    rows = []
    for (rel, pos, s, f), g in p.groupby(["relation", "position", "schedule", "freeze"], sort=False):
        y = 1.0 - g["value"] if measure == "cka" else g["value"]
        for layer, yl in y.groupby(g["layer"]):
            m, lo, hi, n = mean_ci(yl)
            rows.append(
                (
                    _arm(s, f, rel),
                    s,
                    f,
                    rel,
                    int(pos),
                    ";".join(ordered(g["phase"])),
                    ";".join(ordered(g["phase_b"])),
                    int(layer),
                    "1-cka" if measure == "cka" else measure,
                    m,
                    lo,
                    hi,
                    n,
                )
            )
    return (
        pd.DataFrame(
            rows,
            columns=[
                "arm",
                "schedule",
                "freeze",
                "relation",
                "position",
                "phase",
                "phase_b",
                "layer",
                "measure",
                "mean",
                "ci_low",
                "ci_high",
                "n",
            ],
        )
        .sort_values(["position", "relation", "arm", "layer"], kind="stable")
        .reset_index(drop=True)
    )


def region_summary(sweep: Sweep, *, measure: str = "cka") -> pd.DataFrame:
    """Per arm (and the MLM seed noise), phase end and region: mean over seeds of the region's mean 1 - CKA
    (or ratio) with a 95% CI. Regions: low / mid / high thirds of the blocks, and "all" blocks. `baseline`
    names the MLM schedule the arm was compared with (for seed noise: its own)."""
    p = _pairs(sweep, measure)
    baseline_of = done_runs(sweep.runs).set_index("run_id")["schedule"]
    values = region_values(p[p["measure"] == measure]).merge(
        p[["run_a", "schedule", "freeze"]].drop_duplicates(), on="run_a"
    )
    values["baseline"] = values["run_b"].map(baseline_of)
    rows = []
    for (rel, pos, s, f, b, region), g in values.groupby(
        ["relation", "position", "schedule", "freeze", "baseline", "region"], sort=False
    ):
        m, lo, hi, n = mean_ci(g["value"])
        rows.append(
            (
                _arm(s, f, rel),
                rel,
                b,
                int(pos),
                ";".join(ordered(g["phase"])),
                ";".join(ordered(g["phase_b"])),
                region,
                g["measure"].iloc[0],
                m,
                lo,
                hi,
                n,
            )
        )
    out = pd.DataFrame(
        rows,
        columns=[
            "arm",
            "relation",
            "baseline",
            "position",
            "phase",
            "phase_b",
            "region",
            "measure",
            "mean",
            "ci_low",
            "ci_high",
            "n",
        ],
    )
    out["_r"] = out["region"].map(REGIONS.index)
    return (
        out.sort_values(["relation", "arm", "position", "_r"], kind="stable")
        .drop(columns="_r")
        .reset_index(drop=True)
    )


def _kind(objective: str, freeze: str, relation: str) -> str:
    """A pair kind: what the arm did before its decay (its first phase's objective) and its freeze mask;
    the arms of one kind at different decay lengths are one line of the persistence figure."""
    if relation == NOISE:
        return NOISE_ARM
    return f"{objective} vs MLM twin" + ("" if freeze == "none" else f" ({freeze} frozen)")


def model_summary(sweep: Sweep) -> pd.DataFrame:
    """Per arm (and the MLM seed noise) and phase end: the whole model's divergence (pairs measure
    divergence_model) over seeds: mean, std (ddof 0, the paper's +-), 95% t-interval, n; with `kind` (the
    pair kind: the arm's first-phase objective, pairs column `objective`, and its freeze mask), `step` and
    `decay_tokens` (tokens trained after the first phase's end) where the pairs table has them."""
    p = _pairs(sweep, "cka")
    p = p[p["measure"] == MODEL_MEASURE]
    if p.empty:
        raise SpecError(
            "the pairs table has no whole-model rows (it was collected before they existed): run "
            "`ablate collect SWEEP --pairs` again",
            file=str(sweep.path),
            key="pairs",
        )
    baseline_of = done_runs(sweep.runs).set_index("run_id")["schedule"]
    p = p.assign(baseline=p["run_b"].map(baseline_of))
    first = p.groupby("schedule")["objective"].first() if "objective" in p.columns else pd.Series(dtype=str)
    rows = []
    for (rel, pos, s, f, b), g in p.groupby(
        ["relation", "position", "schedule", "freeze", "baseline"], sort=False
    ):
        m, lo, hi, n = mean_ci(g["value"])
        std = float(np.std(g["value"].dropna(), ddof=0)) if n else float("nan")
        extra = [float(g[c].mean()) if c in g.columns else float("nan") for c in ("step", "decay_tokens")]
        rows.append(
            (
                _arm(s, f, rel),
                _kind(first.get(s, "?"), f, rel),
                rel,
                b,
                int(pos),
                ";".join(ordered(g["phase"])),
                ";".join(ordered(g["phase_b"])),
                "model",
                MODEL_MEASURE,
                m,
                std,
                lo,
                hi,
                n,
                *extra,
            )
        )
    out = pd.DataFrame(
        rows,
        columns=[
            "arm",
            "kind",
            "relation",
            "baseline",
            "position",
            "phase",
            "phase_b",
            "region",
            "measure",
            "mean",
            "std",
            "ci_low",
            "ci_high",
            "n",
            "step",
            "decay_tokens",
        ],
    )
    return out.sort_values(["relation", "arm", "position"], kind="stable").reset_index(drop=True)


def divergence_table(sweep: Sweep, *, measure: str = "cka") -> pd.DataFrame:
    """The region summaries, then (measure cka, when the pairs table has them) the whole model's rows
    (region "model", measure divergence_model, with the std over seeds)."""
    regions = region_summary(sweep, measure=measure)
    if measure != "cka" or not (sweep.pairs["measure"] == MODEL_MEASURE).any():
        return regions
    model = model_summary(sweep).drop(columns=["kind", "step"])
    return pd.concat([regions, model], ignore_index=True)


def _panel_title(d: pd.DataFrame) -> str:
    twin = d[d["relation"] == TWIN]
    pos = int(d["position"].iloc[0])
    return f"phase end {pos}: " + " / ".join(ordered([*twin["phase"], *twin["phase_b"]]) or ordered(d["phase"]))


@styled
def divergence_figure(sweep: Sweep, *, measure: str = "cka", baseline: str | None = None):
    """Per layer, 1 - CKA between each arm and its MLM twin (mean over seeds, 95% CI), with the MLM
    seed-to-seed band (grey), one panel per phase end."""
    baseline = baseline or sweep.baseline
    data = divergence_data(sweep, measure=measure)
    arms = data[data["relation"] == TWIN]
    colors, styles = arm_styles(arms, baseline)
    positions = ordered(data["position"])
    fig = new_figure(2.9 + 3.1 * len(positions), 2.8)
    axes = []
    for j, pos in enumerate(positions):
        d = data[data["position"] == pos]
        ax = fig.add_subplot(1, len(positions), j + 1, sharey=axes[0] if axes else None)
        for k, (arm, noise) in enumerate(d[d["relation"] == NOISE].groupby("arm", sort=False)):
            ax.fill_between(
                noise["layer"],
                noise["ci_low"].fillna(noise["mean"]),
                noise["ci_high"].fillna(noise["mean"]),
                color="0.6",
                alpha=0.3,
                lw=0,
            )
            ax.plot(
                noise["layer"], noise["mean"], color="0.45", lw=1, ls=styles_list[k % len(styles_list)], label=arm
            )
        for (s, f), g in d[d["relation"] == TWIN].groupby(["schedule", "freeze"], sort=False):
            ls, marker = styles[f]
            ax.fill_between(g["layer"], g["ci_low"], g["ci_high"], color=colors[s], alpha=0.18, lw=0)
            ax.plot(g["layer"], g["mean"], color=colors[s], ls=ls, marker=marker, ms=3.5, label=arm_label(s, f))
        if measure == "cka_ratio":
            ax.axhline(1.0, color="0.4", lw=0.8, ls=":")
            if not d["mean"].notna().any():
                ax.text(
                    0.5,
                    0.5,
                    "undefined: no MLM seed noise\n(identical representations)",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                    color="0.4",
                    fontsize=8,
                )
        ax.set_title(_panel_title(d))
        ax.set_ylabel(MEASURES[measure] if j == 0 else "")
        ax.set_xlabel("layer (emb = embeddings output)")
        layer_ticks(ax, d["layer"].tolist())
        ax.grid(axis="y", lw=0.4, alpha=0.5)
        axes.append(ax)
    figure_legend(fig, axes)
    return fig, data


@styled
def regions_figure(sweep: Sweep, *, measure: str = "cka"):
    """Divergence from the MLM twin per region (low / mid / high thirds, all blocks) at each phase end: one
    panel per arm, one marker per phase end (mean over seeds, 95% CI), the seed-noise level dashed."""
    summary = region_summary(sweep, measure=measure)
    data = summary[summary["relation"] == TWIN].reset_index(drop=True)
    noise = summary[summary["relation"] == NOISE]
    arms = ordered(data["arm"])
    positions = ordered(data["position"])
    fig = new_figure(3.0 + 3.4 * len(arms), 2.8)
    axes = []
    for j, arm in enumerate(arms):
        ax = fig.add_subplot(1, len(arms), j + 1, sharey=axes[0] if axes else None)
        d = data[data["arm"] == arm]
        width = 0.8 / len(positions)
        for k, pos in enumerate(positions):
            g = d[d["position"] == pos].set_index("region").reindex(list(REGIONS))
            x = [i - 0.4 + width * (k + 0.5) for i in range(len(REGIONS))]
            err = [(g["mean"] - g["ci_low"]).fillna(0), (g["ci_high"] - g["mean"]).fillna(0)]
            ax.errorbar(
                x,
                g["mean"],
                yerr=err,
                fmt="o",
                ms=4,
                capsize=2,
                color=f"C{k}",
                label=f"after {' / '.join(ordered(g['phase'].dropna()))}",
            )
            n = noise[(noise["position"] == pos) & noise["baseline"].isin(d["baseline"])]
            n = n.set_index("region").reindex(list(REGIONS))
            if n["mean"].notna().any():
                ax.plot(
                    x,
                    n["mean"],
                    ls="none",
                    marker="_",
                    ms=10,
                    color=f"C{k}",
                    alpha=0.6,
                    label=f"{NOISE_ARM}, phase end {pos}",
                )
        ax.set_xticks(range(len(REGIONS)), REGIONS)
        ax.set_title(arm)
        ax.set_ylabel(MEASURES[measure] + " (region mean)" if j == 0 else "")
        ax.grid(axis="y", lw=0.4, alpha=0.5)
        axes.append(ax)
    figure_legend(fig, axes)
    return fig, data
