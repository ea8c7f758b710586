"""Identical data, compared: per-phase token hashes that depend only on the tokens a phase consumed, `ablate
collect`'s check of each arm's token stream against its MLM twin's (runs table, warnings, pairs), and the marks
the scores table and the HTML page carry for an arm whose stream differs. Run folders are written by hand with
the real writers (rundir.write_status / write_records), their specs expanded from a real grid."""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pandas as pd
import pytest
import yaml

from ablate import report
from ablate.config.grid import load_grid
from ablate.config.spec import dump_run_spec
from ablate.plan.grid import expand
from ablate.report.html import tokens_section, write_html
from ablate.store import atomic
from ablate.store.rundir import TOKEN_HASH_FORMAT, write_records, write_status
from ablate.store.collect import collect
from ablate.train.checkpoint import PHASE_START, TrainState, chain_hash
from tests.test_report import rewrite, write_sweep

# --- the hashes ---------------------------------------------------------------------------------------------


def _batches(seed: int, n: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 30522, size=(4, 16), dtype=np.int64) for _ in range(n)]


def _consume(phases: list[tuple[str, list[np.ndarray]]]) -> TrainState:
    state = TrainState()
    for name, batches in phases:
        for batch in batches:
            state.advance(name, batch)
    return state


def test_a_clm_phase_and_an_mlm_phase_that_read_the_same_batches_have_the_same_hash():
    warmup, main, decay = _batches(1), _batches(2), _batches(3)
    clm = _consume([("head_warmup", warmup), ("clm", main), ("mlm_decay", decay)])
    mlm = _consume([("head_warmup", warmup), ("mlm", main), ("mlm_decay", decay)])
    assert clm.phase_token_hashes["clm"] == mlm.phase_token_hashes["mlm"]
    assert list(clm.phase_token_hashes.values()) == list(mlm.phase_token_hashes.values())
    assert clm.token_hash == mlm.token_hash
    # the chain starts from one constant and the tokens alone (as int32, whatever the storage dtype)
    expected = PHASE_START
    for batch in main:
        expected = chain_hash(expected, batch.astype(np.int32))
    assert clm.phase_token_hashes["clm"] == expected
    # other tokens in the middle phase: that phase and the whole stream differ, the others do not
    other = _consume([("head_warmup", warmup), ("mlm", _batches(9)), ("mlm_decay", decay)])
    assert other.phase_token_hashes["mlm"] != clm.phase_token_hashes["clm"]
    assert other.phase_token_hashes["mlm_decay"] == clm.phase_token_hashes["mlm_decay"]
    assert other.token_hash != clm.token_hash


def test_the_whole_stream_hash_is_unchanged():
    batches = _batches(4)
    expected = hashlib.sha256(b"ablate-token-stream").hexdigest()
    for batch in batches:
        expected = hashlib.sha256(bytes.fromhex(expected) + batch.astype(np.int32).tobytes()).hexdigest()
    assert _consume([("a", batches[:1]), ("b", batches[1:])]).token_hash == expected


# --- collect --------------------------------------------------------------------------------------------------

GRID = {
    "sweep": "tw",
    "base": {"model": "config:tiny-bert", "data": {"corpus": "c.txt", "data_seed": 42}, "batch_size": 4},
    "schedules": {
        "mlm": [
            {"name": "mlm", "objective": "mlm", "steps": 3},
            {"name": "mlm_decay", "objective": "mlm", "steps": 2},
        ],
        "clm_detour": [
            {"name": "clm", "objective": "clm", "steps": 3},
            {"name": "mlm_decay", "objective": "mlm", "steps": 2},
        ],
    },
    "freeze_masks": {"none": {}, "low_clm": {"clm": "low"}},
    "axes": {"schedule": ["mlm", "clm_detour"], "freeze": ["none", "low_clm"], "seed": [1, 2]},
    "exclude": [{"schedule": "mlm", "freeze": "low_clm"}],
}
H = {name: hashlib.sha256(name.encode()).hexdigest() for name in ("stream", "other", "main", "decay", "x")}


def _record(whole: str, phases: dict[str, str], fmt: int | None = TOKEN_HASH_FORMAT) -> dict:
    rec = {"token_hash": whole, "tokens_seen": 320, "phase_token_hashes": phases, "steps": 5, "n_layers": 2}
    return rec if fmt is None else {**rec, "token_hash_format": fmt}


def _finished(sweep, run, record: dict) -> None:
    run_dir = sweep / "runs" / run.run_id
    atomic.write_json(run_dir / "spec.json", dump_run_spec(run.spec))
    write_status(run_dir, "running", attempts=1, started=time.time())
    write_records(run_dir, record, [], [], [], [])
    write_status(run_dir, "done", finished=time.time())


@pytest.fixture(scope="module")
def runs_by_arm(tmp_path_factory):
    path = tmp_path_factory.mktemp("twins") / "tw.yaml"
    path.write_text(yaml.safe_dump(GRID))
    return {(r.axes["schedule"], r.axes["freeze"], r.spec.seed): r for r in expand(load_grid(path))}


