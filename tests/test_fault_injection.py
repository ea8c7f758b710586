"""The fault-injection settings the tests hand to child processes (ablate.config.faults): a value that does
not read stops `ablate` with exit 2 naming the variable and the form allowed, instead of silently never
firing (`ABLATE_PAUSE_AT=1` once waited 300 s for a file named "")."""

from __future__ import annotations

import pytest

from ablate.config import faults
from ablate.config.errors import SpecError
from in_process import ablate


@pytest.mark.parametrize(
    "name, value",
    [
        (faults.PAUSE_AT, "1"),
        (faults.PAUSE_AT, "1:"),
        (faults.PAUSE_AT, "x:/tmp/f"),
        (faults.OOM_UNIT, "ncbi_disease"),
        (faults.OOM_UNIT, "ncbi_disease:-1"),
        (faults.DIE_AFTER_SHARDS, "0"),
        (faults.DIE_AFTER_SHARDS, "two"),
    ],
)
def test_a_setting_that_does_not_read_is_refused(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SpecError, match=name):
        faults.check()


def test_settings_read_as_written(monkeypatch):
    assert faults.pause_at() is None and faults.oom_unit() is None and faults.die_after_shards() is None
    monkeypatch.setenv(faults.PAUSE_AT, "12:/tmp/release:now")
    monkeypatch.setenv(faults.OOM_UNIT, "ncbi_disease:3")
    monkeypatch.setenv(faults.DIE_AFTER_SHARDS, "2")
    assert faults.pause_at() == faults.Pause(12, "/tmp/release:now")
    assert (faults.oom_unit(), faults.die_after_shards()) == (("ncbi_disease", 3), 2)


def test_ablate_stops_with_exit_2_before_anything_runs(tmp_path):
    done = ablate(["data", "list"], cwd=tmp_path, env={faults.PAUSE_AT: "1"})
    assert done.returncode == 2
    assert "ABLATE_PAUSE_AT" in done.stderr and "STEP:FILE" in done.stderr
    assert list(tmp_path.iterdir()) == []
