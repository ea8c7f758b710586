"""A layer probe's task source that names no task (probe.texts: task:NAME) is bad input wherever it is read:
the dry run, a submission, `ablate run` and `ablate data fetch` exit 2 naming the grid or run spec, the key
probe.texts, the source as written and the tasks there are, before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from ablate.cli import main
from builders import tiny_grid, tiny_grid_spec, write_yaml


def _grid(tmp_path: Path) -> Path:
    grid = tiny_grid()
    grid["base"]["probe"] = {**grid["base"]["probe"], "texts": ["corpus_en_e3c/valid.txt", "task:nosuch"]}
    return write_yaml(tmp_path / "grid.yaml", grid, sort_keys=False)


def _run_spec(tmp_path: Path) -> Path:
    spec = tiny_grid_spec()
    spec["probe"] = {**spec["probe"], "texts": "task:nosuch"}
    return write_yaml(tmp_path / "run.yaml", spec, sort_keys=False)


@pytest.mark.parametrize(
    "command",
    [
        lambda p, t: ["sweep", str(_grid(t)), "--dry-run", "--results", str(p)],
        lambda p, t: ["sweep", str(_grid(t)), "--results", str(p)],
        lambda p, t: ["run", str(_run_spec(t)), "--results", str(p)],
        lambda p, t: ["data", "fetch", str(_grid(t)), "--data-root", str(p)],
    ],
    ids=["dry run", "submission", "run", "data fetch"],
)
def test_a_probe_source_naming_no_task_exits_2_naming_the_file_and_probe_texts(tmp_path, capsys, command):
    out_dir = tmp_path / "out"
    argv = command(out_dir, tmp_path)
    rc = main(argv)
    err = capsys.readouterr().err
    written = next(a for a in argv if a.endswith(".yaml"))
    assert rc == 2 and not out_dir.exists(), err
    assert err.startswith(f"error: {written}: probe.texts: unknown task; got 'task:nosuch'; allowed: "), err
    assert "ncbi_disease" in err  # the tasks there are
