"""The fine-tuning protocol's table in docs/differences.md and grids/tasks/README.md, generated from the code:
each row's numbers and where they come from are ablate/evaluate/protocol.py's (paper_settings, paper_source),
the tasks it covers are the task registry's (each task's language and type), the paper's own tasks are those
of its suites (fr_paper, en_paper). The rest of both pages is written by hand; the table sits between two
marker lines, so a page and the code cannot disagree (tests/test_protocol_docs.py).

    python -m ablate.cli.protocol_table            # rewrite the table in both pages
    python -m ablate.cli.protocol_table --check    # exit 1 when a page's table is not what the code gives

It reads the protocol of evaluate, the task registry and the suites.

May import: every stage.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from ablate.evaluate.protocol import (
    HARNESS,
    HARNESS_LENGTH,
    paper_settings,
    paper_source,
    smoke_settings,
    task_kind,
)
from ablate.evaluate.suites import load_suite
from ablate.evaluate.tasks import list_tasks, load_task

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "docs" / "differences.md", ROOT / "grids" / "tasks" / "README.md")
BEGIN = (
    "<!-- the fine-tuning protocol's table: generated from ablate/evaluate/protocol.py by "
    "`python -m ablate.cli.protocol_table` (edit the code, not this table) -->"
)
END = "<!-- end of the generated table -->"
PAPER_SUITES = ("fr_paper", "en_paper")
KINDS = {"classification": "classification", "ner": "NER (token tags)", "span_ner": "nested NER (span_ner)"}
INTRO = (
    "The `paper` profile, task by task: each row's numbers are what `ablate/evaluate/protocol.py` sets for the "
    "tasks it lists (the paper's own tasks in bold), and the last column says where they come from: \"the "
    "paper\" is its appendix on fine-tuning, public in the first author's thesis (github Rian-T/thesis at "
    '0c3a71a, sources/part_2/chapter5/article.tex: "Fine-tuning Protocol" and the task table "Evaluation '
    'tasks"); tabib is the paper\'s harness (github Rian-T/tabib at 16649393); "not the paper\'s" marks '
    "ablate's own choice."
)


class Row:
    """One line of the table: the settings some tasks share and where they come from."""

    def __init__(self, settings: dict[str, Any], source: str, label: str, max_length: int):
        self.settings, self.source, self.label, self.max_length = settings, source, label, max_length
        self.tasks: list[tuple[str, bool]] = []  # (task, one of the paper's)

    def cells(self) -> list[str]:
        s = self.settings
        lr = _number(s["lr"]) + (f" (head {_number(s['head_lr'])})" if s.get("head_lr") else "")
        if s.get("max_steps"):
            trained = f"{s['max_steps']} steps, a dev evaluation every {s['eval_every']}"
            kept = "the best dev evaluation"
        else:
            trained = f"{s['epochs']} epochs" + (
                f", encoder frozen ({s['probe']} probe)" if s.get("probe") else ""
            )
            kept = "the best dev epoch" + (" (no early stop)" if s.get("patience") is None else "")
        tasks = ", ".join(f"**{t}**" if paper else t for t, paper in self.tasks)
        return [
            f"{self.label}: {tasks}",
            lr,
            _number(s["weight_decay"]),
            str(s["batch_size"]),
            trained,
            str(self.max_length),
            kept,
            self.source,
        ]


def _number(value: float) -> str:
    """A learning rate or a weight decay as the paper writes it: 5e-5, 1e-3, 0.01."""
    text = f"{value:.0e}" if 0 < value < 0.01 else f"{value:g}"
    return re.sub(r"e-0*(\d)", r"e-\1", text)


def rows() -> list[Row]:
    """The table's rows: tasks grouped by their settings and source, in the order of KINDS, then language."""
    paper = {item for suite in PAPER_SUITES for item in load_suite(suite).tasks}
    grouped: dict[str, Row] = {}
    for name in list_tasks():
        task = load_task(name)
        kind = task_kind(task.type)
        settings = paper_settings(task.language, task.type, name)
        source = paper_source(task.language, task.type, name)
        label = f"{KINDS[kind]}, {task.language}"
        key = repr((list(KINDS).index(kind), task.language, task.max_length, sorted(settings.items()), source))
        grouped.setdefault(key, Row(settings, source, label, task.max_length)).tasks.append((name, name in paper))
    return [grouped[k] for k in sorted(grouped)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The block between the markers, markers included."""
    head = ["tasks", "lr", "weight decay", "batch", "trained for", "max_length", "model kept", "where from"]
    lines = [BEGIN, INTRO, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row.cells()) + " |" for row in rows()]
    smoke = smoke_settings()
    en, fr = paper_settings("en", "multi_label_classification"), paper_settings("fr", "multi_label_classification")
    lines += [
        "",
        "max_length is each task file's (`max_length`; no profile sets a length): the English tasks' is "
        f"{HARNESS_LENGTH}. English rows: {HARNESS}'s harness, each setting with its file and line in the last "
        f"column (warmup_ratio {en['warmup_ratio']}, precision {en['precision']}, `pooling: {en['pooling']}`, "
        f"multi_label_pos_weight {en['multi_label_pos_weight']}, group_by_length {en['group_by_length']}, "
        f"data_seed {en['data_seed']}). French classification rows: a linear warmup over "
        f"{fr['warmup_ratio']:.0%} of the steps, `pooling: {fr['pooling']}`, a BCE weighted by label "
        f"frequencies (`multi_label_pos_weight`), each seed seeding everything. The `smoke` "
        f"profile (not the paper's: a CPU budget) sets lr {_number(smoke['lr'])}, batch {smoke['batch_size']}, "
        f"{smoke['epochs']} epochs on the first {smoke['max_train_examples']} training and "
        f"{smoke['max_eval_examples']} dev / test examples, {smoke['max_length']} tokens, for every task.",
        END,
    ]
    return "\n".join(lines)


def replaced(page: str, block: str, where: str) -> str:
    """The page with its generated block replaced by `block`; ValueError when the markers are not there once."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise ValueError(f"{where}: the generated table's markers are missing (or there twice): {BEGIN} ... {END}")
    start, stop = page.index(BEGIN), page.index(END) + len(END)
    return page[:start] + block + page[stop:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ablate.cli.protocol_table", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a page's table differs from the code")
    ap.add_argument(
        "pages", nargs="*", type=Path, help="the pages (default: docs/differences.md, grids/tasks/README.md)"
    )
    args = ap.parse_args(argv)
    block, stale = render(), []
    for page in args.pages or PAGES:
        text = page.read_text(encoding="utf-8")
        new = replaced(text, block, str(page))
        if new == text:
            continue
        if args.check:
            stale.append(str(page))
        else:
            page.write_text(new, encoding="utf-8")
            print(f"wrote {page}")
    if stale:
        print(f"stale: {', '.join(stale)}: run python -m ablate.cli.protocol_table", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
