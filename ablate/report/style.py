"""The one look of every figure and how figures are written: palettes (colour per schedule, line style and
marker per freeze mask), the style context, figure / legend / layer-axis helpers, and saving PNG (300 dpi)
+ SVG or PDF + the CSV of the plotted data.

Figures are drawn on `matplotlib.figure.Figure` objects (no pyplot state), so they render with Agg and also
display inline in notebooks.

May import: plan, report.arms.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from ablate.plan.phases import EMBEDDINGS
from ablate.report.arms import ordered

DPI = 300
FREEZE_STYLES = [
    ("-", "o"),
    ("--", "s"),
    (":", "^"),
    ("-.", "D"),
    ((0, (5, 1.5)), "v"),
    ((0, (1, 1)), "P"),
    ((0, (3, 1, 1, 1, 1, 1)), "X"),
    ((0, (8, 2)), "*"),
]


def palette(schedules: Sequence[str]) -> dict[str, tuple]:
    import seaborn as sns

    colors = sns.color_palette("colorblind", max(len(schedules), 1))
    return {s: colors[i % len(colors)] for i, s in enumerate(schedules)}


def freeze_styles(freezes: Sequence[str]) -> dict[str, tuple]:
    return {f: FREEZE_STYLES[i % len(FREEZE_STYLES)] for i, f in enumerate(freezes)}


def arm_styles(data: pd.DataFrame, baseline: str) -> tuple[dict, dict]:
    """Colour per schedule and (line style, marker) per freeze mask; the baseline and "none" always come first,
    so an arm looks the same in every figure of a sweep, whether or not the baseline is drawn."""
    return (palette(ordered([baseline, *data["schedule"]])), freeze_styles(ordered(["none", *data["freeze"]])))


def style_context() -> contextlib.ExitStack:
    """The one visual style: seaborn paper context, ticks style, 300 dpi, TrueType text in vector output."""
    import matplotlib as mpl
    import seaborn as sns

    stack = contextlib.ExitStack()
    stack.enter_context(sns.axes_style("ticks"))
    stack.enter_context(sns.plotting_context("paper", font_scale=1.1))
    stack.enter_context(
        mpl.rc_context(
            {
                "savefig.dpi": DPI,
                "figure.dpi": 100,
                "svg.fonttype": "none",
                "pdf.fonttype": 42,
                "legend.frameon": False,
                "axes.spines.top": False,
                "axes.spines.right": False,
            }
        )
    )
    return stack


def styled(fn: Callable) -> Callable:
    """Draw a figure inside the shared style, whether called by make_figure or from a notebook."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with style_context():
            return fn(*args, **kwargs)

    return wrapper


def new_figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def figure_legend(fig, axes, loc: str = "outside right upper", **kw) -> None:
    """One figure legend for all panels (a panel may lack some arms)."""
    entries: dict[str, object] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, h)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc=loc, **kw)


def layer_ticks(ax, layers: Sequence[int]) -> None:
    """A layer axis: "emb" for the embeddings (-1), then block numbers, about a dozen labelled ticks."""
    lo, hi = min(layers), max(layers)
    step = max(1, math.ceil((hi - lo + 1) / 12))
    ticks = [EMBEDDINGS] if lo == EMBEDDINGS else []
    # labelled ticks every `step` layers; with step > 1, "0" would crowd "emb", so numbering starts at step
    ticks += list(range(0 if step == 1 or lo != EMBEDDINGS else step, hi + 1, step))
    ax.set_xticks(ticks, ["emb" if t == EMBEDDINGS else str(t) for t in ticks])
    ax.set_xticks(range(lo, hi + 1), minor=True)
    ax.set_xlim(lo - 0.5, hi + 0.5)


def save_figure(fig, data: pd.DataFrame, stem: Path, vector: str = "svg") -> dict[str, Path]:
    """Write stem.png (300 dpi), stem.svg|pdf and stem.csv (the plotted data); return their paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = {
        "png": stem.with_suffix(".png"),
        vector: stem.with_suffix(f".{vector}"),
        "csv": stem.with_suffix(".csv"),
    }
    with style_context():
        fig.savefig(paths["png"], dpi=DPI, bbox_inches="tight")
        fig.savefig(paths[vector], bbox_inches="tight")
    data.to_csv(paths["csv"], index=False)
    return paths
