"""Report: figures and summaries over a collected sweep's tidy tables (runs, scores, layers, curves, frozen).

`from ablate import report` is the one entry point (the CLI and the notebooks use it):
    report.load_sweep(path_or_name) -> Sweep           report.make_figure(name, sweep_dir, out, **options)
    report.FIGURES[name](sweep, **options) -> (Figure, DataFrame of exactly what is drawn)
    report.<figure>_data(sweep, ...) / report.plot_<figure>(data, ...)   data and drawing apart
    report.score_summary(sweep)                          report.style_context(), report.save_figure(...)

Conventions shared by every figure:
- only runs with status "done" are used;
- an arm is a (schedule, freeze) pair; the baseline is schedule == `baseline` (the sweep's grid's
  `baseline:`, default config.grid.DEFAULT_BASELINE) with freeze == "none"; colour encodes the schedule, line style / marker the freeze mask;
- intervals are 95% t-intervals over the replicates named in each figure's doc (NaN when n < 2);
- `panel` facets by a runs column ("auto": by "model" when the sweep has several models).

Modules: sweep (loading), stats (intervals), arms (grouping), style (look and files), layers, scores, curves,
divergence (the figures), registry (FIGURES, make_figure), tables, html (the page), references (the published
numbers shipped in reference/*.yaml) and beside (them set beside the measured ones: `--reference paper`).
Releasing a run as a Hugging Face folder with its model card is ablate.release's.

Only the CLI is above it.

May import: config, store, data, models, plan, analysis, train, evaluate, predict, launch, tune, report.
"""

from ablate.report.arms import arm_label, done_runs
from ablate.report.divergence import (
    divergence_data,
    divergence_figure,
    divergence_table,
    model_summary,
    region_summary,
    regions_figure,
)
from ablate.report.curves import curve_data, curves_figure, phase_spans, plot_curves
from ablate.report.layers import (
    MEASURE_LABELS,
    drawn_frozen,
    layer_data,
    layers_figure,
    ordered_phases,
    phase_positions,
    plot_layers,
)
from ablate.report.persistence import persistence_data, persistence_figure
from ablate.report.registry import FIGURES, make_figure
from ablate.report.scores import (
    delta_data,
    deltas_figure,
    freeze_data,
    freeze_figure,
    plot_deltas,
    plot_freeze,
    primary_scores,
    score_summary,
)
from ablate.report.stats import mean_ci, welch_ci
from ablate.report.style import save_figure, style_context
from ablate.report.sweep import TABLES, Sweep, list_sweeps, load_sweep, resolve_sweep
from ablate.report.paper_tables import freeze_table, make_table, score_table

__all__ = [
    "FIGURES",
    "MEASURE_LABELS",
    "TABLES",
    "Sweep",
    "arm_label",
    "curve_data",
    "curves_figure",
    "delta_data",
    "deltas_figure",
    "divergence_data",
    "divergence_figure",
    "divergence_table",
    "model_summary",
    "persistence_data",
    "persistence_figure",
    "region_summary",
    "regions_figure",
    "done_runs",
    "drawn_frozen",
    "freeze_data",
    "freeze_figure",
    "layer_data",
    "layers_figure",
    "list_sweeps",
    "load_sweep",
    "make_figure",
    "mean_ci",
    "ordered_phases",
    "phase_positions",
    "phase_spans",
    "plot_curves",
    "plot_deltas",
    "plot_freeze",
    "plot_layers",
    "primary_scores",
    "score_table",
    "freeze_table",
    "make_table",
    "resolve_sweep",
    "save_figure",
    "score_summary",
    "style_context",
    "welch_ci",
]
