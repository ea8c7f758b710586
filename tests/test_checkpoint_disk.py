"""A full disk while a checkpoint is written: the error says which folder, about how much a checkpoint needs
and what is free; nothing half-written is left; the run resumes from its previous checkpoint to the same
result as a run the disk never stopped. The writer is patched to fail as a full disk does, after it has
written part of the file. Tiny random-init BERT on real text."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from ablate.config.spec import parse_run_spec
from ablate.train import checkpoint
from ablate.train.loop import pretrain
from builders import detour_spec


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_says_where_and_how_much_and_the_run_resumes(
    tmp_path, monkeypatch, data_root
):
    spec = parse_run_spec(detour_spec())  # 7 steps (clm 4, mlm_decay 3), a checkpoint every 2
    reference = pretrain(spec, tmp_path / "reference", log=lambda _m: None)
    saved = checkpoint.save_model

    def disk_fills_at_step_6(model, filename, *args, **kwargs):
        if "step-000000006" in filename:
            Path(filename).write_bytes(b"\0" * 4096)  # part of it, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return saved(model, filename, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_model", disk_fills_at_step_6)
    run = tmp_path / "run"
    with pytest.raises(checkpoint.DiskFull) as caught:
        pretrain(spec, run, log=lambda _m: None)
    message, ckpts = str(caught.value), run / "checkpoints"
    assert f"no space left on the device of {ckpts} writing checkpoint step-000000006-p1" in message, message
    assert "half-written .tmp-step-000000006-p1 was removed" in message and "resumes from its last" in message
    previous = ckpts / "step-000000004-p1"
    final = checkpoint.latest_checkpoint(tmp_path / "reference" / "checkpoints")  # the same tensors as step 6
    on_disk = sum(f.stat().st_size for f in final.iterdir())
    needed = float(re.search(r"needs about ([\d,.]+) MB", message).group(1).replace(",", "")) * 2**20
    assert 0.9 * on_disk < needed < 1.1 * on_disk  # the estimate from tensor sizes
    assert sorted(p.name for p in ckpts.iterdir()) == ["LATEST", previous.name]  # no .tmp-* left
    assert (ckpts / "LATEST").read_text().strip() == previous.name

    monkeypatch.setattr(checkpoint, "save_model", saved)  # room again
    lines = []
    resumed = pretrain(spec, run, log=lines.append)
    assert any(f"resumed from {previous.name}" in line for line in lines), lines
    assert resumed.done and resumed.token_hash == reference.token_hash
    assert [c["loss"] for c in resumed.curves] == [c["loss"] for c in reference.curves]
