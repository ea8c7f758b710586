"""The GPU memory plan's trace cache (ablate.predict.trace_cache): a second plan of the same grid, in a new
process, reads every step shape from disk and gives the same numbers; a changed key field (the shape, the
model's config, ablate's traced source, a library version) traces again; an entry cut short, overwritten,
unreadable, failing its checksum or holding values of the wrong types (a "0" byte count) is named and costs a
trace, and a folder that cannot be written costs a trace and nothing else. And the plan's speed-ups
change no number: the tracker keeping only the global peak, the bisected micro-batch search."""

from __future__ import annotations

import json

import pytest
from test_gpu_memory import MODEL, _grid, _spec
from torch.distributed._tools.mem_tracker import MemTracker

from ablate.cli import main
from ablate.config.grid import load_grid
from ablate.predict import gpu_memory, trace_cache
from ablate.plan.grid import expand


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty trace cache under tmp_path; `fresh()` then forgets what this process traced, as a new process
    would, and zeroes the counts."""
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))

    def new_process():
        monkeypatch.setattr(gpu_memory, "_CACHE", {})
        monkeypatch.setattr(trace_cache, "counts", {"traced": 0, "read": 0})
        monkeypatch.setattr(trace_cache, "ignored", [])

    new_process()
    return new_process


def _plan(path):
    grid = load_grid(str(path))
    runs = expand(grid, file=str(path))
    return gpu_memory.memory_plan(runs, grid.launcher, grid.launcher.executor, str(path))


def _no_trace(*_args, **_kwargs):
    raise AssertionError("traced although the trace cache holds the shape")


def _entries(tmp_path):
    return sorted((tmp_path / "cache" / trace_cache.FOLDER).glob("*.json"))


def test_a_second_plan_reads_every_shape_from_disk_and_gives_the_same_numbers(tmp_path, fresh, monkeypatch):
    path = _grid(tmp_path, 80, micro=2)
    first = _plan(path)
    traced = dict(gpu_memory._CACHE)
    assert len(traced) == 2 and trace_cache.counts == {"traced": 2, "read": 0}  # an MLM and a CLM step
    assert len(_entries(tmp_path)) == 2

    fresh()
    monkeypatch.setattr(gpu_memory, "trace_step", _no_trace)
    assert _plan(path) == first
    assert gpu_memory._CACHE == traced  # every part and kernel, to the byte
    assert trace_cache.counts == {"traced": 0, "read": 2}


def test_the_dry_run_says_how_many_shapes_were_traced_and_read(tmp_path, fresh, capsys):
    path = _grid(tmp_path, 80, micro=2)
    assert main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 0
    assert "step shapes: 2 traced, 0 read from the trace cache" in capsys.readouterr().out
    fresh()
    assert main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "step shapes: 0 traced, 2 read from the trace cache" in out and str(tmp_path / "cache") in out


def test_a_changed_key_field_traces_again(tmp_path, fresh, monkeypatch):
    spec = _spec(seq_len=64)
    [before] = gpu_memory.phase_memory(spec, 2)
    assert trace_cache.counts["traced"] == 1

    def traces_once_more(**changes):
        fresh()
        return gpu_memory.phase_memory(_spec(**changes), 2)[0], trace_cache.counts

    assert traces_once_more(seq_len=64)[1] == {"traced": 0, "read": 1}  # nothing changed
    longer, counts = traces_once_more(seq_len=128)
    assert counts == {"traced": 1, "read": 0} and longer.activations > before.activations
    assert traces_once_more(precision="fp32")[1]["traced"] == 1

    monkeypatch.setattr(trace_cache, "source_digest", lambda: "another ablate")  # an edited attention kernel
    assert traces_once_more(seq_len=64) == (before, {"traced": 1, "read": 0})
    monkeypatch.setattr(trace_cache, "_version", lambda name: "0.0" if name == "transformers" else None)
    assert traces_once_more(seq_len=64)[1]["traced"] == 1
    assert len(_entries(tmp_path)) == 5


def test_a_model_config_edited_in_place_traces_again(tmp_path, fresh):
    from ablate.models.loading import load_config

    path = tmp_path / "config.json"
    path.write_text(load_config(MODEL).to_json_string())
    spec = _spec().model_copy(update={"model": f"config:{path}"})
    [before] = gpu_memory.phase_memory(spec, 2)
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "intermediate_size": 2 * config["intermediate_size"]}))
    gpu_memory._config_json.cache_clear()
    gpu_memory._meta_model.cache_clear()
    fresh()
    [wider] = gpu_memory.phase_memory(spec, 2)
    assert trace_cache.counts == {"traced": 1, "read": 0} and wider.weights > before.weights


def test_a_corrupt_or_unreadable_entry_is_traced_again_and_rewritten(tmp_path, fresh, monkeypatch, capsys):
    spec = _spec()
    expected = gpu_memory.StepMemory(2**20, 2**20, 2**21, 3 * 2**20, 2**19, ("efficient",))  # a step as traced
    monkeypatch.setattr(gpu_memory, "trace_step", lambda shape, spec: expected)
    assert gpu_memory.phase_memory(spec, 2) == [expected]
    [entry] = _entries(tmp_path)
    whole = entry.read_text()
    stored = json.loads(whole)
    broken = [
        whole[: len(whole) // 2],  # cut short (a copy interrupted, a full disk)
        "",
        "[1, 2]",
        json.dumps({**stored, "keyed": {**stored["keyed"], "format": -1}}),  # traced for other inputs
        json.dumps({**stored, "result": {**stored["result"], "weights": 1}}),  # fails its checksum
        json.dumps({**stored, "format": 1}),
        _resealed(stored, {**stored["result"], "weights": "many"}),  # checksums match, the values are wrong
        # keys and checksum intact, every byte count "0": read as 0 bytes it planned micro-batch 8 where 1 fits
        _resealed(stored, {**stored["result"], **{part: "0" for part in gpu_memory.PARTS}}),
        _resealed(stored, {**stored["result"], "activations": 1.5e9}),
        _resealed(stored, {**stored["result"], "kernels": "flash"}),
        _resealed(stored, {k: v for k, v in stored["result"].items() if k != "kernels"}),
    ]
    for text in broken:
        entry.write_text(text)
        fresh()
        assert gpu_memory.phase_memory(spec, 2) == [expected]
        assert trace_cache.counts == {"traced": 1, "read": 0}, text
        assert [note.split(":")[0] for note in trace_cache.ignored] == [str(entry)]  # named
        assert f"ignored (failed its check, traced again): {entry}: " in trace_cache.summary()  # the dry run's
        assert f"warning: trace cache entry ignored and traced again: {entry}: " in capsys.readouterr().err
        assert json.loads(entry.read_text()) == stored  # rewritten whole
    entry.unlink()
    entry.mkdir()  # a path that cannot be read as a file, nor replaced by one
    fresh()
    assert gpu_memory.phase_memory(spec, 2) == [expected] and trace_cache.counts["traced"] == 1


def _resealed(stored: dict, result: dict) -> str:
    """The entry with another result and that result's own checksum: valid JSON, the wrong values."""
    return json.dumps({**stored, "result": result, "sha256": trace_cache.checksum(result)})


