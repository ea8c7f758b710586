"""The `layers` figure: how far each layer moved per arm (1 - CKA vs the base model, or another measure of
the layers table), with a strip of the layers each freeze mask froze, read from the `frozen` table.

May import: config, plan, report.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ablate.config.errors import SpecError
from ablate.plan.freezing import consecutive_runs
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
from ablate.report.stats import mean_ci
from ablate.report.style import arm_styles, figure_legend, layer_ticks, new_figure, styled
from ablate.report.sweep import Sweep
from ablate.config.grid import DEFAULT_BASELINE

MEASURE_LABELS = {
    "cka_vs_base": "1 − CKA vs base model",
    "weight_rel_change": "relative weight change\n‖W − W₀‖ / ‖W₀‖",
    "grad_norm": "gradient norm (L2)",
    "cka_ratio_vs_mlm": "1 − CKA vs MLM, in units of\nMLM seed-to-seed (1 − CKA)",
}
# CKA is a similarity; the figure shows how far a layer moved, so it plots 1 - CKA.
ONE_MINUS = {"cka_vs_base"}


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


def drawn_frozen(frozen: pd.DataFrame | None, layers: pd.DataFrame) -> pd.DataFrame:
    """(run_id, phase, layer) rows of the frozen table that the figure draws.

    The rule: a phase that froze every layer the run has in the layers table (embeddings and every block:
    a head warm-up, which trains the MLM head alone) is left out, since it says nothing about which layers an
    arm kept fixed while the encoder trained. Every other frozen layer is drawn.
    """
    columns = ["run_id", "phase", "layer"]
    if frozen is None or frozen.empty:
        return pd.DataFrame(columns=columns)
    measured = layers[["run_id", "layer"]].drop_duplicates().astype({"layer": int})
    rows = frozen[columns].astype({"layer": int}).merge(measured, on=["run_id", "layer"])
    n_frozen = rows.groupby(["run_id", "phase"])["layer"].transform("nunique")
    every = n_frozen == rows["run_id"].map(measured.groupby("run_id").size())
    return rows[~every].reset_index(drop=True)


def _measure_rows(sweep: Sweep, runs: pd.DataFrame, measure: str, phase: str) -> pd.DataFrame:
    """The layers table's rows of `measure` for done runs at the end of `phase` ("last": each run's last)."""
    table = sweep.require("layers", "layers")
    measures = ordered(table["measure"])
    if measure not in measures:
        raise SpecError(
            "measure not in the sweep's layers table", key="measure", value=measure, allowed=", ".join(measures)
        )
    table = table[(table["measure"] == measure) & table["run_id"].isin(runs["run_id"])]
    if phase == "last":
        pos = phase_positions(table, sweep.curves)
        last = pos.loc[pos.groupby("run_id")["position"].idxmax(), ["run_id", "phase"]]
        table = table.merge(last, on=["run_id", "phase"])
    else:
        phases = ordered(table["phase"])
        if phase not in phases:
            raise SpecError(
                f"phase not measured for {measure}", key="phase", value=phase, allowed="last, " + ", ".join(phases)
            )
        table = table[table["phase"] == phase]
    if table.empty:
        raise SpecError(f"no done runs with layer measure {measure!r}", file=str(sweep.path), key="layers")
    return table


def layer_data(
    sweep: Sweep,
    *,
    measure: str = "cka_vs_base",
    phase: str = "last",
    baseline: str | None = None,
    panel: str | None = "auto",
) -> pd.DataFrame:
    """Per arm and layer: mean over seeds of the plotted measure at the end of `phase`, with a 95% CI.

    phase "last" takes each run's last measured phase. `frozen_in` names the phases in which the arm froze
    that layer, by the rule of `drawn_frozen` (a phase that froze every layer is not named).
    """
    baseline = baseline or sweep.baseline
    runs = done_runs(sweep.runs)
    table = _measure_rows(sweep, runs, measure, phase)
    pcol = panel_column(runs, panel)
    keys = arm_keys(pcol)
    df = table.merge(runs[["run_id", *keys]], on="run_id")
    df["y"] = 1.0 - df["value"] if measure in ONE_MINUS else df["value"]
    frozen = drawn_frozen(sweep.frozen, sweep.layers).merge(runs[["run_id", *keys]], on="run_id")
    frozen_in = frozen.groupby([*keys, "layer"])["phase"].agg(lambda s: ";".join(sorted(set(s)))).to_dict()

    rows = []
    for key, g in df.groupby(keys, sort=False):
        for layer, gl in g.groupby("layer"):
            m, lo, hi, n = mean_ci(gl["y"])
            rows.append(
                (
                    *key,
                    arm_label(key[-2], key[-1]),
                    int(layer),
                    ";".join(ordered(gl["phase"])),
                    ("1 - " if measure in ONE_MINUS else "") + measure,
                    m,
                    lo,
                    hi,
                    n,
                    frozen_in.get((*key, int(layer)), ""),
                )
            )
    out = pd.DataFrame(
        rows, columns=[*keys, "arm", "layer", "phase", "measure", "mean", "ci_low", "ci_high", "n", "frozen_in"]
    )
    return arm_sorted(out, runs, baseline, pcol, then=["layer"])


def strip_rows(data: pd.DataFrame) -> list[tuple[str, str, str, list[int]]]:
    """(schedule, freeze, phase, layers) for every arm and phase that froze something drawn."""
    rows = []
    for (s, f), g in data.groupby(["schedule", "freeze"], sort=False):
        by_phase: dict[str, list[int]] = {}
        for layer, phases in zip(g["layer"], g["frozen_in"]):
            for ph in filter(None, phases.split(";")):
                by_phase.setdefault(ph, []).append(int(layer))
        rows += [(s, f, ph, sorted(ls)) for ph, ls in by_phase.items()]
    return rows


def _draw_strip(sx, rows, n_rows: int, colors: dict, same_labels_as_first: bool) -> None:
    """The frozen-layers strip under a panel: one bar row per (mask, phase), one bar per run of layers."""
    for i, (s, _f, _ph, idx) in enumerate(rows):
        for lo, hi in consecutive_runs(idx):
            sx.barh(
                i,
                hi - lo + 0.8,
                left=lo - 0.4,
                height=0.7,
                color=colors[s],
                alpha=0.45,
                edgecolor=colors[s],
                lw=0.8,
            )
    sx.set_yticks(
        range(len(rows)), [] if same_labels_as_first else [f"{f} · {ph}" for _, f, ph, _ in rows], fontsize=7.5
    )
    sx.set_ylim(n_rows - 0.5, -0.5)
    sx.tick_params(axis="y", length=0)
    sx.spines["left"].set_visible(False)
    sx.set_xlabel("layer (emb = embeddings output)")
    sx.set_title("frozen layers (mask · phase)", loc="left", fontsize=7.5, color="0.3")


def plot_layers(
    data: pd.DataFrame, *, panel_col: str | None = None, baseline: str = DEFAULT_BASELINE, logy: bool = False
):
    measure = data["measure"].iloc[0]
    base_measure = measure.removeprefix("1 - ")
    names = panels(data, panel_col)
    colors, styles = arm_styles(data, baseline)
    strip = [strip_rows(in_panel(data, panel_col, p)) for p in names]
    n_strip = max(len(s) for s in strip)
    strip_h = 0.35 + 0.2 * n_strip
    fig = new_figure(2.9 + 3.1 * len(names), 2.6 + (strip_h if n_strip else 0))
    gs = fig.add_gridspec(2 if n_strip else 1, len(names), height_ratios=[2.6, strip_h] if n_strip else None)
    for j, p in enumerate(names):
        d = in_panel(data, panel_col, p)
        ax = fig.add_subplot(gs[0, j])
        for (s, f), g in d.groupby(["schedule", "freeze"], sort=False):
            ls, marker = styles[f]
            ax.fill_between(g["layer"], g["ci_low"], g["ci_high"], color=colors[s], alpha=0.18, lw=0)
            ax.plot(g["layer"], g["mean"], color=colors[s], ls=ls, marker=marker, ms=3.5, label=arm_label(s, f))
        if base_measure == "cka_ratio_vs_mlm":
            ax.axhline(1.0, color="0.4", lw=0.8, ls=":", label="_seed noise")
        if logy:
            ax.set_yscale("log")
        ax.set_ylabel(MEASURE_LABELS.get(base_measure, measure) if j == 0 else "")
        phases = ordered(";".join(d["phase"]).split(";"))
        when = "final models" if phases == ["final"] else f"end of phase {' / '.join(phases)}"
        ax.set_title("\n".join(filter(None, [panel_title(panel_col, p), when])))
        layer_ticks(ax, d["layer"].tolist())
        ax.grid(axis="y", lw=0.4, alpha=0.5)
        if n_strip:
            ax.tick_params(labelbottom=False)
            same = j > 0 and [r[:3] for r in strip[j]] == [r[:3] for r in strip[0]]
            _draw_strip(fig.add_subplot(gs[1, j], sharex=ax), strip[j], n_strip, colors, same)
        else:
            ax.set_xlabel("layer (emb = embeddings output)")
    figure_legend(fig, [a for a in fig.axes if a.get_lines()])
    return fig


@styled
def layers_figure(
    sweep: Sweep,
    *,
    measure: str = "cka_vs_base",
    phase: str = "last",
    baseline: str | None = None,
    panel: str | None = "auto",
    logy: bool = False,
):
    """How far each layer moved, per arm: 1 - CKA vs the base model (or another layer measure).

    The strip under the axes shows, per freeze mask and phase, the layers the `frozen` table says were
    frozen; a phase that froze every layer (a head warm-up) is not drawn (see `drawn_frozen`).
    """
    baseline = baseline or sweep.baseline
    pcol = panel_column(done_runs(sweep.runs), panel)
    data = layer_data(sweep, measure=measure, phase=phase, baseline=baseline, panel=pcol)
    return plot_layers(data, panel_col=pcol, baseline=baseline, logy=logy), data
