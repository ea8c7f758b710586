"""What a reader looks up matches the code: docs/config.md is what the config models give (every key of every
file format, described in the models themselves), and the command table (docs/commands.md) lists every subcommand, flag,
choice, figure, table and exit code of the command line."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from ablate.cli import reference
from ablate.cli.commands import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from ablate.cli.parser import build_parser
from ablate.report.registry import FIGURES
from ablate.report.paper_tables import TABLES

ROOT = Path(__file__).resolve().parents[1]
# a flag several subcommands share (through a parent parser) may be named once for all of them
SHARED = 3


def test_the_key_reference_is_what_the_models_give():
    assert (ROOT / "docs" / "config.md").read_text() == reference.render(), (
        "docs/config.md is stale: run `python -m ablate.cli.reference` and commit the page"
    )


def test_every_key_says_what_it_does():
    assert reference.undescribed() == [], "give these fields a Field(description=...) in their model"


def test_the_reference_check_fails_on_a_stale_page(tmp_path):
    page = tmp_path / "config.md"
    assert reference.main(["--out", str(page)]) == 0
    assert reference.main(["--check", "--out", str(page)]) == 0
    page.write_text(page.read_text().replace("| `seq_len` |", "| `sequence_length` |"))
    assert reference.main(["--check", "--out", str(page)]) == 1


def _subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """'run', 'sweep', ..., 'data fetch' -> the parser of that (sub)command."""
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _subcommands(sub, f"{prefix}{name} ")
                out.update(nested or {f"{prefix}{name}": sub})
    return out


def _flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.option_strings and a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
    ]


def _commands_section() -> str:
    text = (ROOT / "docs" / "commands.md").read_text()
    return text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]


def _rows(command: str) -> str:
    """The command table's rows whose first cell shows `ablate COMMAND`."""
    rows = [line for line in _commands_section().splitlines() if line.startswith("| `ablate")]
    pattern = re.compile(rf"`ablate {re.escape(command)}(?=[ `])")
    return "\n".join(r for r in rows if pattern.search(r.split(" | ")[0]))


COMMANDS = _subcommands(build_parser())


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_command_table_lists_every_subcommand_with_its_flags(command):
    rows = _rows(command)
    assert rows, f"the command table (docs/commands.md) has no row for `ablate {command}`"
    counts: dict[str, int] = {}
    for sub in COMMANDS.values():
        for action in _flags(sub):
            counts[action.option_strings[-1]] = counts.get(action.option_strings[-1], 0) + 1
    missing = []
    for action in _flags(COMMANDS[command]):
        flag = action.option_strings[-1]
        where = _commands_section() if counts[flag] >= SHARED else rows
        if not re.search(rf"{re.escape(flag)}(?![\w-])", where):
            missing.append(flag)
        missing += [
            f"{flag} {c}" for c in action.choices or () if not re.search(rf"\b{re.escape(str(c))}\b", where)
        ]
    assert missing == [], f"`ablate {command}`: the command table (docs/commands.md) lacks {missing}"


@pytest.mark.parametrize("flag, names", [("--figure", FIGURES), ("--table", TABLES)])
def test_the_command_table_names_every_figure_and_table(flag, names):
    rows = [r for r in _rows("report").splitlines() if flag in r.split(" | ")[0]]
    assert rows, f"no row of `ablate report {flag}`"
    assert [n for n in names if not re.search(rf"\b{n}\b", rows[0].split(" | ")[0])] == []


def test_the_command_table_names_every_exit_code():
    paragraph = next(p for p in _commands_section().split("\n\n") if p.startswith("Exit codes"))
    codes = {int(c) for c in re.findall(r"\b(\d+)\s", paragraph)}
    assert {EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED} <= codes
