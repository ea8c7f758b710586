"""Nothing ablate reads back can crash it or mislead it (docs/reliability.md, its inventory): each file one
command writes and another reads, damaged on purpose (truncated, emptied, bytes flipped, not UTF-8, valid JSON
of the wrong types, a wrong key, a missing sibling) and fed to the code that reads it, in this process. A
record a user relies on is exit 2 (a SpecError) naming the file and what to do, or collect's exit 1 naming the
folder it left out; a cache is ignored, named and rebuilt; a checkpoint is set aside and the run resumes from
the one before it, or stops once, named. Never a traceback of another kind, never a wrong value taken as
right. Hypothesis draws the damage where its space is large; the fast tier keeps a fixed sample of each kind,
the slow tier draws more. (The fetch cache's damaged downloads: tests/test_data_fetch.py; the trace cache's
wrong value types in a real plan: tests/test_trace_cache.py; the compile cache: tests of train.compiled.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.config.spec import parse_run_spec
from ablate.data.catalog import FETCHED, write_fetched
from ablate.predict import trace_cache
from ablate.store import atomic, rundir
from ablate.store.sweep import SweepFolder
from ablate.train import checkpoint
from ablate.tune.storage import study_record
from builders import MODEL, run_spec
from fuzzing import FUZZ
from in_process import ablate


# ---------------------------------------------------------------------------------------- the damage


def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def emptied(_data: bytes) -> bytes:
    return b""


def flipped(data: bytes) -> bytes:
    """One byte in the middle turned into a byte no UTF-8 text holds."""
    middle = len(data) // 2
    return data[:middle] + b"\xff" + data[middle + 1 :]


def not_utf8(data: bytes) -> bytes:
    return b"\xfe\xff" + data


BYTE_DAMAGE = (truncated, emptied, flipped, not_utf8)


def retyped(value):
    """Valid JSON of the wrong types: every number and flag written as text, every text as a number."""
    if isinstance(value, dict):
        return {k: retyped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [retyped(v) for v in value]
    if isinstance(value, str):
        return 7
    return value if value is None else str(value)


def rekeyed(value):
    """A wrong key: the first key renamed (a mapping), a list in place of a mapping (anything else)."""
    if isinstance(value, dict) and value:
        first = next(iter(value))
        return {f"{first}_": value[first], **{k: v for k, v in value.items() if k != first}}
    return [value]


def json_damage(data: bytes) -> list[tuple[str, bytes]]:
    """Every kind of damage of a JSON file: its bytes, and valid JSON of the wrong types or keys."""
    value = json.loads(data)
    return [(d.__name__, d(data)) for d in BYTE_DAMAGE] + [
        ("retyped", json.dumps(retyped(value)).encode()),
        ("rekeyed", json.dumps(rekeyed(value)).encode()),
    ]


@st.composite
def any_damage(draw, data: bytes) -> bytes:
    """Damage drawn from a large space: a cut anywhere, a run of bytes overwritten anywhere, or bytes put in."""
    kind = draw(st.sampled_from(("cut", "overwrite", "insert")))
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    if kind == "cut":
        return data[:at]
    junk = draw(st.binary(min_size=1, max_size=8))
    return data[:at] + junk + (data[at + len(junk) :] if kind == "overwrite" else data[at:])


# ----------------------------------------------------------------------------------------- the trace cache


INPUTS = {"shape": {"seq_len": 64, "micro": 2}}
RESULT = {"weights": 1 << 20, "activations": 3 << 20, "kernels": ["flash"]}


def _decode(stored: dict) -> dict:
    """As gpu_memory's: whole byte counts and a list of names, or ValueError."""
    if type(stored["weights"]) is not int or type(stored["activations"]) is not int:
        raise ValueError("not a byte count")
    if not isinstance(stored["kernels"], list):
        raise ValueError("not a list of kernels")
    return stored


@pytest.fixture
def trace_entry(tmp_path, monkeypatch) -> Path:
    """One trace cache entry written by read_or_trace (the trace: RESULT) under tmp_path."""
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(trace_cache, "ignored", [])
    assert trace_cache.read_or_trace(INPUTS, lambda: dict(RESULT), dict, _decode) == RESULT
    return trace_cache.path_of(trace_cache.entry_inputs(INPUTS))


