"""The `persistence` figure: the whole model's divergence from the MLM twin (1 - CKA, the paper's Table
"asymmetry" measure) over the decay, one line per pair kind (CLM detour vs its MLM twin, a frozen arm, the
MLM seed noise), as the paper's Figure "cka-mechanism" (right panel) draws it.

x is the tokens trained after the first phase's end (0: the end of the detour; a decay grid's decay lengths
give the later points, each from the pairs of its own length), or the phase-end step (`x=step`); y the mean
over seeds, with the 95% t-interval as a band and the std over seeds (the paper's +-) in the CSV.

May import: config, analysis, report.
"""

from __future__ import annotations

from ablate.analysis.pairs import NOISE
from ablate.config.errors import SpecError
from ablate.report.arms import ordered
from ablate.report.divergence import model_summary
from ablate.report.style import figure_legend, new_figure, styled
from ablate.report.sweep import Sweep

X_AXES = {"decay_tokens": "tokens trained after the first phase (decay tokens)", "step": "phase-end step"}


def persistence_data(sweep: Sweep, *, x: str = "decay_tokens"):
    """Per pair kind and x value: the mean over its arms' model_summary rows there (one arm per decay length
    in a decay grid), with the interval and std of those rows (a single arm: its own)."""
    if x not in X_AXES:
        raise SpecError(
            "unknown x axis of the persistence figure", key="--set x", value=x, allowed=", ".join(X_AXES)
        )
    summary = model_summary(sweep)
    if summary[x].isna().all():
        raise SpecError(
            f"the pairs table has no {x!r} column (collected before it existed): run `ablate collect "
            "SWEEP --pairs` again",
            file=str(sweep.path),
            key="pairs",
        )
    rows = (
        summary.groupby(["kind", "relation", x], sort=False)
        .agg(
            mean=("mean", "mean"),
            std=("std", "mean"),
            ci_low=("ci_low", "mean"),
            ci_high=("ci_high", "mean"),
            n=("n", "sum"),
            arms=("arm", lambda a: ";".join(ordered(a))),
            phase=("phase", "first"),
        )
        .reset_index()
    )
    return rows.sort_values(["relation", "kind", x], kind="stable").reset_index(drop=True)


@styled
def persistence_figure(sweep: Sweep, *, x: str = "decay_tokens"):
    """1 - CKA of the whole model (mean over blocks) against x, one line per pair kind, the seed noise grey."""
    data = persistence_data(sweep, x=x)
    fig = new_figure(5.2, 3.0)
    ax = fig.add_subplot(1, 1, 1)
    for k, kind in enumerate(ordered(data["kind"])):
        g = data[data["kind"] == kind]
        noise = (g["relation"] == NOISE).all()
        color = "0.45" if noise else f"C{k}"
        ax.fill_between(
            g[x], g["ci_low"].fillna(g["mean"]), g["ci_high"].fillna(g["mean"]), color=color, alpha=0.18, lw=0
        )
        ax.plot(g[x], g["mean"], color=color, ls="--" if noise else "-", marker="o", ms=3.5, label=kind)
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel("1 − CKA, whole model\n(mean over blocks)")
    ax.set_title("divergence over the decay")
    ax.grid(axis="y", lw=0.4, alpha=0.5)
    figure_legend(fig, [ax])
    return fig, data
