"""The compile cache read back (ablate.train.compiled.load_cache): a file that is cut, altered or declined by
torch is named in the run's log and removed, never counted as loaded; the next save writes a good one."""

from __future__ import annotations

import hashlib

import pytest

from ablate.train.compiled import CACHE_SUFFIX, load_cache


def _named(folder, data: bytes):
    path = folder / f"{hashlib.sha256(data).hexdigest()[:16]}{CACHE_SUFFIX}"
    path.write_bytes(data)
    return path


@pytest.mark.slow  # torch's cache reader imports inductor: seconds in a fresh process
def test_a_damaged_or_declined_compile_cache_file_is_named_removed_and_not_counted(tmp_path):
    declined = _named(tmp_path, b"not torch's artifact format")  # its digest holds: torch reads and declines it
    altered = _named(tmp_path, b"some saved kernels")
    altered.write_bytes(b"some saved kernelz")  # a flipped byte: no longer the digest it was saved under
    cut = _named(tmp_path, b"some other saved kernels")
    cut.write_bytes(b"some other")
    lines: list[str] = []
    assert load_cache(tmp_path, lines.append) == 0
    assert not list(tmp_path.iterdir())
    assert len(lines) == 3 and all("skipped and removed" in line for line in lines), lines
    assert any(str(declined) in line and "torch declined it" in line for line in lines)
    assert sum("do not match the digest" in line for line in lines) == 2


def test_a_missing_cache_folder_loads_nothing(tmp_path):
    assert load_cache(tmp_path / "absent", print) == 0 and load_cache(None, print) == 0
