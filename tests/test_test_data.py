"""The data the tests read: the `tests` set of ablate/data/sets.yaml names exactly the datasets the tests read,
`ablate data fetch tests` finds them in place in a data root that holds them, and a run on a data root that
lacks them says once which command fetches them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ablate.cli import main
from ablate.data.catalog import catalog, dataset_sets
from ablate.evaluate.suites import list_suites
from ablate.evaluate.tasks import list_tasks
from ablate.launch.data_needs import target_datasets

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _test_sources() -> str:
    """The tests' own code and grids (not tests/data: the upstream samples the converters read)."""
    files = [*TESTS.glob("*.py"), *TESTS.glob("grids/*.yaml")]
    return "\n".join(p.read_text(encoding="utf-8") for p in files if p.name != Path(__file__).name)


def datasets_the_tests_read() -> set[str]:
    """Datasets the tests name, those of the tasks and suites they name, and those of every shipped task (the
    task files' tests fine-tune on each); not the `checked: derived` ones (no copy of their data can be in a
    test data root: tests/test_paper_data.py serves its own upstream fixtures)."""
    text = _test_sources()
    words = set(re.findall(r"[A-Za-z0-9_]+", text))
    named = {name for name in catalog() if name in words}
    suites = set(re.findall(r"suite:([A-Za-z0-9_]+)", text)) & set(list_suites())
    read = {ds.name for task in list_tasks() for ds in target_datasets(task)}
    read |= {ds.name for suite in suites for ds in target_datasets(f"suite:{suite}")}
    return {name for name in named | read if not catalog()[name].derived}


def test_the_tests_set_names_exactly_what_the_tests_read():
    assert set(dataset_sets()["tests"]) == datasets_the_tests_read()


def test_fetching_the_tests_set_into_a_root_that_holds_it_fetches_nothing(data_root, capsys):
    assert main(["data", "fetch", "tests", "--data-root", str(data_root)]) == 0
    out = capsys.readouterr().out
    n = len(dataset_sets()["tests"])
    assert f"fetching {n} datasets into {data_root.absolute()}" in out
    assert f"done: 0 fetched, {n} already in place" in out
    assert out.count("in place, every file matches the manifest") == n


@pytest.mark.slow
def test_a_run_without_the_data_says_once_which_command_fetches_it(tmp_path):
    env = {**os.environ, "ABLATE_DATA_ROOT": str(tmp_path / "empty")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_grid.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 4, said  # pytest's usage error: nothing was collected
    assert said.count("`.venv/bin/ablate data fetch tests`") == 1, said
    assert f"the data root {tmp_path / 'empty'} lacks datasets the tests read (ncbi_disease," in said
    assert "Traceback" not in said and "passed" not in said
