"""ablate installs like a package: the wheel built from this checkout, installed (not editable) into a fresh
virtual environment and run from a folder outside the checkout, holds every file of ablate/ and grids/, lists
its shipped grids, tasks and suites, and dry-runs the smoke grid named as the docs name it (grids/smoke.yaml)
with the run ids the checkout gives. The environment gets the wheel alone: its dependencies are this one's,
seen through a .pth file, so the test needs no network."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from ablate.config.paths import given_or_shipped, shipped_grids

ROOT = Path(__file__).resolve().parents[1]
PACKAGED = ("ablate", "grids")  # the folders the wheel is built from, beside the checkout's top-level files
NOT_SHIPPED = ("__pycache__", "*.pyc")
# what points an ablate command at this checkout instead of the installed package
CHECKOUT_VARIABLES = ("PYTHONPATH", "ABLATE_TASKS_DIR", "ABLATE_SUITES_DIR", "ABLATE_RESULTS")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A virtual environment holding the wheel, without its dependencies (this environment's, through a .pth)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy: the build's own build/ folder stays out of the checkout
    for name in PACKAGED:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    for path in ROOT.iterdir():  # pyproject.toml, setup.py, the licence, the README
        if path.is_file():
            shutil.copy2(path, source / path.name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", source], check=True)
    env = tmp / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    purelib = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    outer = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))  # after the venv's own
    (Path(purelib.decode().strip()) / "outer-environment.pth").write_text("\n".join(outer) + "\n")
    wheel = next((tmp / "dist").glob("ablate-*.whl"))
    subprocess.run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], check=True)
    return env


def _elsewhere(env: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """An installed command run in cwd, a folder outside the checkout, with nothing pointing at the checkout."""
    clean = {k: v for k, v in os.environ.items() if k not in CHECKOUT_VARIABLES}
    return subprocess.run([env / "bin" / args[0], *args[1:]], cwd=cwd, env=clean, capture_output=True, text=True)


def _package(env: Path) -> Path:
    found = _elsewhere(env, "python", "-c", "import ablate; print(ablate.__file__)", cwd=env)
    return Path(found.stdout.strip()).parent


@pytest.mark.slow
def test_the_installed_package_is_the_wheel_and_holds_every_file_of_ablate_and_grids(installed):
    package = _package(installed)
    assert package.is_relative_to(installed)
    sources = [p for p in (ROOT / "ablate").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    expected = {
        *(p.relative_to(ROOT) for p in sources),
        *(Path("ablate") / p.relative_to(ROOT) for p in (ROOT / "grids").rglob("*") if p.is_file()),
    }
    assert expected, "nothing found to compare"
    missing = sorted(str(p) for p in expected if not (package.parent / p).is_file())
    assert not missing, f"not in the wheel (pyproject.toml's package-data, setup.py's packages): {missing}"


@pytest.mark.slow
def test_ablate_grids_lists_the_shipped_grids_tasks_and_suites_from_another_folder(installed, tmp_path):
    done = _elsewhere(installed, "ablate", "grids", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    grids = _package(installed) / "grids"
    assert f"grids shipped with ablate, in {grids}:" in done.stdout
    assert "grids/smoke.yaml" in done.stdout and "grids/freeze.yaml" in done.stdout
    tasks = next(line for line in done.stdout.splitlines() if line.startswith("tasks in "))
    suites = next(line for line in done.stdout.splitlines() if line.startswith("suites in "))
    assert tasks.startswith(f"tasks in {grids / 'tasks'}: ") and "ncbi_disease" in tasks
    assert suites.startswith(f"suites in {grids / 'suites'}: ") and "fr_paper" in suites


@pytest.mark.slow
def test_the_smoke_grid_dry_runs_from_another_folder_with_the_checkouts_run_ids(installed, tmp_path, data_root):
    from ablate.config.grid import load_grid
    from ablate.plan.grid import expand

    results = tmp_path / "r"
    done = _elsewhere(
        installed, "ablate", "sweep", "grids/smoke.yaml", "--dry-run", "--results", str(results), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    shipped = _package(installed) / "grids" / "smoke.yaml"
    assert f"reading the copy shipped with ablate: {shipped}" in done.stderr
    run_ids = [run.spec.run_id for run in expand(load_grid(ROOT / "grids" / "smoke.yaml"))]
    assert len(run_ids) == 4 and all(run_id in done.stdout for run_id in run_ids)
    assert not results.exists()  # a dry run writes nothing


def test_a_file_that_exists_is_read_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grids").mkdir()
    (tmp_path / "grids" / "smoke.yaml").write_text("sweep: mine\n")
    assert given_or_shipped("grids/smoke.yaml") == "grids/smoke.yaml"  # the user's own copy wins
    assert given_or_shipped("mine.yaml") == "mine.yaml"  # not found: left to the reader, which names it


def test_grids_name_falls_back_to_the_shipped_copy_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert given_or_shipped("grids/smoke.yaml") == str(shipped_grids() / "smoke.yaml")
    assert f"reading the copy shipped with ablate: {shipped_grids() / 'smoke.yaml'}" in capsys.readouterr().err
    assert given_or_shipped("grids/no_such_grid.yaml") == "grids/no_such_grid.yaml"
    assert given_or_shipped("smoke.yaml") == "smoke.yaml"  # only grids/NAME names the shipped folder


def test_a_missing_grid_is_exit_2_naming_the_path_as_given(tmp_path, monkeypatch, capsys):
    from ablate.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "grids/no_such_grid.yaml", "--dry-run"]) == 2
    assert "grids/no_such_grid.yaml: file not found" in capsys.readouterr().err