def _trace_cache_decides(entry: Path, damaged: bytes, whole: bytes) -> None:
    """Whatever the entry holds, the result is the traced one; a damaged entry is named and written whole."""
    trace_cache.ignored.clear()
    entry.write_bytes(damaged)
    assert trace_cache.read_or_trace(INPUTS, lambda: dict(RESULT), dict, _decode) == RESULT
    if damaged != whole:
        assert [note.split(": ")[0] for note in trace_cache.ignored] == [str(entry)], damaged
    assert entry.read_bytes() == whole


def test_a_damaged_trace_cache_entry_is_ignored_named_and_rewritten(trace_entry, capsys):
    whole = trace_entry.read_bytes()
    entry = json.loads(whole)
    wrong_values = {**entry, "result": {**RESULT, "weights": "0"}}
    wrong_values["sha256"] = trace_cache.checksum(wrong_values["result"])  # sealed: the checksum matches
    for _name, damaged in [
        *json_damage(whole),
        ("other inputs", json.dumps({**entry, "keyed": {**entry["keyed"], "inputs": {}}}).encode()),
        ("checksum", json.dumps({**entry, "result": {**RESULT, "weights": 0}}).encode()),
        ("values", json.dumps(wrong_values).encode()),
    ]:
        _trace_cache_decides(trace_entry, damaged, whole)
    assert "warning: trace cache entry ignored and traced again" in capsys.readouterr().err


