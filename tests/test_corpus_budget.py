"""A corpus too small for a run's budget is refused, not looped over silently: the epochs a run reads its
corpus (ablate.plan.epochs) against a direct count, the dry run's epochs column and warnings, and the
refusal (exit 2) by `ablate run`, by a run's own start (setup, the worker), by a local sweep after its
corpus is prepared and by a Slurm submission of a prepared corpus; `data.max_epochs` allows repetition.
The paper grids name a corpus the user supplies: their dry run warns that it is missing, a real sweep
refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.config.spec import DataSpec, parse_run_spec
from ablate.data.corpus import SequenceOrder, read_documents, tokenize_documents
from ablate.plan.epochs import CorpusSize, check_epochs, corpus_epochs, epochs_cell
from builders import corpus_slice, run_spec, tiny_grid, write_yaml

REPO = Path(__file__).resolve().parents[1]
FREEZE = REPO / "grids" / "freeze.yaml"
SLICE = corpus_slice(max_documents=5)
BATCH = 4


@pytest.fixture(scope="module")
def slice_tokens(data_root, minilm_tokenizer) -> int:
    """The tokens of the corpus slice, counted directly: every document through the tokenizer."""
    return len(tokenize_documents(read_documents(DataSpec(**SLICE)), minilm_tokenizer).tokens)


@pytest.fixture(autouse=True)
def _own_prepared_root(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_PREPARED", str(tmp_path / "prepared"))


def spec_dict(steps: int, **data) -> dict:
    return run_spec(
        data={**SLICE, **data},
        batch_size=BATCH,
        checkpoint_every=100,
        log_every=5,
        phases=[{"name": "mlm", "objective": "mlm", "steps": steps}],
    )


def steps_over_one_epoch(tokens: int) -> int:
    """Enough steps to read the slice once and a bit (between 1 and 2 epochs)."""
    sequences = tokens // SLICE["seq_len"]
    assert sequences >= 4 * BATCH, "the slice is too small for this test"
    return sequences // BATCH + 2


def error_line(err: str) -> str:
    """The CLI's error line (stderr also holds the preparation's and the run's log)."""
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    return line


# ------------------------------------------------------------------------------------------- arithmetic


def test_epochs_are_the_sequences_the_run_reads_over_those_the_corpus_packs(slice_tokens):
    steps = steps_over_one_epoch(slice_tokens)
    spec = parse_run_spec(
        {
            **spec_dict(steps),
            "phases": [
                {"name": "warm", "objective": "mlm", "steps": 2},  # every phase counts, a prelude too
                {"name": "clm", "objective": "clm", "steps": steps - 2},
            ],
        }
    )
    sequences = slice_tokens // SLICE["seq_len"]
    order = SequenceOrder(sequences, spec.data.data_seed)
    read = np.concatenate([order.take(step * BATCH, BATCH) for step in range(steps)])
    reads_per_sequence = np.bincount(read, minlength=sequences)
    assert corpus_epochs(spec, slice_tokens) == pytest.approx(reads_per_sequence.sum() / sequences, rel=1e-12)
    assert reads_per_sequence.max() == 2 and reads_per_sequence.min() == 1  # the order looped once
    assert 1 < corpus_epochs(spec, slice_tokens) < 2
    assert corpus_epochs(spec, SLICE["seq_len"] - 1) == float("inf")  # not one sequence


def test_exactly_max_epochs_passes_are_allowed_and_one_step_more_is_not():
    corpus_tokens = 10 * BATCH * SLICE["seq_len"]  # 40 sequences: 10 steps are one epoch
    check_epochs(parse_run_spec(spec_dict(steps=10)), corpus_tokens)
    with pytest.raises(SpecError) as err:
        check_epochs(parse_run_spec(spec_dict(steps=11)), corpus_tokens, file="run.yaml")
    assert err.value.key == "data.max_epochs" and err.value.file == "run.yaml" and err.value.value == 1.0
    assert "at least 1.1 for this run" in str(err.value) and f"at least {44 * 32:,} tokens" in str(err.value)
    check_epochs(parse_run_spec(spec_dict(steps=11, max_epochs=1.1)), corpus_tokens)


