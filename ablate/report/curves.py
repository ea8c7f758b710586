"""The `curves` figure: training loss and learning rate against tokens seen, per arm, with a strip of each
schedule's phases on top.

May import: config, report.
"""

from __future__ import annotations

import pandas as pd

from ablate.config.errors import SpecError
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
from ablate.report.style import arm_styles, figure_legend, new_figure, styled
from ablate.report.sweep import Sweep
from ablate.config.grid import DEFAULT_BASELINE


def curve_data(
    sweep: Sweep, *, baseline: str | None = None, smooth: int = 1, panel: str | None = "auto"
) -> pd.DataFrame:
    """Loss and LR per arm, phase and step, averaged over seeds (loss with a 95% CI).

    `smooth` > 1 first takes a trailing rolling mean of the loss over that many logged points within each
    run and phase.
    """
    baseline = baseline or sweep.baseline
    curves = sweep.require("curves", "curves")
    if smooth < 1:
        raise SpecError(
            "smooth must be at least 1 (logged points in the rolling mean)", key="smooth", value=smooth
        )
    runs = done_runs(sweep.runs)
    pcol = panel_column(runs, panel)
    keys = arm_keys(pcol)
    df = curves.merge(runs[["run_id", *keys]], on="run_id")
    if df.empty:
        raise SpecError("no curves for done runs", file=str(sweep.path), key="curves")
    df = df.sort_values(["run_id", "step"], kind="stable")
    if smooth > 1:
        df["loss"] = df.groupby(["run_id", "phase"], sort=False)["loss"].transform(
            lambda s: s.rolling(smooth, min_periods=1).mean()
        )
    rows = []
    for key, g in df.groupby([*keys, "phase", "step"], sort=False):
        m, lo, hi, n = mean_ci(g["loss"])
        rows.append((*key, float(g["tokens"].mean()), m, lo, hi, float(g["lr"].mean()), n))
    out = pd.DataFrame(
        rows, columns=[*keys, "phase", "step", "tokens", "loss", "loss_ci_low", "loss_ci_high", "lr", "n"]
    )
    out.insert(len(keys), "arm", [arm_label(s, f) for s, f in zip(out["schedule"], out["freeze"])])
    return arm_sorted(out, runs, baseline, pcol, then=["step"])


def token_unit(max_tokens: float) -> tuple[float, str]:
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


def _timeline(ax, spans, colors, scale: float) -> None:
    """One row per schedule: its phases as bars along the token axis, named where the name fits."""
    schedules = ordered([s for s, *_ in spans])
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


def _draw_arms(ax_loss, ax_lr, d: pd.DataFrame, colors, styles, scale: float) -> None:
    """Loss (with its CI band) and LR of each arm, one line per phase so phases do not join."""
    for (s, f), g in d.groupby(["schedule", "freeze"], sort=False):
        ls = styles[f][0]
        for k, (_, gp) in enumerate(g.groupby("phase", sort=False)):
            x = gp["tokens"] / scale
            label = arm_label(s, f) if k == 0 else "_" + arm_label(s, f)
            ax_loss.fill_between(x, gp["loss_ci_low"], gp["loss_ci_high"], color=colors[s], alpha=0.18, lw=0)
            ax_loss.plot(x, gp["loss"], color=colors[s], ls=ls, lw=1.1, label=label)
            ax_lr.plot(x, gp["lr"], color=colors[s], ls=ls, lw=1.1, label=label)


def plot_curves(data: pd.DataFrame, *, panel_col: str | None = None, baseline: str = DEFAULT_BASELINE):
    from matplotlib.ticker import ScalarFormatter

    names = panels(data, panel_col)
    colors, styles = arm_styles(data, baseline)
    scale, unit = token_unit(float(data["tokens"].max()))
    strip_h = 0.3 + 0.17 * data["schedule"].nunique()
    fig = new_figure(2.9 + 3.3 * len(names), 4.2 + strip_h)
    axes = fig.subplots(
        3, len(names), sharex="col", squeeze=False, gridspec_kw={"height_ratios": [strip_h, 2.1, 2.1]}
    )
    for j, p in enumerate(names):
        d = in_panel(data, panel_col, p)
        ax_ph, ax_loss, ax_lr = axes[:, j]
        _draw_arms(ax_loss, ax_lr, d, colors, styles, scale)
        spans = phase_spans(d)
        _timeline(ax_ph, spans, colors, scale)
        ends = sorted({e for *_, e in spans})[:-1]
        for ax in (ax_loss, ax_lr):
            for x0 in ends:
                ax.axvline(x0 / scale, color="0.75", lw=0.6, ls=":", zorder=0)
            ax.grid(axis="y", lw=0.4, alpha=0.5)
        ax_ph.set_title(panel_title(panel_col, p))
        ax_loss.set_ylabel("training loss\n(nats/token)" if j == 0 else "")
        ax_lr.set_ylabel("learning rate" if j == 0 else "")
        fmt = ScalarFormatter(useMathText=True)
        fmt.set_powerlimits((-2, 3))
        ax_lr.yaxis.set_major_formatter(fmt)
        ax_lr.set_ylim(bottom=0)
        ax_lr.set_xlabel(f"tokens seen ({unit})" if unit else "tokens seen")
        ax_lr.set_xlim(left=0)
    figure_legend(fig, axes[1, :])
    return fig


@styled
def curves_figure(sweep: Sweep, *, baseline: str | None = None, smooth: int = 1, panel: str | None = "auto"):
    """Training loss (top) and learning rate (bottom) against tokens seen, per arm; phase starts marked."""
    baseline = baseline or sweep.baseline
    pcol = panel_column(done_runs(sweep.runs), panel)
    data = curve_data(sweep, baseline=baseline, smooth=smooth, panel=pcol)
    return plot_curves(data, panel_col=pcol, baseline=baseline), data
