"""`ablate report --html`: one self-contained page per sweep, <sweep>/report.html, to open or share.

The page needs no network: every figure is a PNG embedded as a base64 data URI, the style and the tiny
table-sorting script are inline. It opens on what a reader came for: the scores table (differences from the
baseline with their intervals), the token check (each arm's token stream against its MLM twin's) and every
figure of the sweep (the registered figures redrawn into <sweep>/figures/, one layer plot per measure, and
any other PNG already there); then a sortable runs table (state, tokens, wall time, a link to each run's
log) and the failed runs with their last log lines; last the grid: its axes, and its YAML folded.
Re-running it redraws the figures and rewrites the page. Asked with a reference (`--html --reference paper`),
the scores section also sets the paper's numbers beside the measured ones: the scores table's paper columns
and the blocks `--table scores|freeze --reference` print (ablate.report.beside). Scores computed on data whose
download nothing pins are marked: a `data` column ("unverified") and a note naming each such dataset and why
(ablate.report.scores.unverified_data).

May import: store, report.
"""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path

import pandas as pd

from ablate.report.arms import done_runs
from ablate.report.registry import FIGURES
from ablate.report.style import save_figure
from ablate.report.sweep import Sweep, load_sweep
from ablate.report.paper_tables import small_tests
from ablate.report.scores import average_names, data_marks, is_average, task_languages, unverified_data
from ablate.report.paper_tables import freeze_table, reference_blocks, score_table
from ablate.store import atomic
from ablate.store.rundir import read_status