def test_the_dry_runs_epochs_cell_says_how_it_knows():
    spec = parse_run_spec(spec_dict(steps=10))  # 40 sequences of 32 tokens
    assert epochs_cell(spec, CorpusSize(80 * 32, exact=True)) == "0.5"
    assert epochs_cell(spec, CorpusSize(20 * 32)) == "~2 (estimate) !"
    assert epochs_cell(spec, CorpusSize(None)) == "unknown"
    assert epochs_cell(spec, CorpusSize(None, missing=True)) == "missing"
    assert epochs_cell(spec, CorpusSize(3 * 32, exact=True)) == "13.3 !"  # a batch of 4 > 3 sequences


# ------------------------------------------------------------------------------------------- refusals


def test_ablate_run_refuses_a_plan_that_reads_its_corpus_more_than_max_epochs(tmp_path, slice_tokens, capsys):
    steps = steps_over_one_epoch(slice_tokens)
    out = tmp_path / "run"
    spec_file = write_yaml(tmp_path / "run.yaml", spec_dict(steps))
    assert main(["run", str(spec_file), "--out", str(out)]) == 2
    err = error_line(capsys.readouterr().err)
    sequences = slice_tokens // SLICE["seq_len"]
    planned = steps * BATCH * SLICE["seq_len"]
    assert err.startswith(f"error: {spec_file}: data.max_epochs: corpus corpus_en_e3c/train.txt has ")
    assert f"{slice_tokens:,} tokens: {sequences:,} sequences of 32" in err and f"plans {planned:,} tokens" in err
    assert f"{steps * BATCH / sequences:.3g} epochs over it" in err
    assert "base.data.max_epochs" in err and "got 1.0" in err
    assert not out.exists()  # refused before the run folder is written


@pytest.mark.slow
def test_raising_max_epochs_lets_the_same_run_train(tmp_path, slice_tokens, capsys):
    steps = steps_over_one_epoch(slice_tokens)
    out = tmp_path / "run"
    spec = write_yaml(tmp_path / "run.yaml", spec_dict(steps, max_epochs=2.0))
    assert main(["run", str(spec), "--out", str(out)]) == 0, capsys.readouterr().err
    assert (out / "model").is_dir()
    assert json.loads((out / "status.json").read_text())["state"] == "done"


def test_a_runs_start_refuses_it_whatever_launched_it(tmp_path, slice_tokens):
    from ablate.launch.worker import execute, prepare_run_dir
    from ablate.train.loop import setup

    spec = parse_run_spec(spec_dict(steps_over_one_epoch(slice_tokens)))
    with pytest.raises(SpecError, match="more than data.max_epochs allows"):
        setup(spec)
    run_dir = prepare_run_dir(spec, tmp_path / "run")
    with pytest.raises(SpecError, match="data.max_epochs"):
        execute(run_dir)
    assert json.loads((run_dir / "status.json").read_text())["state"] == "failed"


def test_a_batch_larger_than_the_corpus_is_refused_whatever_max_epochs(tmp_path, slice_tokens):
    from ablate.train.loop import setup

    sequences = slice_tokens // SLICE["seq_len"]
    spec = parse_run_spec({**spec_dict(steps=1, max_epochs=1000.0), "batch_size": sequences + 1})
    with pytest.raises(SpecError) as err:
        setup(spec)
    assert err.value.key == "batch_size" and err.value.value == sequences + 1
    assert f"at most {sequences:,} sequences" in str(err.value) and "data.max_epochs" in str(err.value)


def _tiny_grid(tmp_path: Path, steps: int, **data) -> Path:
    grid = tiny_grid(
        schedules={"mlm": [{"name": "mlm", "objective": "mlm", "steps": steps}]},
        freeze_masks={"none": {}},
        axes={"schedule": ["mlm"], "freeze": ["none"]},
    )
    grid["base"]["data"] = {**SLICE, **data}
    grid["base"].pop("probe")
    grid.pop("exclude")
    return write_yaml(tmp_path / "grid.yaml", grid)


def test_a_local_sweep_refuses_after_preparing_before_any_run_starts(tmp_path, slice_tokens, capsys):
    grid = _tiny_grid(tmp_path, steps_over_one_epoch(slice_tokens))
    assert main(["sweep", str(grid), "--executor", "debug", "--results", str(tmp_path / "r"), "--poll", "0"]) == 2
    captured = capsys.readouterr()
    assert error_line(captured.err).startswith(f"error: {grid}: data.max_epochs: corpus corpus_en_e3c/train.txt")
    assert "submitted" not in captured.out
    assert not list((tmp_path / "r").glob("*/runs/*/checkpoints"))
    statuses = [json.loads(p.read_text())["state"] for p in (tmp_path / "r").glob("*/runs/*/status.json")]
    assert "running" not in statuses and "failed" not in statuses and "done" not in statuses


