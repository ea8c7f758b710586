"""The README and the pages under docs/ as a reader meets them: the README opens with the two commands CI and
users run, every relative link, anchor and image resolves, every page under docs/ is listed in the README, every
repository path they name exists, and a YAML example said to come from a shipped grid is made of that grid's
own lines (so a grid that changes fails here until its example follows)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ablate.config.base import parse_yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FIRST_COMMANDS = [
    # the main job on a fresh machine: the smoke grid's data fetched into the default root first
    "bash scripts/setup.sh && .venv/bin/ablate data fetch grids/smoke.yaml && .venv/bin/ablate sweep grids/smoke.yaml",
    # the whole test suite (Slurm, MariaDB and Chromium installed as root), after fetching what the tests read
    "bash scripts/setup.sh --with-slurm && export SLURM_CONF=${ABLATE_SLURM_DIR:-/tmp/ablate-slurm}/etc/slurm.conf \\\n"
    "  && .venv/bin/ablate data fetch tests"
    " && ABLATE_REQUIRE_SLURM=1 ABLATE_REQUIRE_CHROMIUM=1 .venv/bin/python -m pytest -q",
    # the same without root: the Slurm and Chromium tests skip
    "bash scripts/setup.sh && .venv/bin/ablate data fetch tests && .venv/bin/python -m pytest -q",
]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# a path of this repository in backticks (under ablate/ only modules and folders: an exported model's
# `ablate/spec.json` is a folder of the export, not of the repository)
REPO_PATH = re.compile(r"`(ablate/[\w/]*(?:\.py)?|(?:grids|bench|scripts|tests|docs|analysis_notebooks)/[\w./-]*)`")
GRID_FILE = re.compile(r"grids/[\w/-]+\.yaml")


def _prose(text: str) -> str:
    """The text a reader sees outside code blocks and HTML comments."""
    return FENCE.sub("", COMMENT.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in _prose(page.read_text()).splitlines() if line.startswith("#")}


def test_the_readme_opens_with_the_main_job_and_the_tests():
    blocks = [body.rstrip("\n") for lang, body in FENCE.findall((ROOT / "README.md").read_text())[:3]]
    assert blocks == FIRST_COMMANDS


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_anchor_and_image_resolves(page):
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with that anchor in {resolved.name}")
    assert not broken, f"{page.name}: {broken}"


def test_every_page_under_docs_is_listed_in_the_readme():
    listed = {Path(t).name for t in LINK.findall(_prose((ROOT / "README.md").read_text())) if t.startswith("docs/")}
    assert {p.name for p in PAGES[1:]} <= listed


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_repository_path_named_exists(page):
    named = REPO_PATH.findall(COMMENT.sub("", page.read_text()))
    assert named, f"{page.name} names no repository path: the pattern no longer matches its style"
    assert [p for p in named if not (ROOT / p).exists()] == []


def _grid_examples() -> list[tuple[str, str, str]]:
    """(page, grid, YAML block) for each yaml block whose paragraph right before it names exactly one grid."""
    found = []
    for page in PAGES:
        text = COMMENT.sub("", page.read_text())
        for match in FENCE.finditer(text):
            if match.group(1) != "yaml":
                continue
            paragraph = text[: match.start()].rstrip().rsplit("\n\n", 1)[-1]
            grids = set(GRID_FILE.findall(paragraph))
            if len(grids) == 1:
                found.append((page.name, grids.pop(), match.group(2)))
    return found


EXAMPLES = _grid_examples()


def test_the_concepts_take_their_examples_from_the_grids():
    assert len([e for e in EXAMPLES if e[0] == "README.md"]) == 6       # run, phase, objective, ...


@pytest.mark.parametrize("page, grid, block", EXAMPLES, ids=[f"{p}-{g}-{i}" for i, (p, g, _) in enumerate(EXAMPLES)])
def test_a_grid_example_is_made_of_that_grids_lines(page, grid, block):
    parse_yaml(block, file=page)
    lines = {line.strip() for line in (ROOT / grid).read_text().splitlines()}
    assert [line for line in block.splitlines() if line.strip() and line.strip() not in lines] == []
