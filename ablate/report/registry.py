"""The figures by name, and `make_figure`: load a collected sweep, draw one figure, write its files; the
names of figures and tables (and their options) checked before any sweep is read.

Each figure is one entry of FIGURES (a Figure, registered with `FIGURES.register`): `draw(sweep, **options) ->
(Figure, DataFrame)`, the DataFrame holding exactly what is drawn (means, 95% CI bounds, counts), so the CSV
written next to the image is the figure's data; the entry also says what the sweep page and the command need
to know of it (drawn once per layer measure, only for a tune study, followed by the score summary). A new
figure: docs/extending.md, "A figure".

May import: config, tune, report.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ablate.config.errors import SpecError
from ablate.config.registry import Registry
from ablate.report.curves import curves_figure
from ablate.report.divergence import divergence_figure, regions_figure
from ablate.report.layers import layers_figure
from ablate.report.persistence import persistence_figure
from ablate.report.needle import needle_figure
from ablate.report.scores import deltas_figure, freeze_figure
from ablate.report.style import save_figure
from ablate.report.sweep import load_sweep
from ablate.report.paper_tables import TABLES, check_reference_table
from ablate.tune.figure import tune_figure


@dataclass(frozen=True)
class Figure:
    """One figure: its name (`--figure NAME`), what it shows (the parser's help and docs/results.md say it),
    `draw(sweep, **options)`, whose keyword-only options (each with a default) are what `--set KEY=VALUE` may
    set, and what the sweep page and `ablate report` look up: `per_measure`, drawn on the page once per
    measure of the layers table (option `measure`); `needs_study`, drawn on the page only for a tune study's
    folder (its study.json); `summary`, followed by the score summary table on the command line."""

    name: str
    description: str
    draw: Callable
    per_measure: bool = False
    needs_study: bool = False
    summary: bool = False

    def __call__(self, sweep, **options):
        return self.draw(sweep, **options)

    def options(self) -> dict[str, inspect.Parameter]:
        return {k: p for k, p in inspect.signature(self.draw).parameters.items() if p.kind is p.KEYWORD_ONLY}


def _check_figure_entry(entry: Figure, _registry) -> None:
    if not callable(entry.draw):
        raise TypeError(f"figure {entry.name!r}: draw is not callable")
    params = inspect.signature(entry.draw).parameters.values()
    if [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD or p.kind is p.POSITIONAL_ONLY][1:]:
        raise TypeError(f"figure {entry.name!r}: draw(sweep, *, options...) takes its options by keyword only")
    if [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]:
        raise TypeError(f"figure {entry.name!r}: every option of draw needs a default")
    if entry.per_measure and "measure" not in entry.options():
        raise TypeError(f"figure {entry.name!r} is drawn per measure but draw takes no `measure` option")


FIGURES: Registry[Figure] = Registry("figure", Figure, _check_figure_entry)
for _figure in (
    Figure("layers", "how far each layer moved per arm (1 - CKA vs the base, or another measure)", layers_figure,
           per_measure=True),
    Figure("deltas", "each arm's downstream score minus the MLM baseline's, per task and on average",
           deltas_figure, summary=True),
    Figure("curves", "training loss and learning rate against tokens seen, per arm", curves_figure),
    Figure("freeze", "mean downstream score per freeze mask x schedule (a heatmap)", freeze_figure),
    Figure("tune", "a tune study's optimisation history and parameter importances", tune_figure,
           needs_study=True),
    Figure("divergence", "per layer, 1 - CKA between each arm and its MLM twin, with the seed noise",
           divergence_figure),
    Figure("regions", "that divergence per region (low, mid, high thirds, all blocks) at each phase end",
           regions_figure),
    Figure("persistence", "the whole model's divergence against the decay's tokens, per pair kind",
           persistence_figure),
    Figure("needle", "needle-in-a-haystack accuracy by length and by position, per arm", needle_figure),
):  # fmt: skip
    FIGURES.register(_figure)


def _flag(option: str) -> str:
    """The command-line flag that sets an option (errors name it, as they name --figure)."""
    return "--baseline" if option == "baseline" else f"--set {option}"


def _coerce(name: str, key: str, value, default, kind: str = "figure"):
    """A CLI string as the type of the option's default (bool, int or float); anything else unchanged."""
    if not isinstance(value, str) or not isinstance(default, (bool, int, float)):
        return value
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        return type(default)(value)
    except ValueError:
        raise SpecError(
            f"option of {kind} {name!r} has the wrong type",
            key=_flag(key),
            value=value,
            allowed=type(default).__name__,
        ) from None


def coerce_options(name: str, fn: Callable, options: dict, kind: str = "figure") -> dict:
    """Check option names against the figure's (or table's) keywords; convert CLI strings to the default's
    type."""
    params = {k: p for k, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}
    unknown = [key for key in options if key not in params]
    if unknown:
        raise SpecError(
            f"unknown option for {kind} {name!r}",
            key=_flag(unknown[0]),
            value=options[unknown[0]],
            allowed=", ".join(params) or "(none)",
        )
    return {key: _coerce(name, key, value, params[key].default, kind) for key, value in options.items()}


def check_figure(name: str, options: dict | None = None) -> dict:
    """The figure's options, checked and coerced, if `name` is a figure; else a SpecError listing the
    figures. Reads no sweep: a wrong name is answered before the sweep is looked for."""
    return coerce_options(name, FIGURES.lookup(name, key="--figure").draw, options or {})


def check_table(name: str, options: dict | None = None) -> dict:
    """As check_figure, for a results table; a `reference` (--reference) must be a known one, and the table
    one that has reference rows."""
    if name not in TABLES:
        raise SpecError("unknown table", key="--table", value=name, allowed=", ".join(TABLES))
    options = options or {}
    check_reference_table(name, options.get("reference"))
    return coerce_options(name, TABLES[name], options, kind="table")


def output_stem(name: str, sweep_dir: Path, out: str | Path | None) -> tuple[Path, str]:
    """(path without suffix, "svg" or "pdf") for a figure's files; default <sweep>/figures/<name>."""
    if out is None:
        return sweep_dir / "figures" / name, "svg"
    out = Path(out).expanduser()
    if out.is_dir() or not out.suffix:
        return out / name, "svg"
    if out.suffix.lower() not in (".png", ".svg", ".pdf", ".csv"):
        raise SpecError(
            "figure output must be a folder or a .png/.svg/.pdf/.csv path", key="--out", value=str(out)
        )
    return out.with_suffix(""), "pdf" if out.suffix.lower() == ".pdf" else "svg"


def make_figure(
    name: str, sweep_dir: str | Path | None = None, out: str | Path | None = None, **options
) -> dict[str, Path]:
    """Draw figure `name` for a sweep (None: the most recent) and write PNG, SVG/PDF and CSV.

    `out`: a folder (files named after the figure) or a file path whose suffix picks PDF over SVG;
    default <sweep>/figures/. Returns {"png": path, "svg"|"pdf": path, "csv": path}.
    """
    options = check_figure(name, options)
    sweep = load_sweep(sweep_dir)
    stem, vector = output_stem(name, sweep.path, out)
    fig, data = FIGURES[name](sweep, **options)
    return save_figure(fig, data, stem, vector)