LOG_LINES = 20
RUN_COLUMNS = ("run_id", "model", "schedule", "freeze", "seed", "status", "tokens_seen", "wall_time_s")
TWIN_COLUMNS = ("run_id", "model", "schedule", "freeze", "seed", "twin", "twin_tokens")
# the scores table as most readers read it; the rest (interval bounds, pairs, test, units, ...) folded below it
SCORE_COLUMNS = ("arm", "task", "language", "data", "test_examples", "mean", "std", "n", "delta", "p_value")
PAPER_COLUMNS = ("paper_row", "paper", "measured", "paper_delta", "paper_tasks")  # with a reference

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px}
th{background:#f3f3f3;cursor:pointer;user-select:none}th.asc:after{content:" \\25B2"}th.desc:after{content:" \\25BC"}
td.num{text-align:right;font-variant-numeric:tabular-nums}tr.failed td{background:#fde8e8}
.figs{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0;flex:0 0 calc(50% - .5em)}
figure img{width:100%;border:1px solid #eee}
figcaption{color:#555}pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:12px}.muted{color:#777}
.wide{overflow-x:auto}.wide td{white-space:nowrap}summary{cursor:pointer;color:#555}nav a{margin-right:.8em}
.unverified{background:#fff4d6;padding:.4em .6em;border-left:3px solid #d9a400}
"""

# Click a header to sort by that column (numbers as numbers), again to reverse.
SCRIPT = """
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var asc = !th.classList.contains('asc');
      table.querySelectorAll('th').forEach(function (h) { h.classList.remove('asc', 'desc'); });
      th.classList.add(asc ? 'asc' : 'desc');
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.v || a.cells[col].textContent, y = b.cells[col].dataset.v || b.cells[col].textContent;
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""


def _cell(value) -> str:
    if isinstance(value, float):
        if pd.isna(value):
            return '<td class="num"></td>'
        return f'<td class="num" data-v="{value!r}">{value:.4g}</td>'
    if isinstance(value, int):
        return f'<td class="num">{value}</td>'
    return f"<td>{value}</td>"  # callers escape text (links are markup on purpose)


def html_table(frame: pd.DataFrame, row_class=None) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for _, row in frame.iterrows():
        cls = f' class="{row_class(row)}"' if row_class else ""
        rows.append(f"<tr{cls}>" + "".join(_cell(v.item() if hasattr(v, "item") else v) for v in row) + "</tr>")
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _text_frame(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.apply(lambda col: col.map(lambda v: html.escape(v) if isinstance(v, str) else v))


def runs_section(sweep: Sweep) -> str:
    runs = sweep.runs
    frame = _text_frame(runs[[c for c in RUN_COLUMNS if c in runs.columns]].copy())
    logs = []
    for run_id in runs["run_id"]:
        log = sweep.path / "runs" / str(run_id) / "log.txt"
        logs.append(
            f'<a href="runs/{html.escape(str(run_id))}/log.txt">log</a>'
            if log.is_file()
            else '<span class="muted">none</span>'
        )
    frame["log"] = logs
    return html_table(frame, row_class=lambda row: "failed" if row.get("status") == "failed" else "")


def run_counts(sweep: Sweep) -> str:
    """The line under the page's title: "12 runs (11 done, 1 failed)"."""
    runs = sweep.runs
    counts = runs["status"].value_counts().to_dict() if "status" in runs.columns else {}
    states = ", ".join(f"{n} {s}" for s, n in counts.items())
    return html.escape(f"{len(runs)} runs ({states})")


def grid_section(sweep: Sweep) -> str:
    """The grid's axes, and its YAML folded (dozens of lines a reader opens when they need them)."""
    runs = sweep.runs
    axes = [c for c in ("model", "schedule", "freeze", "seed") if c in runs.columns]
    items = "".join(f"<li><b>{c}</b>: {html.escape(', '.join(map(str, pd.unique(runs[c]))))}</li>" for c in axes)
    grid = sweep.path / "grid.yaml"
    if not grid.is_file():
        return f'<ul>{items}</ul><p class="muted">no grid.yaml in the sweep folder</p>'
    text = grid.read_text()
    return (
        f"<ul>{items}</ul><details><summary>grid.yaml ({len(text.splitlines())} lines)</summary>"
        f"<pre>{html.escape(text)}</pre></details>"
    )


def tokens_section(sweep: Sweep) -> str:
    """The twins' token check: per finished arm, its MLM twin and whether they read the same tokens (rows
    that differ in red)."""
    runs = done_runs(sweep.runs)
    if "twin_tokens" not in runs.columns:
        return '<p class="muted">no token check in the runs table: collect the sweep again (ablate collect)</p>'
    verdicts = runs["twin_tokens"].fillna("").astype(str)
    arms = runs[~verdicts.isin(["", "baseline"])]
    if arms.empty:
        return '<p class="muted">no arm to check: the finished runs are all MLM baselines</p>'
    verdicts = verdicts[arms.index]
    counts = {"same": int((verdicts == "same").sum()), "differ": int(verdicts.str.startswith("differ").sum())}
    counts["other (no twin, unchecked)"] = len(arms) - sum(counts.values())
    summary = (
        "<p>Each arm's token stream against its MLM twin's (the baseline with the same model, data, seed "
        "and phase ends; per phase where both runs record it): "
        + ", ".join(f"{n} {html.escape(k)}" for k, n in counts.items())
        + ".</p>"
    )
    frame = _text_frame(arms[[c for c in TWIN_COLUMNS if c in arms.columns]].fillna("").copy())
    table = html_table(
        frame, row_class=lambda row: "failed" if str(row["twin_tokens"]).startswith("differ") else ""
    )
    # folded, so the figures stay near the scores; open when some arm read other tokens than its twin
    return summary + f"<details{' open' if counts['differ'] else ''}><summary>per arm</summary>{table}</details>"


def scores_section(sweep: Sweep, reference: str | None = None) -> str:
    if sweep.scores is None or sweep.scores.empty:
        return '<p class="muted">no scores in this sweep</p>'
    try:
        table = score_table(sweep, reference=reference)
    except Exception as exc:  # noqa: BLE001  (the page still shows everything else)
        return f'<p class="muted">scores table not made: {html.escape(str(exc))}</p>'
    table.insert(
        int(table.columns.get_loc("task")) + 1,
        "data",
        table["task"].map(data_marks(table["task"], task_languages(sweep.scores))),
    )
    tasks = table[~table["task"].map(is_average)]
    shown = [
        c
        for c in SCORE_COLUMNS + (PAPER_COLUMNS if reference else ())
        if c in table.columns
        and (table[c].notna() & (table[c] != "")).any()
        and (c != "language" or tasks[c].nunique() > 1)
    ]  # one language: said by no column
    folded = [c for c in table.columns if c not in shown]
    return (
        unverified_note(table)
        + averages_block(table)
        + (reference_section(sweep, table, reference) if reference else "")
        + f'<div class="wide">{html_table(_text_frame(table[shown]))}</div>'
        f"<details><summary>all columns (with {html.escape(', '.join(folded))})</summary>"
        f'<div class="wide">{html_table(_text_frame(table))}</div></details>'
    )


def unverified_note(table: pd.DataFrame) -> str:
    """A warning naming the tasks scored on unverified data and why (empty when there are none)."""
    reasons = unverified_data(table["task"])
    if not reasons:
        return ""
    items = "".join(f"<li><b>{html.escape(t)}</b>: {html.escape(r)}</li>" for t, r in reasons.items())
    return (
        '<p class="unverified">Scores marked <b>unverified</b> (column data) were computed on data whose '
        "download nothing pins: its files are those its fetch wrote, but no checksum says they are the files "
        f"the paper used (`ablate data verify` says the same):</p><ul>{items}</ul>"
    )


def reference_section(sweep: Sweep, table: pd.DataFrame, reference: str) -> str:
    """The blocks of `--table scores --reference` (and of the freeze table, when the sweep has one to make),
    each with its notes."""
    blocks = reference_blocks("scores", table, reference)
    try:
        blocks += reference_blocks("freeze", freeze_table(sweep, reference=reference), reference)
    except Exception:  # noqa: BLE001  (a sweep without a freeze table still shows the scores' blocks)
        pass
    return "".join(
        f"<h3>{html.escape(title)}</h3>"
        + html_table(_text_frame(frame))
        + "".join(f'<p class="muted">{html.escape(n)}</p>' for n in notes)
        for title, frame, notes in blocks
    )


def averages_block(table: pd.DataFrame) -> str:
    """The paper's summary first, when the tasks span languages: per arm, each language's average and the
    overall one, with the difference from the baseline, its 95% paired-bootstrap interval and p-value; then
    the tasks whose test sets are too small for their metric."""
    avg = table[table["task"].map(is_average)]
    names = average_names(avg["task"])
    return (
        _averages_table(avg, names, str(table["baseline"].iloc[0])) if len(names) > 1 else ""
    ) + _small_tests_note(table)


def _averages_table(avg: pd.DataFrame, names: list[str], baseline: str) -> str:
    cells: dict[str, dict[str, str]] = {}
    for _, r in avg.iterrows():
        text = f"{r['mean']:.1f}"
        if r["delta"] == r["delta"]:
            text += f" ({r['delta']:+.1f}"
            text += f" [{r['ci_low']:+.1f}, {r['ci_high']:+.1f}]" if r["ci_low"] == r["ci_low"] else ""
            p = r["p_value"]
            text += ")" if p != p else f", p {p:.3f})" if p >= 0.001 else ", p < 0.001)"
        cells.setdefault(r["arm"], {})[r["task"]] = text
    frame = pd.DataFrame([{"arm": arm, **row} for arm, row in cells.items()], columns=["arm", *names])
    return (
        f"<p>Averages over tasks (mean score; in brackets the difference from the baseline "
        f"{html.escape(baseline)}, its 95% paired-bootstrap interval and p-value over the pairing units both "
        "arms share).</p>" + html_table(_text_frame(frame.fillna("")))
    )


def _small_tests_note(table: pd.DataFrame) -> str:
    small = small_tests(table)
    if not small:
        return ""
    return (
        '<p class="muted">too few test examples for the metric: '
        + ", ".join(html.escape(f"{t} ({n})") for t, n in small.items())
        + " (ablate.evaluate.sizes.MIN_TEST_EXAMPLES)</p>"
    )


def draw_figures(sweep: Sweep) -> tuple[list[Path], list[str]]:
    """Redraw the registered figures into <sweep>/figures/ (a figure drawn per measure once per measure of the
    layers table, as NAME-MEASURE; one that needs a tune study only in a study's folder, which holds
    study.json); returns the PNGs of the sweep's figure folder (those drawn now first) and a note for each
    figure not drawn."""
    folder = sweep.path / "figures"
    study = (sweep.path / "study.json").is_file()
    measures = sorted(pd.unique(sweep.layers["measure"])) if sweep.layers is not None else []
    jobs = []
    for figure in FIGURES.values():
        if figure.needs_study and not study:
            continue
        if figure.per_measure and measures:
            jobs += [(figure, f"{figure.name}-{m}", {"measure": m}) for m in measures]
        else:
            jobs.append((figure, figure.name, {}))
    drawn, notes = [], []
    for figure, stem, options in jobs:
        try:
            fig, data = figure.draw(sweep, **options)
            drawn.append(save_figure(fig, data, folder / stem, "svg")["png"])
        except Exception as exc:  # noqa: BLE001  (a figure the sweep cannot have is a note on the page)
            notes.append(f"{stem}: {exc}")
    # the registered figures are all redrawn here: an older PNG of one (`--figure layers` writes layers.png,
    # the cka_vs_base measure drawn again as layers-cka_vs_base) would show the same figure twice
    redrawn = {p.stem.split("-")[0] for p in drawn}
    others = (
        sorted(p for p in folder.glob("*.png") if p not in drawn and p.stem not in redrawn)
        if folder.is_dir()
        else []
    )
    return drawn + others, notes


def figures_section(pngs: list[Path], notes: list[str]) -> str:
    parts = []
    for png in pngs:
        data = base64.b64encode(png.read_bytes()).decode()
        parts.append(
            f'<figure><img alt="{html.escape(png.stem)}" src="data:image/png;base64,{data}">'
            f'<figcaption>{html.escape(png.stem)} (<a href="figures/{html.escape(png.name)}">png</a>'
            f")</figcaption></figure>"
        )
    parts = ['<div class="figs">' + "".join(parts) + "</div>"] if parts else []
    if notes:
        parts.append('<p class="muted">not drawn: ' + "; ".join(html.escape(n) for n in notes) + "</p>")
    return "\n".join(parts) or '<p class="muted">no figures</p>'


def failures_section(sweep: Sweep) -> str:
    runs = sweep.runs
    failed = runs[runs["status"] == "failed"]["run_id"] if "status" in runs.columns else []
    parts = []
    for run_id in failed:
        run_dir = sweep.path / "runs" / str(run_id)
        log = run_dir / "log.txt"
        tail = log.read_text(errors="replace").splitlines()[-LOG_LINES:] if log.is_file() else []
        if not tail and (run_dir / "status.json").is_file():
            tail = str(read_status(run_dir).get("error", "")).splitlines()[-LOG_LINES:]
        body = html.escape("\n".join(tail)) or "(no log)"
        parts.append(f"<h3>{html.escape(str(run_id))}</h3><pre>{body}</pre>")
    return "".join(parts) or "<p>none</p>"


def render_page(sweep: Sweep, reference: str | None = None) -> str:
    pngs, notes = draw_figures(sweep)
    # what a reader came for first (results), then how the runs went, then the grid that made them
    sections = [
        ("Scores", scores_section(sweep, reference)),
        ("Tokens", tokens_section(sweep)),
        ("Figures", figures_section(pngs, notes)),
        ("Runs", runs_section(sweep)),
        ("Failures", failures_section(sweep)),
        ("Grid", grid_section(sweep)),
    ]
    nav = "<nav>" + "".join(f'<a href="#{t.lower()}">{t}</a>' for t, _ in sections) + "</nav>"
    body = "".join(f'<h2 id="{t.lower()}">{t}</h2>{s}' for t, s in sections)
    title = html.escape(f"ablate sweep {sweep.name}")
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{STYLE}</style></head><body><h1>{title}</h1>"
        f'<p>{run_counts(sweep)} <span class="muted">· {html.escape(str(sweep.path))} · written '
        f"{time.strftime('%Y-%m-%d %H:%M')}</span></p>{nav}"
        f"{body}<script>{SCRIPT}</script></body></html>\n"
    )


def write_html(
    sweep_dir: str | Path | None = None, out: str | Path | None = None, reference: str | None = None
) -> Path:
    """Write (or refresh) the sweep's page: <sweep>/report.html by default (where its log and figure links
    resolve), or `out` (a folder or an .html path); `reference` (e.g. "paper"): the published numbers beside
    the measured scores."""
    sweep = load_sweep(sweep_dir)
    path = Path(out).expanduser() if out else sweep.path / "report.html"
    if path.is_dir() or not path.suffix:
        path = path / "report.html"
    atomic.write_text(path, render_page(sweep, reference))
    return path


def serve(page: Path, port: int = 0) -> None:
    """Serve the page's folder on 127.0.0.1 until interrupted, printing the page's URL."""
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(page.parent))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"serving http://127.0.0.1:{server.server_address[1]}/{page.name}  (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
