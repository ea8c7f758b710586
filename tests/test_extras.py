"""Optional libraries: each is in its extra of pyproject.toml and out of the base install, and a missing one is
an exit-2 error naming `pip install 'ablate[EXTRA]'`, raised before anything runs where a file asks for it (a
grid's tracker, an hf: corpus, a `format: hf` task, a MySQL storage) or at its use (`ablate dashboard`). A
library is made missing here the way Python sees it: None in sys.modules."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from ablate.cli import main
from ablate.config import extras
from ablate.config.errors import SpecError
from builders import tiny_grid, write_yaml

ROOT = Path(__file__).resolve().parents[1]


def _missing(monkeypatch, module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)


def _grid(tmp_path: Path, **base) -> Path:
    """The tiny grid with `base` keys replaced, and no held-out corpus or probe (nothing else to check)."""
    grid = tiny_grid()
    grid["base"].pop("probe")
    grid["base"]["data"].pop("valid_corpus")
    grid["base"].update(base)
    return write_yaml(tmp_path / "grid.yaml", grid)


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_each_optional_library_is_in_its_extra_and_out_of_the_base_install():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = _requirement_names(project["dependencies"])
    optional = project["optional-dependencies"]
    for module, extra in extras.EXTRA_OF.items():
        name = module.replace("_", "-")
        assert name in _requirement_names(optional[extra]), f"{name} not in the {extra} extra"
        assert name not in base, f"{name} is in the base install"
    assert f"ablate[{','.join(sorted(set(extras.EXTRA_OF.values())))}]" in optional["dev"]  # the tests need all


@pytest.mark.parametrize("module", sorted(extras.EXTRA_OF))
def test_a_missing_library_names_its_extra(monkeypatch, module):
    _missing(monkeypatch, module)
    assert not extras.installed(module)
    for call in (extras.require, extras.load):
        with pytest.raises(SpecError) as e:
            call(module, "this", file="f.yaml", key="k")
        assert e.value.allowed == f"pip install 'ablate[{extras.EXTRA_OF[module]}]'"
        assert e.value.file == "f.yaml" and e.value.key == "k"
        assert f"needs the {module!r} package, which is not installed" in e.value.message


def test_an_installed_library_loads():
    assert extras.installed("yaml") and extras.load("yaml", "this") is yaml


def test_a_grid_with_a_tracker_not_installed_is_refused_at_its_dry_run(tmp_path, monkeypatch, capsys):
    _missing(monkeypatch, "mlflow")
    grid = _grid(tmp_path, tracking={"tensorboard": True, "mlflow": True})
    assert main(["sweep", str(grid), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{grid}: tracking.mlflow: the mlflow tracker needs the 'mlflow' package, which is not installed" in err
    assert "allowed: pip install 'ablate[trackers]'" in err


def test_a_grid_with_a_hub_corpus_and_no_datasets_is_refused_at_its_dry_run(tmp_path, monkeypatch, capsys):
    _missing(monkeypatch, "datasets")
    data = {"corpus": "hf:org/corpus", "max_documents": 60, "seq_len": 32}
    assert main(["sweep", str(_grid(tmp_path, data=data)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "data.corpus: a hub corpus needs the 'datasets' package" in err and "'hf:org/corpus'" in err
    assert "allowed: pip install 'ablate[hf]'" in err


def test_a_saved_datasets_folder_without_datasets_names_the_extra(tmp_path, monkeypatch):
    from ablate.config.spec import DataSpec
    from ablate.data.readers import resolve_sources

    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "dataset_info.json").write_text("{}")
    _missing(monkeypatch, "datasets")
    with pytest.raises(SpecError) as e:
        resolve_sources(DataSpec(corpus=str(folder)))
    assert e.value.key == "data.corpus" and e.value.allowed == "pip install 'ablate[hf]'"


def test_a_format_hf_task_without_datasets_names_the_extra(tmp_path, monkeypatch):
    from ablate.evaluate.tasks import load_task, load_task_data

    task = {
        "name": "toy_hf",
        "language": "en",
        "type": "sequence_classification",
        "source": "tests",
        "data": {"format": "hf", "dataset": "hf:org/no-extra", "splits": {"train": "a", "dev": "b", "test": "c"}},
        "columns": {"text": "text", "label": "label"},
        "metrics": ["accuracy"],
    }
    path = tmp_path / "toy_hf.yaml"
    path.write_text(yaml.safe_dump(task))
    _missing(monkeypatch, "datasets")
    with pytest.raises(SpecError) as e:
        load_task_data(load_task(str(path)), tmp_path)
    assert e.value.file == str(path) and e.value.key == "data.format"
    assert e.value.allowed == "pip install 'ablate[hf]'"


def test_a_mysql_storage_without_its_driver_names_the_tune_extra(monkeypatch):
    from ablate.tune.rdb import check_driver

    _missing(monkeypatch, "pymysql")
    with pytest.raises(SpecError) as e:
        check_driver("mysql+pymysql://optuna:secret@127.0.0.1:3307/optuna")
    assert e.value.key == "storage" and e.value.allowed.startswith("pip install 'ablate[tune]'")


def test_the_dashboard_without_optuna_dashboard_names_the_tune_extra(tmp_path, monkeypatch, capsys):
    _missing(monkeypatch, "optuna_dashboard")
    assert main(["dashboard", "--storage", f"sqlite:///{tmp_path / 'study.db'}", "--port", "0"]) == 2
    assert "allowed: pip install 'ablate[tune]'" in capsys.readouterr().err
    assert not (tmp_path / "study.db").exists()  # refused before the storage is opened