def test_a_cache_folder_that_cannot_be_written_costs_a_trace_and_nothing_else(tmp_path, fresh, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("ABLATE_CACHE", str(blocked))
    assert gpu_memory.phase_memory(_spec(), 2)[0].predicted > 0
    assert trace_cache.counts == {"traced": 1, "read": 0}
    assert blocked.read_text() == "a file where the cache folder would be"


def test_every_traced_source_exists():
    """The digest covers what it names: a moved module would leave its new place out."""
    for source in trace_cache.TRACED_SOURCES:
        assert (trace_cache.PACKAGE / source).exists(), source


def test_the_global_peak_tracker_gives_what_memtracker_s_own_statistics_give(fresh, monkeypatch):
    """MemTracker's per-module peaks (a walk over every module at every op, which the plan skips) do not move
    the global peak or its parts."""
    for objective in ("mlm", "clm"):
        spec = _spec(objective=objective)
        shape = gpu_memory.step_shapes(spec, 2)[0]
        fast = gpu_memory.trace_step(shape, spec)
        with monkeypatch.context() as full:
            full.setattr(gpu_memory.PeakTracker, "_update_peak_stats", MemTracker._update_peak_stats)
            assert gpu_memory.trace_step(shape, spec) == fast


@pytest.mark.slow
def test_the_micro_batch_search_bisects_and_finds_what_checking_each_finds(fresh, monkeypatch):
    """Every limit between two peaks, for MLM (whose whole batch as one micro-batch peaks below two half-size
    micro-batches on this small model: no gradients beside its forward) and CLM: the same micro-batch as
    trying each divisor from the largest, from at most 1 + 3 of the 6 divisors."""
    for objective in ("mlm", "clm"):
        spec = _spec(batch=12, objective=objective)  # divisors 12, 6, 4, 3, 2, 1
        peaks = {m: gpu_memory.phase_memory(spec, m)[0].predicted for m in gpu_memory.micro_batches(12)}
        looked_at = []
        real = gpu_memory.shape_memory
        monkeypatch.setattr(gpu_memory, "shape_memory", lambda shape, s: looked_at.append(shape) or real(shape, s))
        for limit in sorted({p + d for p in peaks.values() for d in (-1, 0)}):
            for below in (None, 12, 4):
                each = [
                    m for m in gpu_memory.micro_batches(12) if (below is None or m < below) and peaks[m] <= limit
                ]
                looked_at.clear()
                assert gpu_memory.largest_fitting(spec, limit, below=below) == (each[0] if each else None)
                assert len(looked_at) <= 4
        monkeypatch.undo()
        fresh()


def test_a_grid_that_does_not_fit_stops_at_its_first_misfit(tmp_path, fresh, capsys):
    """The error names the first run that does not fit; the runs after it are not traced."""
    first = expand(load_grid(str(_grid(tmp_path, 80))), file="grid")[0].spec.phases[0].objective
    one, two = (gpu_memory.phase_memory(_spec(objective=first), m)[0].predicted for m in (1, 2))
    fresh()
    path = _grid(tmp_path, (one + two) / 2 / 2**30, micro=2)  # the first arm fits at 1, not 2
    assert main(["sweep", str(path), "--dry-run"]) == 2
    assert "largest micro-batch that fits: 1" in capsys.readouterr().err
    assert {(s.objective, s.micro) for s in gpu_memory._CACHE} == {(first, 2), (first, 1)}
