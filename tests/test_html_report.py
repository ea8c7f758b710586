"""`ablate report --html`: the sweep's page, opened in headless Chromium, renders its tables and every figure
(no broken image, no script error), opens on the scores and figures with the grid's YAML folded, works without
network, sorts its runs table, shows the failures' logs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_report import write_sweep  # noqa: E402

from ablate.report.html import write_html  # noqa: E402
from ablate.report.registry import make_figure  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# Put first in <head>: records script errors, and after load writes what rendered into <pre id="probe">;
# then clicks the runs table's first header twice (descending sort) to check the sorting script.
PROBE = """<script>window.__errors=[];window.addEventListener('error',function(e){window.__errors.push(String(e.message))});
window.addEventListener('load',function(){var imgs=[].slice.call(document.images);
var th=document.querySelector('#runs + table th');th.click();th.click();
var d=document.createElement('pre');d.id='probe';d.textContent=JSON.stringify({images:imgs.length,
broken:imgs.filter(function(i){return !(i.complete&&i.naturalWidth>0)}).map(function(i){return i.alt}),
tables:document.querySelectorAll('table').length,alts:imgs.map(function(i){return i.alt}),
scores_overflow:(function(w){return w.scrollWidth-w.clientWidth})(document.querySelector('#scores ~ .wide')),
first_run:document.querySelector('#runs + table tbody tr td').textContent,errors:window.__errors,
screen:window.innerHeight,top:{scores:document.querySelector('#scores ~ .wide table').getBoundingClientRect().top,
figure:document.images[0].getBoundingClientRect().top,runs:document.getElementById('runs').getBoundingClientRect().top},
yaml_height:document.querySelector('#grid ~ details').getBoundingClientRect().height});
document.body.appendChild(d);});</script>"""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    message = "Chromium is not installed (scripts/install-system-deps.sh installs it): the HTML page is NOT tested"
    if os.environ.get("ABLATE_REQUIRE_CHROMIUM") == "1":
        pytest.fail(message)
    warnings.warn(message)
    pytest.skip(message)


def headless(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    sweep = write_sweep(tmp_path_factory.mktemp("html") / "syn")
    shutil.copy(REPO / "grids" / "smoke.yaml", sweep / "grid.yaml")
    failed = sweep / "runs" / "tiny-bert-clm-low-s2"
    failed.mkdir(parents=True)
    (failed / "log.txt").write_text(
        "".join(f"line {i}\n" for i in range(30)) + "failed: FloatingPointError: nan\n"
    )
    make_figure("layers", sweep)  # `ablate report --figure layers` first: figures/layers.png
    return write_html(sweep)


@pytest.mark.slow
def test_the_page_renders_tables_and_every_figure_in_chromium(page):
    probed = page.with_name("probe.html")
    probed.write_text(page.read_text().replace("<head>", "<head>" + PROBE, 1))
    done = headless("--virtual-time-budget=10000", "--window-size=1400,1400", "--dump-dom", probed.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout)
    assert found, done.stdout[-2000:]
    probe = json.loads(found.group(1).replace("&quot;", '"'))
    figures = sorted(p.stem for p in (page.parent / "figures").glob("*.png"))
    assert {"curves", "deltas", "freeze", "layers", "layers-cka_vs_base", "layers-grad_norm"} <= set(figures)
    # layers.png (the CKA figure `--figure layers` drew) is the page's layers-cka_vs_base: shown once
    assert sorted(probe["alts"]) == sorted(set(figures) - {"layers"}) and probe["broken"] == []
    assert probe["tables"] == 3 and probe["errors"] == []  # runs, scores and all its columns folded; no error
    assert probe["scores_overflow"] == 0  # no sideways scroll at 1400 px
    assert probe["first_run"] == "tiny-bert-mlm-none-s2"  # sorted descending by run_id
    assert "Uncaught" not in done.stderr and ":ERROR:CONSOLE" not in done.stderr
    # the first screen: the scores table and the first figure; the runs below them; the grid's YAML folded
    top = probe["top"]
    assert top["scores"] < top["figure"] < probe["screen"] < top["runs"], probe
    assert 0 < probe["yaml_height"] < 40  # one summary line, not 51 of YAML


def test_the_page_puts_results_first_and_folds_the_grid(page):
    text = page.read_text()
    assert re.findall(r'<h2 id="(\w+)">', text) == ["scores", "tokens", "figures", "runs", "failures", "grid"]
    folded = re.search(
        r"<details><summary>grid\.yaml \((\d+) lines\)</summary><pre>(.*?)</pre></details>", text, re.S
    )
    grid = (REPO / "grids" / "smoke.yaml").read_text()
    assert folded and int(folded.group(1)) == len(grid.splitlines())
    assert "sweep: smoke" in folded.group(2) and text.count("sweep: smoke") == 1  # the YAML only there
    assert text.index("11 done, 1 failed") < text.index('<h2 id="scores">')  # the run counts on top


@pytest.mark.slow
def test_the_page_needs_no_network_and_screenshots(page):
    text = page.read_text()
    assert not re.search(r'(src|href)="(https?:)?//', text)  # nothing fetched from elsewhere
    shot = page.with_name("shot.png")
    done = headless("--window-size=1280,1400", f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0 and shot.stat().st_size > 20_000, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_failures_show_their_last_log_lines_and_rerunning_refreshes(page):
    text = page.read_text()
    assert "failed: FloatingPointError: nan" in text and "line 29" in text and "line 5\n" not in text
    assert 'href="runs/tiny-bert-clm-low-s2/log.txt"' in text
    (page.parent / "runs" / "tiny-bert-clm-low-s2" / "log.txt").write_text("retried: out of memory\n")
    write_html(page.parent)
    assert "retried: out of memory" in page.read_text()


@pytest.mark.slow
def test_cli_writes_the_page(tmp_path):
    sweep = write_sweep(tmp_path / "cli")
    done = subprocess.run(
        [sys.executable, "-m", "ablate.cli", "report", str(sweep), "--html"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"html: {sweep / 'report.html'}" in done.stdout and (sweep / "report.html").is_file()


@pytest.mark.slow
def test_a_bilingual_sweeps_page_leads_with_the_language_averages_in_chromium(tmp_path):
    sweep = write_sweep(
        tmp_path / "bi",
        clm_gain=0.03,
        languages={"ner_a": "en", "cls_b": "fr", "sts_c": "en"},
        n_examples={"ner_a": 500, "cls_b": 300, "sts_c": 20},
    )
    shutil.copy(REPO / "grids" / "smoke.yaml", sweep / "grid.yaml")
    page = write_html(sweep)
    text = page.read_text()
    scores = text[text.index('<h2 id="scores">') : text.index('<h2 id="tokens">')]
    assert scores.index("<th>average (en)</th><th>average (fr)</th><th>average</th>") < scores.index(
        'class="wide"'
    )
    assert "too few test examples for the metric: sts_c (20)" in scores
    probed = page.with_name("probe.html")
    probed.write_text(text.replace("<head>", "<head>" + PROBE, 1))
    done = headless("--virtual-time-budget=10000", "--window-size=1280,1400", "--dump-dom", probed.as_uri())
    probe = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', done.stdout).group(1).replace("&quot;", '"'))
    assert (
        probe["tables"] == 4 and probe["errors"] == [] and probe["broken"] == []
    )  # averages, scores (+ folded), runs
    assert "Uncaught" not in done.stderr


@pytest.mark.slow
def test_the_scores_table_folds_what_most_readers_skip_and_one_task_has_no_average_row(tmp_path):
    from test_report import rewrite
    import pandas as pd

    sweep = write_sweep(tmp_path / "one")
    scores = pd.read_parquet(sweep / "scores.parquet")
    rewrite(sweep, "scores", scores[scores["task"] == "ner_a"])
    text = write_html(sweep).read_text()
    section = text[text.index('<h2 id="scores">') : text.index('<h2 id="tokens">')]
    shown, folded = section.split("<details>", 1)
    assert "<td>ner_a</td>" in shown and "average" not in section  # one task: no row repeating it
    assert "<th>delta</th>" in shown and "<th>p_value</th>" in shown
    for column in ("ci_low", "ci_high", "n_pairs", "units"):
        assert f"<th>{column}</th>" not in shown and f"<th>{column}</th>" in folded
    assert re.search(r"<summary>all columns \(with [^<]*ci_low, ci_high[^<]*n_pairs", folded)
