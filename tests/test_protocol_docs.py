"""The fine-tuning protocol as the docs state it is what the code runs: the tables of docs/differences.md and
grids/tasks/README.md are generated from ablate/evaluate/protocol.py (a stale one fails the check), each task's
row holds the settings a task file resolves to under the `paper` profile, the paper's French rows are its own
(2048 tokens for DiaMED, 4096 for the multi-label tasks, the span model's recipe for QUAERO), every rule says
where its numbers come from, and docs/tasks.md's lengths per task are the protocol's."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ablate.cli import protocol_table
from ablate.evaluate import protocol
from ablate.evaluate.tasks import list_tasks, load_task, resolve_settings

ROOT = Path(__file__).resolve().parents[1]


def test_the_protocol_tables_are_what_the_code_gives():
    assert protocol_table.main(["--check"]) == 0, (
        "a protocol table is stale: run `python -m ablate.cli.protocol_table` and commit the pages"
    )


def test_the_check_fails_on_a_stale_table_and_the_rewrite_mends_it_leaving_the_rest(tmp_path):
    page = tmp_path / "differences.md"
    shutil.copy(ROOT / "docs" / "differences.md", page)
    stale = page.read_text().replace("| 2048 |", "| 8192 |")
    page.write_text(stale)
    assert protocol_table.main(["--check", str(page)]) == 1
    assert protocol_table.main([str(page)]) == 0
    mended = page.read_text()
    assert mended == (ROOT / "docs" / "differences.md").read_text()
    outside = mended.split(protocol_table.BEGIN)[0]
    assert "| weight decay |" in outside  # the hand-written rows stay


def test_a_page_without_the_markers_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# a page\n")
    with pytest.raises(ValueError, match="markers are missing"):
        protocol_table.main(["--check", str(page)])


def _rows(page: Path) -> dict[str, list[str]]:
    """task -> its row's cells, read from the page's table."""
    block = page.read_text().split(protocol_table.BEGIN)[1].split(protocol_table.END)[0]
    out = {}
    for line in block.splitlines():
        if line.startswith("| ") and not line.startswith("| tasks |"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            for task in re.findall(r"[\w]+", cells[0].split(": ", 1)[1]):
                out[task] = cells
    return out


@pytest.mark.parametrize("page", protocol_table.PAGES, ids=lambda p: p.parent.name + "/" + p.name)
def test_every_task_has_the_row_of_what_its_file_resolves_to(page):
    rows = _rows(page)
    assert set(rows) == set(list_tasks())
    for name in list_tasks():
        s = resolve_settings(load_task(name), protocol="paper")
        cells = rows[name]
        assert (cells[3], cells[5]) == (str(s.batch_size), str(s.max_length or load_task(name).max_length)), name
        assert float(cells[1].split()[0]) == s.lr and float(cells[2]) == s.weight_decay, name
        trained = f"{s.max_steps} steps" if s.max_steps else f"{s.epochs} epochs"
        assert cells[4].startswith(trained), name


def test_the_french_rows_are_the_papers_own():
    rows = _rows(ROOT / "docs" / "differences.md")
    assert rows["diamed"][5] == "2048" and rows["diamed"][7].startswith("the paper's French recipe")
    for task in ("meddialog_fr", "fracco_30", "fracco_100", "cantemist", "distemist"):
        assert rows[task][5] == "4096" and "multi-label" in rows[task][7], task
    for task in ("quaero_emea_spans", "quaero_medline_spans"):
        assert rows[task][7].startswith("the paper's QUAERO recipe") and rows[task][5] == "1024", task
    assert rows["quaero_emea"][7].startswith("not the paper's")  # token tags: the paper scores the span model
    assert rows["morfitt"][7].startswith("the paper's French recipe") and "not the paper's" in rows["morfitt"][7]


def test_every_task_of_its_own_and_every_rule_says_where_its_numbers_come_from():
    assert set(protocol._TASK_SOURCES) == set(protocol._PAPER_TASKS)
    rules = {(lang, kind) for lang, kind in protocol._PAPER_RULES} | {("fr", "ner")}
    assert rules == set(protocol._RULE_SOURCES)
    assert protocol.paper_source("de", "token_classification").startswith("a language the paper does not cover")


def test_the_lengths_docs_tasks_md_gives_per_task_are_the_protocols():
    text = (ROOT / "docs" / "tasks.md").read_text()
    checked = 0
    for item in re.split(r"\n(?=- )", text):
        head = item.split(":", 1)[0] if item.startswith("- `") else ""  # "- `fracco_30`, `fracco_100`"
        names = re.findall(r"`(\w+)`", head)
        lengths = set(re.findall(r"\b(\d+) tokens\b", item))
        for name in (n for n in names if n in list_tasks()):
            task = load_task(name)
            assert lengths == {str(task.max_length)}, name
            checked += 1
    assert checked >= 5  # diamed, fracco_30, fracco_100, cantemist, distemist, anatem