def test_collect_marks_twins_that_read_the_same_tokens_and_those_that_do_not(tmp_path, runs_by_arm):
    sweep = tmp_path / "tw"
    same = {"mlm": H["main"], "mlm_decay": H["decay"]}
    _finished(sweep, runs_by_arm[("mlm", "none", 1)], _record(H["stream"], same))
    _finished(
        sweep,
        runs_by_arm[("clm_detour", "none", 1)],
        _record(H["stream"], {"clm": H["main"], "mlm_decay": H["decay"]}),
    )
    _finished(
        sweep,
        runs_by_arm[("clm_detour", "low_clm", 1)],
        _record(H["other"], {"clm": H["x"], "mlm_decay": H["decay"]}),
    )
    _finished(sweep, runs_by_arm[("clm_detour", "none", 2)], _record(H["stream"], same))  # seed 2: no baseline
    got = collect(sweep)
    runs = got.tables["runs"].set_index("run_id")
    base = runs_by_arm[("mlm", "none", 1)].run_id
    same_arm, differ_arm = (
        runs_by_arm[("clm_detour", "none", 1)].run_id,
        runs_by_arm[("clm_detour", "low_clm", 1)].run_id,
    )
    lonely = runs_by_arm[("clm_detour", "none", 2)].run_id
    assert runs.loc[same_arm, ["twin", "twin_tokens"]].tolist() == [base, "same"]
    assert runs.loc[differ_arm, ["twin", "twin_tokens"]].tolist() == [base, "differ at phase 1"]
    assert runs.loc[lonely, ["twin", "twin_tokens"]].tolist() == ["", "no twin"]
    assert runs.loc[base, ["twin", "twin_tokens"]].tolist() == ["", "baseline"]
    assert got.problems == []  # a warning, not a failed collect
    assert len(got.warnings) == 1 and differ_arm in got.warnings[0] and base in got.warnings[0]
    assert "differ at phase 1" in got.warnings[0]
    on_disk = pd.read_parquet(sweep / "runs.parquet").set_index("run_id")
    assert on_disk.loc[differ_arm, "twin_tokens"] == "differ at phase 1"


def test_records_before_the_format_marker_are_compared_by_whole_stream_only(tmp_path, runs_by_arm):
    sweep = tmp_path / "tw"
    # phase hashes seeded by the phase name (format 1): they differ between twins although the tokens agree
    _finished(sweep, runs_by_arm[("mlm", "none", 1)], _record(H["stream"], {"mlm": H["main"]}, fmt=None))
    _finished(sweep, runs_by_arm[("clm_detour", "none", 1)], _record(H["stream"], {"clm": H["x"]}, fmt=None))
    _finished(sweep, runs_by_arm[("clm_detour", "low_clm", 1)], _record(H["other"], {"clm": H["x"]}))
    got = collect(sweep, write=False)
    runs = got.tables["runs"].set_index("run_id")
    assert runs.loc[runs_by_arm[("clm_detour", "none", 1)].run_id, "twin_tokens"] == "same"
    assert runs.loc[runs_by_arm[("clm_detour", "low_clm", 1)].run_id, "twin_tokens"] == "differ (whole stream)"
    assert len(got.warnings) == 1


# --- the scores table and the page ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def marked_sweep(tmp_path_factory):
    """The synthetic report sweep with the token check in its runs table: clm/low's runs differ from their
    twins in one phase, every other arm reads the same tokens."""
    sweep = write_sweep(tmp_path_factory.mktemp("marked") / "s")
    runs = pd.read_parquet(sweep / "runs.parquet")
    base = runs["schedule"].eq("mlm")
    runs["twin"] = np.where(base, "", "tiny-bert-mlm-none-s" + runs["seed"].astype(str))
    runs["twin_tokens"] = np.where(base, "baseline", "same")
    runs.loc[(runs["freeze"] == "low"), "twin_tokens"] = "differ at phase 2"
    rewrite(sweep, "runs", runs)
    return sweep


def test_the_scores_table_marks_the_arm_whose_tokens_differ(marked_sweep, tmp_path):
    paths = report.make_table("scores", marked_sweep, tmp_path)
    tidy = pd.read_csv(paths["csv"], keep_default_na=False)
    match = tidy.drop_duplicates("arm").set_index("arm")["tokens_match"]
    assert match.to_dict() == {
        "mlm": "",
        "clm": "True",
        "clm, freeze low": "False",
        "clm, freeze decay_low": "True",
    }
    md = paths["md"].read_text()
    assert "| clm, freeze low† |" in md and "| clm† |" not in md and "other tokens than their MLM twins" in md
    tex = paths["tex"].read_text()
    assert "clm, freeze low$^\\dagger$ &" in tex and "clm, freeze decay\\_low &" in tex


def test_an_unmarked_table_has_no_dagger(tmp_path):
    sweep = write_sweep(tmp_path / "plain")  # collected before the check: no twin_tokens column
    md = report.make_table("scores", sweep, tmp_path / "out")["md"].read_text()
    assert "†" not in md and "other tokens" not in md


@pytest.mark.slow
def test_the_page_shows_the_twins_token_check(marked_sweep):
    section = tokens_section(report.load_sweep(marked_sweep))
    assert "2 differ" in section and "6 same" in section  # clm/low: seeds 0, 1 (seed 2 failed); 3 + 3 same
    differing = [row for row in section.split("<tr") if "differ at phase 2" in row]
    assert len(differing) == 2 and all(
        'class="failed"' in row and "tiny-bert-mlm-none-s" in row for row in differing
    )
    page = write_html(marked_sweep).read_text()
    assert '<h2 id="tokens">' in page and section in page