@pytest.mark.slow
@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_a_trace_cache_entry_damaged_anywhere_never_gives_another_result(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("trace")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ABLATE_CACHE", str(folder))
        patch.setattr(trace_cache, "ignored", [])
        trace_cache.read_or_trace(INPUTS, lambda: dict(RESULT), dict, _decode)
        entry = trace_cache.path_of(trace_cache.entry_inputs(INPUTS))
        whole = entry.read_bytes()
        _trace_cache_decides(entry, data.draw(any_damage(whole)), whole)


# ------------------------------------------------------------------------------------ a derived dataset's record


@pytest.fixture
def fetched_root(tmp_path) -> Path:
    """A data root with a derived dataset (cos) as its fetch leaves it: its files and FETCHED.tsv."""
    folder = tmp_path / "data" / "cos"
    folder.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (folder / f"{split}.tsv").write_text(f"Opacity\tB-Ref\n{split}\tO\n")
    write_fetched(folder, sorted(folder.glob("*.tsv")))
    assert main(["data", "verify", "cos", "--data-root", str(tmp_path / "data")]) == 0
    return tmp_path / "data"


def _verify_decides(root: Path, damaged: bytes, whole: bytes, capsys) -> None:
    """`ablate data verify` on the damaged FETCHED.tsv: ok only when it still records the same files (a line
    end lost), else exit 2 naming it or the file it no longer matches."""
    (root / "cos" / FETCHED).write_bytes(damaged)
    code = main(["data", "verify", "cos", "--data-root", str(root)])
    out = capsys.readouterr().out
    same = damaged.decode("utf-8", "replace").strip().splitlines() == whole.decode().strip().splitlines()
    assert code == (0 if same else 2), (damaged, out)
    if not same:
        assert "cos: MISMATCH: " in out and ("FETCHED.tsv" in out or ".tsv: " in out), out


def test_a_damaged_fetched_tsv_is_exit_2_naming_it(fetched_root, capsys):
    fetched = fetched_root / "cos" / FETCHED
    whole = fetched.read_bytes()
    lines = whole.decode().splitlines()
    for damaged in [
        *(d(whole) for d in BYTE_DAMAGE),
        lines[0].encode() + b"\n",  # the header alone: no file recorded
        "\n".join([lines[0], lines[1].replace("\t", "\tx", 1), *lines[2:]]).encode(),  # a size that is no number
        "\n".join(["file\tbytes\tsha256", *lines[1:]]).encode(),  # a wrong column name
    ]:
        _verify_decides(fetched_root, damaged, whole, capsys)
    fetched.unlink()  # the missing sibling: not fetched
    assert main(["data", "verify", "cos", "--data-root", str(fetched_root)]) == 2
    assert "FETCHED.tsv: missing (not fetched" in capsys.readouterr().out


@pytest.mark.slow
@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_a_fetched_tsv_damaged_anywhere_is_ok_only_when_it_records_the_same_files(tmp_path_factory, data, capsys):
    root = tmp_path_factory.mktemp("data")
    folder = root / "cos"
    folder.mkdir()
    (folder / "train.tsv").write_text("Opacity\tB-Ref\n")
    write_fetched(folder, [folder / "train.tsv"])
    whole = (folder / FETCHED).read_bytes()
    _verify_decides(root, data.draw(any_damage(whole)), whole, capsys)


# ------------------------------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    """A run's checkpoints folder after two steps of tiny BERT: step 1 kept as a branch point (branch/), step 2
    its latest (LATEST)."""
    from ablate.models.loading import load_masked_lm
    from ablate.train.optimizer import Optimizer

    root = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    model = load_masked_lm(MODEL, seed=0)
    opt = Optimizer(model, parse_run_spec(run_spec()), fused=False)
    for step in (1, 2):
        for p in model.parameters():
            p.grad = torch.full_like(p, 0.01)
        opt.torch.step()
        checkpoint.save_checkpoint(root, model, opt, checkpoint.TrainState(global_step=step), keep=step == 1)
    return root


def _checkpoint_damage(folder: Path) -> list[tuple[str, str, bytes | None]]:
    """(file, damage, bytes: None to delete it) for each file of a checkpoint folder."""
    out = [(name, "missing", None) for name in ("state.json", "model.safetensors", "optimizer.pt")]
    out += [("state.json", kind, data) for kind, data in json_damage((folder / "state.json").read_bytes())]
    for name in ("model.safetensors", "optimizer.pt"):
        data = (folder / name).read_bytes()
        out += [(name, d.__name__, d(data)) for d in (truncated, emptied)]
    header = (folder / "model.safetensors").read_bytes()
    out.append(("model.safetensors", "header", header[:10] + b"\xff" + header[11:]))
    moments = (folder / "optimizer.pt").read_bytes()
    out.append(
        (
            "optimizer.pt",
            "flipped",
            moments[: len(moments) // 2] + b"\x00\xff\x00" + moments[len(moments) // 2 + 3 :],
        )
    )
    return out


@pytest.mark.slow
def test_a_damaged_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(checkpoints, tmp_path, capsys):
    """Each damage of the latest checkpoint: set aside (named on stderr), the branch point at step 1 resumed
    from; both damaged: DamagedCheckpoint once, and the next attempt finds nothing to resume (step 0)."""
    from ablate.models.loading import load_masked_lm
    from ablate.train.optimizer import Optimizer

    latest = checkpoint.latest_checkpoint(checkpoints)
    assert latest.name == "step-000000002-p0"
    for n, (name, kind, data) in enumerate(_checkpoint_damage(latest)):
        root = tmp_path / f"{n}" / "checkpoints"
        shutil.copytree(checkpoints, root)
        target = root / latest.name / name
        target.unlink() if data is None else target.write_bytes(data)
        found = checkpoint.latest_checkpoint(root)
        assert found == checkpoint.kept_path(root, 1), (name, kind)
        assert not (root / latest.name).exists() and (root / f"damaged-{latest.name}").is_dir()
        assert f"checkpoint {root / latest.name} is damaged" in capsys.readouterr().err
    model = load_masked_lm(MODEL, seed=0)
    state = checkpoint.load_checkpoint(found, model, Optimizer(model, parse_run_spec(run_spec()), fused=False))
    assert state.global_step == 1

    (found / "state.json").write_text('{"global_step": "1"}')
    with pytest.raises(
        checkpoint.DamagedCheckpoint, match="global_step is '1'.*the next attempt .* trains it from step 0"
    ):
        checkpoint.latest_checkpoint(root)
    assert checkpoint.latest_checkpoint(root) is None  # stopped once: the next attempt starts from step 0
    assert checkpoint.kept_checkpoint(root, 1) is None


# ------------------------------------------------------------------------------------------------ run folders


def _finished_run(results: Path) -> Path:
    """A finished run folder as a worker leaves it (spec, records, a score file, status done), written here."""
    run = results / "s" / "runs" / "r1"
    spec = parse_run_spec(run_spec(labels={"sweep": "s", "axes": {"schedule": "mlm", "seed": 0}}))
    atomic.write_json(run / "spec.json", spec.model_dump(mode="json"))
    rundir.write_records(
        run,
        {"token_hash": "ab", "tokens_seen": 256, "wall_time_s": 1.0},
        [{"phase": "mlm", "step": 1, "tokens": 128, "loss": 2.0, "lr": 1e-4}],
        [{"phase": "mlm", "step": 1, "layer": 0, "grad_norm": 0.1}],
        [{"phase": "mlm", "layer": 0, "measure": "cka", "value": 0.9}],
        [{"phase": "mlm", "layer": -1}],
    )
    row = {"task": "ncbi_disease", "finetune_seed": 0, "split": "test", "metric": "f1", "value": 0.5}
    atomic.write_json(run / "scores" / "ncbi_disease" / "seed-0.json", {"rows": [row]})
    rundir.write_status(run, "done")
    return run


RUN_RECORDS = (
    "spec.json",
    "status.json",
    "records/run.json",
    "records/curves.json",
    "records/grads.json",
    "records/layers.json",
    "scores/ncbi_disease/seed-0.json",
)


def _collect_decides(results: Path, run: Path, name: str, data: bytes | None, clean: dict) -> None:
    """Collect over the damaged file (ablate.store.collect, as `ablate collect` calls it, which then exits 1
    naming its problems): the run left out of every table and named; or, where the damage left a record it
    accepts, the tables of the clean folder."""
    from ablate.store.collect import collect

    path = run / name
    path.unlink() if data is None else path.write_bytes(data)
    collected = collect(results / "s", write=False)
    if collected.problems:
        assert collected.problems == [
            f"{run}: skipped, unreadable record ({collected.problems[0].split('(', 1)[1]}"
        ]
        assert all(t.empty or "r1" not in set(t["run_id"]) for t in collected.tables.values()), (name, data)
    else:  # the tables of the clean folder (a spec that no longer validates: its twin check said unchecked)
        twin = ["twin", "twin_tokens"]
        assert all(
            collected.tables[t]
            .drop(columns=twin if t == "runs" else [])
            .equals(clean[t].drop(columns=twin if t == "runs" else []))
            for t in clean
        ), (name, data)


# the fast tier's sample: one damage of each kind, each on another file (the slow tier: every damage, every file)
RUN_SAMPLE = {
    "records/run.json": "truncated",
    "records/curves.json": "retyped",
    "records/layers.json": "rekeyed",
    "status.json": "emptied",
    "scores/ncbi_disease/seed-0.json": "retyped",
    "spec.json": "flipped",
    "records/grads.json": "missing",
}


def _collect_over_damage(tmp_path: Path, wanted) -> None:
    from ablate.store.collect import collect

    results = tmp_path / "results"
    run = _finished_run(results)
    clean = collect(results / "s", write=False).tables
    for name in RUN_RECORDS:
        whole = (run / name).read_bytes()
        for kind, data in [*json_damage(whole), ("missing", None)]:
            if not wanted(name, kind):
                continue
            if data is None and name in ("spec.json", "status.json", "scores/ncbi_disease/seed-0.json"):
                continue  # no spec: not a run folder; no status: a pending run; no score file: not evaluated
            _collect_decides(results, run, name, data, clean)
            (run / name).write_bytes(whole)


def test_a_damaged_run_folder_is_left_out_of_collect_and_named(tmp_path):
    _collect_over_damage(tmp_path, lambda name, kind: RUN_SAMPLE.get(name) == kind)


@pytest.mark.slow
def test_every_damage_of_every_run_record_is_left_out_of_collect_and_named(tmp_path):
    _collect_over_damage(tmp_path, lambda name, kind: RUN_SAMPLE.get(name) != kind)


def test_a_damaged_status_is_never_read_as_a_state(tmp_path):
    run = _finished_run(tmp_path)
    whole = (run / "status.json").read_bytes()
    wrong_field = json.dumps({"state": "failed", "attempts": "2"}).encode()  # the worker adds 1 to it
    for _kind, data in [*json_damage(whole), ("a field's type", wrong_field)]:
        (run / "status.json").write_bytes(data)
        with pytest.raises(rundir.CorruptStatus, match="status.json is corrupt"):
            rundir.read_status(run)
        assert rundir.state_or_corrupt(run) == "corrupt"


# ------------------------------------------------------------------------------- sweep, branch and study records


def _records_of_a_sweep(tmp_path: Path) -> dict[str, tuple[Path, object]]:
    """Each small record another command reads: its path and the call that reads it."""
    sweep = SweepFolder(tmp_path / "s")
    run = sweep.run("r1")
    atomic.write_json(sweep.manifest, {"run_ids": ["r1", "r2"]})
    rundir.write_branch(run, "r2", 4)
    rundir.write_branch_points(run, {4: ["r3"]})
    rundir.mark_branched(run, "parent", 4)
    atomic.write_json(tmp_path / "study" / "study.json", {"storage": "sqlite:///x.db", "study": "study"})
    return {
        "sweep.json": (sweep.manifest, sweep.run_ids),
        "branch.json": (run / "branch.json", lambda: rundir.read_branch(run)),
        "branch_points.json": (run / "branch_points.json", lambda: rundir.branch_points(run)),
        "branched.json": (run / "branched.json", lambda: rundir.branched(run)),
        "study.json": (tmp_path / "study" / "study.json", lambda: study_record(tmp_path / "study" / "study.json")),
    }


def test_a_damaged_sweep_branch_or_study_record_is_exit_2_naming_it_and_what_to_do(tmp_path):
    for name, (path, read) in _records_of_a_sweep(tmp_path).items():
        whole, clean = path.read_bytes(), read()
        for kind, data in json_damage(whole):
            path.write_bytes(data)
            with pytest.raises(SpecError) as caught:
                read()
            assert caught.value.file == str(path) and "; " in caught.value.message, (name, kind)
        path.write_bytes(whole)
        assert read() == clean


def test_a_lock_file_s_content_is_only_shown(tmp_path):
    from ablate.store.lock import FileLock

    lock = FileLock(tmp_path / ".lock")
    (tmp_path / ".lock").write_bytes(b"\xff\xfe host \x00 12")
    assert isinstance(lock.holder(), str) and not lock.held_elsewhere()
    assert lock.acquire(wait_s=0) and lock.holder().split()[-1].isdigit()
    lock.release()


# ------------------------------------------------------------------------------------------- prepared corpora


@pytest.fixture
def prepared(tmp_path, minilm_tokenizer) -> Path:
    """A prepared folder of a 12-line corpus (tokens, document ends, manifest), as `ablate prepare` writes."""
    from ablate.config.spec import DataSpec
    from ablate.data.prepare import prepare

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Document {i} holds a few words of text.\n" for i in range(12)))
    spec = DataSpec(corpus=str(corpus), seq_len=8, prepared_root=str(tmp_path / "prepared"))
    return prepare(spec, minilm_tokenizer, workers=1, show=False), spec


@pytest.mark.slow
def test_a_damaged_prepared_folder_is_exit_2_naming_the_file_and_prepare_rebuilds_it(
    prepared, minilm_tokenizer, capsys
):
    from ablate.data.prepare import DamagedPrepared, prepare
    from ablate.data.prepared import PreparedCorpus

    folder, spec = prepared
    clean = PreparedCorpus(folder).tokens(0, 20)
    manifest = folder / "manifest.json"
    whole = manifest.read_bytes()
    for kind, data in json_damage(whole):
        manifest.write_bytes(data)
        with pytest.raises(DamagedPrepared) as caught:
            PreparedCorpus(folder)
        assert caught.value.file == str(manifest) and "`ablate prepare" in caught.value.message, kind
    assert prepare(spec, minilm_tokenizer, workers=1, show=False) == folder  # prepared again over it, said
    assert "manifest.json" in capsys.readouterr().err and (PreparedCorpus(folder).tokens(0, 20) == clean).all()
    for sibling in ("tokens-00000.bin", "doc_ends.bin"):
        data = (folder / sibling).read_bytes()
        for damaged in (truncated(data), None):
            (folder / sibling).unlink() if damaged is None else (folder / sibling).write_bytes(damaged)
            with pytest.raises(SpecError, match="re-prepare with `ablate prepare`") as caught:
                PreparedCorpus(folder)
            assert caught.value.file == str(folder / sibling)
        (folder / sibling).write_bytes(data)


# ---------------------------------------------------------------------------------------- validate, then write


def test_evaluate_checks_every_set_value_before_it_writes(tmp_path, data_root):
    """A --set value a setting does not take, and one no task evaluated reads (span_selection on an NER task):
    exit 2 naming it, nothing under the results root (the base model's source.json was written first)."""
    base = ["evaluate", "--base", "hub:almanach/ModernCamemBERT-bio-base", "--base-only", "--task", "ncbi_disease"]
    for value, says in (
        ("best", "Input should be 'sampled' or 'decoded'"),
        ("decoded", "no task evaluated reads it"),
    ):
        done = ablate([*base, "--set", f"span_selection={value}", "--results", tmp_path / "results"])
        assert done.returncode == 2 and "error: --set span_selection: " in done.stderr and says in done.stderr
        assert not (tmp_path / "results").exists()


# -------------------------------------------------------------------------------- a run's representations, trackers


def test_damaged_phase_end_representations_are_exit_2_naming_the_file(tmp_path):
    import numpy as np

    from ablate.analysis.probe import load_representations, save_representations

    path = tmp_path / "records" / "reps" / "mlm.npz"
    save_representations(path, [np.ones((3, 4))] * 2, "texts")
    whole = path.read_bytes()
    assert load_representations(path)[1] == "texts"
    for damage in BYTE_DAMAGE:
        path.write_bytes(damage(whole))
        with pytest.raises(SpecError, match="run it again") as caught:
            load_representations(path)
        assert caught.value.file == str(path), damage.__name__


def test_an_unreadable_trackers_record_starts_new_tracker_runs_and_says_so(tmp_path):
    from ablate.launch.trackers import STATE_FILE, RunTrackers

    for damaged in (b"", b"[1, 2]", b'{"ids": "wandb"}', b"\xff{"):
        (tmp_path / STATE_FILE).write_bytes(damaged)
        lines = []
        trackers = RunTrackers(parse_run_spec(run_spec()), tmp_path, lines.append)
        assert trackers.state["ids"] == {} and f"trackers: {STATE_FILE} unreadable" in lines[0], damaged


def test_a_damaged_spec_json_is_exit_2_naming_it_before_the_sweep_writes_into_its_folder(tmp_path):
    from ablate.launch.worker import prepare_run_dir

    spec = parse_run_spec(run_spec())
    run = prepare_run_dir(spec, tmp_path / "r1")
    whole = (run / "spec.json").read_bytes()
    for kind, data in json_damage(whole):
        (run / "spec.json").write_bytes(data)
        for read in (lambda: prepare_run_dir(spec, run), lambda: rundir.read_spec(run)):
            with pytest.raises(rundir.DamagedRecord, match="move the run folder aside") as caught:
                read()
            assert caught.value.file == str(run / "spec.json"), kind
        assert (run / "spec.json").read_bytes() == data  # nothing written over it


@pytest.mark.slow  # report.sweep's imports (seconds, once a process)
def test_a_damaged_table_is_exit_2_naming_it_and_collect_writes_it_again(tmp_path):
    import pandas as pd

    from ablate.report.sweep import read_table

    folder = SweepFolder(tmp_path / "s")
    folder.root.mkdir()
    frame = pd.DataFrame({"run_id": ["r1", "r2"], "value": [0.5, 0.25]})
    for suffix in (".parquet", ".csv"):
        path = folder.root / f"scores{suffix}"
        frame.to_parquet(path) if suffix == ".parquet" else frame.to_csv(path, index=False)
        whole = path.read_bytes()
        for damage in (truncated, emptied, flipped) if suffix == ".parquet" else (emptied, not_utf8):
            path.write_bytes(damage(whole))
            with pytest.raises(SpecError, match="`ablate collect s` writes the tables again") as caught:
                read_table(folder, "scores")
            assert caught.value.file == str(path), (suffix, damage.__name__)
        path.unlink()


# ------------------------------------------------------------------------------- the other small records


def test_the_other_records_are_exit_2_ignored_or_set_aside_never_a_traceback(tmp_path):
    """The shipped manifest.tsv (exit 2: reinstall), a sweep's drivers.json and a run's progress.json (only
    informing: read as nothing) and a run's tune.json (CorruptRecord naming it; the tune sets it aside)."""
    from ablate.data.catalog import MANIFEST, DamagedRecord, read_manifest
    from ablate.launch.drivers import Watch
    from ablate.store.sweep import read_progress, write_progress
    from ablate.tune.trials import CorruptRecord, read_trial_record, write_trial_record

    manifest = MANIFEST.read_bytes()[:4000]
    for damaged in (manifest.replace(b"\t", b"\tx", 3), not_utf8(manifest), b"dataset\tfile\n"):
        (tmp_path / "manifest.tsv").write_bytes(damaged)
        with pytest.raises(DamagedRecord, match="reinstall") as caught:
            read_manifest(tmp_path / "manifest.tsv")
        assert caught.value.file == str(tmp_path / "manifest.tsv")

    write_progress(tmp_path, {"phase": "mlm", "step": 1, "total_steps": 2})
    drivers = tmp_path / "drivers.json"
    for name, path in (("progress", tmp_path / "progress.json"), ("drivers", drivers)):
        if name == "drivers":
            Watch(tmp_path, print).close()
        for _kind, data in json_damage(path.read_bytes()):
            path.write_bytes(data)
            if name == "progress":
                assert read_progress(tmp_path) is None
            else:
                Watch(tmp_path, lambda line: pytest.fail(line)).close()  # no other driver known, none made up

    write_trial_record(tmp_path, 3, "running", study="s", storage="sqlite:///x.db")
    whole = (tmp_path / "tune.json").read_bytes()
    for _kind, data in json_damage(whole):
        (tmp_path / "tune.json").write_bytes(data)
        with pytest.raises(CorruptRecord, match="tune.json"):
            read_trial_record(tmp_path)
    assert "kept as tune.json.corrupt-1" in write_trial_record(tmp_path, 3, "running", study="s", storage="x")


@pytest.mark.slow  # optuna's and sqlalchemy's imports (a second, once a process)
def test_a_sqlite_storage_that_is_no_database_is_exit_2(tmp_path):
    from ablate.tune.storage import open_storage

    (tmp_path / "optuna.db").write_bytes(b"not a database")
    with pytest.raises(SpecError, match="cannot open storage"):
        open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")


def test_a_sweep_over_a_run_folder_with_a_damaged_spec_writes_nothing(tmp_path):
    """write_sweep_manifest checks the spec.json of every run folder it reuses before it writes grid.yaml,
    sweep.json or any run folder (the runs: what it reads of them before that, their ids)."""
    from types import SimpleNamespace

    from ablate.launch.scheduler import write_sweep_manifest

    sweep = SweepFolder(tmp_path / "results" / "s")
    runs = [SimpleNamespace(run_id=r, spec=None) for r in ("r1", "r2")]
    damaged = sweep.run("r2") / "spec.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text('{"model": 7}')
    with pytest.raises(rundir.DamagedRecord, match="move the run folder aside") as caught:
        write_sweep_manifest(sweep, None, tmp_path / "grid.yaml", runs)
    assert caught.value.file == str(damaged)
    assert {str(p.relative_to(sweep.root)) for p in sweep.root.rglob("*")} == {
        "runs",
        "runs/r2",
        "runs/r2/spec.json",
    }


# ------------------------------------------------------------------------------ a run's final model, its scores


def _model_damage(folder: Path) -> list[tuple[str, str, bytes | None]]:
    """(file, damage, bytes: None to delete it) of a run's model folder: each file's bytes, config.json's
    wrong types and a config of another shape than the weights."""
    out = [(name, "missing", None) for name in ("config.json", "model.safetensors", "tokenizer_config.json")]
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        data = (folder / name).read_bytes()
        out += [(name, d.__name__, d(data)) for d in (truncated, emptied, not_utf8)]
    config = json.loads((folder / "config.json").read_bytes())
    out.append(("config.json", "retyped", json.dumps({**config, "hidden_size": "32"}).encode()))
    out.append(("config.json", "another shape", json.dumps({**config, "num_hidden_layers": 3}).encode()))
    out.append(("config.json", "another width", json.dumps({**config, "intermediate_size": 48}).encode()))
    return out


# the fast tier's sample (the slow tier: every other damage of every file)
MODEL_SAMPLE = {
    ("model.safetensors", "truncated"),
    ("config.json", "another shape"),
    ("tokenizer.json", "emptied"),
}


def _model_check_over_damage(tiny_bert, tmp_path, wanted) -> None:
    from ablate.models.loading import DamagedModel, check_run_model

    folder = tmp_path / "model"
    shutil.copytree(tiny_bert, folder)
    check_run_model(folder)  # the folder as saved passes
    for name, kind, data in _model_damage(folder):
        if not wanted(name, kind):
            continue
        whole = (folder / name).read_bytes()
        (folder / name).unlink() if data is None else (folder / name).write_bytes(data)
        with pytest.raises(DamagedModel, match="run `ablate sweep` on its grid again") as caught:
            check_run_model(folder)
        assert caught.value.file == str(folder) and name in caught.value.message, (name, kind)
        (folder / name).write_bytes(whole)


def test_a_damaged_final_model_is_exit_2_naming_the_folder_and_what_to_do(tiny_bert, tmp_path):
    _model_check_over_damage(tiny_bert, tmp_path, lambda name, kind: (name, kind) in MODEL_SAMPLE)


@pytest.mark.slow
def test_every_damage_of_a_final_model_is_exit_2_naming_the_folder(tiny_bert, tmp_path):
    _model_check_over_damage(tiny_bert, tmp_path, lambda name, kind: (name, kind) not in MODEL_SAMPLE)


@pytest.mark.slow  # the CLI's imports and the task's data (half a second)
def test_evaluate_over_a_run_with_a_damaged_model_is_exit_2_with_nothing_written(tiny_bert, tmp_path, capsys):
    """`ablate evaluate SWEEP`: the damaged model named before any score file, skipped.json or base record."""
    run = _finished_run(tmp_path / "results")
    shutil.copytree(tiny_bert, run / "model")
    (run / "model" / "model.safetensors").write_bytes(b"")
    before = sorted(p for p in (tmp_path / "results").rglob("*"))
    code = main(["evaluate", "s", "--results", str(tmp_path / "results"), "--task", "e3c_fr_ner"])
    assert code == 2 and f"{run / 'model'}: the run's final model is damaged" in capsys.readouterr().err
    assert sorted(p for p in (tmp_path / "results").rglob("*")) == before


SCORED = {"task": "e3c_fr_ner", "finetune_seed": 0, "split": "test", "metric": "f1", "value": 0.5}


def _score_files_over_damage(tmp_path, monkeypatch, wanted) -> None:
    """Each damage of a (task, seed)'s score file: moved to superseded/ as damaged, named in the log, the unit
    fine-tuned again (here a stub of fine-tuning) and its file written whole; never a traceback, never read as
    done."""
    from ablate.evaluate import score_files as sc

    tuned = []
    monkeypatch.setattr(sc.ft, "finetune", lambda *a, **k: tuned.append(1) or [dict(SCORED)])
    out = tmp_path / "scores"
    assert sc.evaluate_scores("unused", ["e3c_fr_ner"], [0], None, out)[0]["value"] == 0.5
    path = out / "e3c_fr_ner" / "seed-0.json"
    whole = path.read_bytes()
    record = json.loads(whole)
    rows_of = [
        ("value null", {**SCORED, "value": None}),
        ("another seed", {**SCORED, "finetune_seed": 1}),
        ("another task", {**SCORED, "task": "ncbi_disease"}),
        ("seed as text", {**SCORED, "finetune_seed": "0"}),
    ]
    damages = json_damage(whole) + [(k, json.dumps({**record, "rows": [row]}).encode()) for k, row in rows_of]
    damages = [(kind, data) for kind, data in damages if wanted(kind)]
    for n, (kind, data) in enumerate(damages, start=2):
        path.write_bytes(data)
        lines = []
        rows = sc.evaluate_scores("unused", ["e3c_fr_ner"], [0], None, out, log=lines.append)
        assert len(tuned) == n and rows == [{**SCORED, "n_examples": rows[0]["n_examples"], "stale": False}], kind
        assert json.loads(path.read_bytes())["rows"] == json.loads(whole)["rows"], kind
        aside = max(
            (out / "e3c_fr_ner" / sc.SUPERSEDED).glob("seed-0.*.json"), key=lambda p: p.stem.split(".")[-1]
        )
        assert aside.read_bytes() == data, kind
        if kind == "rekeyed":  # its identity's key renamed: computed by an older version, superseded
            assert "recomputing (no identity recorded" in lines[0] and ".damaged." not in aside.name
        else:
            assert lines[0].startswith(f"e3c_fr_ner seed 0: score file {path} is damaged ("), (kind, lines)
            assert f"kept as {aside}, recomputing" in lines[0] and ".damaged." in aside.name, kind


SCORE_SAMPLE = ("flipped", "value null")


def test_a_damaged_score_file_is_never_done_it_is_set_aside_named_and_computed_again(tmp_path, monkeypatch):
    _score_files_over_damage(tmp_path, monkeypatch, lambda kind: kind in SCORE_SAMPLE)


@pytest.mark.slow
def test_every_damage_of_a_score_file_is_set_aside_and_computed_again(tmp_path, monkeypatch):
    _score_files_over_damage(tmp_path, monkeypatch, lambda kind: kind not in SCORE_SAMPLE)