def test_a_slurm_submission_checks_a_corpus_already_prepared(tmp_path, slice_tokens):
    from ablate.config.grid import load_grid
    from ablate.launch.preparation import prepare_corpora, prepare_for_sweep
    from ablate.plan.grid import expand

    grid_file = _tiny_grid(tmp_path, steps_over_one_epoch(slice_tokens))
    grid = load_grid(grid_file)
    specs = [r.spec for r in expand(grid)]
    prepare_corpora(specs, workers=1, out=lambda _line: None)
    with pytest.raises(SpecError, match="data.max_epochs") as err:  # before any executor is made
        prepare_for_sweep("slurm", grid.launcher, specs, tmp_path / "jobs", "tiny", file=str(grid_file))
    assert err.value.file == str(grid_file) and not (tmp_path / "jobs").exists()


# ------------------------------------------------------------------------------------------- the dry run


def _no_preflight(monkeypatch):
    # ModernBERT-base's causal preflight takes most of a minute here (tests/test_grid.py runs it)
    monkeypatch.setattr("ablate.launch.checks.check_models", lambda specs, file=None: {})


def test_the_freeze_grids_dry_run_warns_that_its_corpus_is_missing(tmp_path, capsys, monkeypatch):
    _no_preflight(monkeypatch)
    assert main(["sweep", str(FREEZE), "--dry-run", "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert "data.corpus" in warnings[0] and "biomed_fr/train" in warnings[0]
    assert "data.valid_corpus" in warnings[1] and "biomed_fr/valid.txt" in warnings[1]
    assert all("corpus not found" in w and "a real submission refuses it (exit 2)" in w for w in warnings)
    assert len([line for line in out.splitlines() if line.split()[-1:] == ["missing"]]) == 5  # each arm


def test_the_dry_run_estimates_a_corpus_it_cannot_count_and_flags_the_refused_runs(tmp_path, capsys, monkeypatch):
    _no_preflight(monkeypatch)
    grid = tmp_path / "toy.yaml"
    grid.write_text(
        FREEZE.read_text()
        .replace("biomed_fr/train/", "corpus_fr_e3c/train.txt")
        .replace("biomed_fr/valid.txt", "corpus_fr_e3c/valid.txt")
        .replace("n_texts: 500", "n_texts: 32")
    )  # the toy file has 37 held-out texts
    assert main(["sweep", str(grid), "--dry-run", "--results", str(tmp_path / "r")]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert (
        "corpus corpus_fr_e3c/train.txt (hub:almanach/moderncamembert-base): ~420k tokens, an estimate from its "
        "1.7M bytes"
    ) in out
    # no hub here: the tokenizer is not available (with it in the local cache: the corpus is not prepared)
    assert "(its tokenizer is not available here)" in out or "(not prepared yet)" in out
    assert f"`ablate prepare {grid}` counts them" in out
    assert "warning: 5 of 5 runs (epochs marked !) would (by the estimate) read" in out
    assert "base.data.max_epochs" in out
    assert out.count("(estimate) !") == 5


def test_the_dry_run_counts_a_prepared_corpus_exactly(tmp_path, slice_tokens, capsys):
    steps = steps_over_one_epoch(slice_tokens)
    grid = _tiny_grid(tmp_path, steps)
    assert main(["prepare", str(grid), "--workers", "1"]) == 0
    assert main(["sweep", str(grid), "--dry-run", "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    sequences = slice_tokens // SLICE["seq_len"]
    assert f"{slice_tokens:,} tokens, {sequences:,} sequences of 32 (prepared)" in out
    [row] = [line.split() for line in out.splitlines() if line.split()[-1:] == ["!"]]
    assert row[-2] == f"{steps * BATCH / sequences:.3g}"


def test_a_real_sweep_of_the_freeze_grid_refuses_its_missing_corpus(tmp_path, capsys, monkeypatch):
    _no_preflight(monkeypatch)
    results = tmp_path / "r"
    assert main(["sweep", str(FREEZE), "--executor", "debug", "--results", str(results)]) == 2
    err = error_line(capsys.readouterr().err)
    assert err.startswith(f"error: {FREEZE}: data.corpus: corpus not found") and "biomed_fr/train" in err
    assert not results.exists()  # refused before anything is written
