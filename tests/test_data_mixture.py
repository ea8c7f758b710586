"""Phases that name their own data and corpus mixtures, on tiny random-init models and small slices of the
shipped corpora: realised shares, kill -9 resume with a mixture and a change of length, twins' per-source
hashes, the max_epochs refusal per source, branching between two weights, and the unchanged default path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from ablate.config.errors import SpecError
from ablate.config.spec import parse_run_spec
from ablate.data.mixture import member_counts, phase_data, row_members, uses_own_data
from ablate.plan.branching import RunPlan, plan_tree, shared_prefix
from ablate.plan.data_plan import check_source_epochs, source_tokens
from ablate.plan.phases import plan_phases
from ablate.train.loop import pretrain
from ablate.train.schedule import lr_at

from builders import detour_spec
from held import start_held

E3C, MEDQUAD = "corpus_en_e3c/train.txt", "corpus_en_medquad/train.txt"


def mixed_spec(weights=(0.5, 0.5), decay_seq_len=48, detour="clm", **overrides) -> dict:
    """A detour on a mixture of E3C and MedQuAD at 32 tokens, then an MLM decay on E3C at `decay_seq_len`."""
    return detour_spec(
        "tiny-bert",
        phases=[
            {
                "name": "detour",
                "objective": detour,
                "steps": 6,
                "lr": {"warmup_steps": 1},
                "data": {
                    "mixture": [{"corpus": E3C, "weight": weights[0]}, {"corpus": MEDQUAD, "weight": weights[1]}]
                },
            },
            {
                "name": "decay",
                "objective": "mlm",
                "steps": 4,
                "lr": {"decay": "linear"},
                "data": {"seq_len": decay_seq_len},
            },
        ],
        **overrides,
    )


def _quiet(_msg: str) -> None:
    pass


@pytest.mark.parametrize("weights", [(0.9, 0.1), (0.5, 0.5), (1, 2, 7)])
def test_realised_shares_converge_to_the_weights(weights):
    total = sum(weights)
    for rows in (100, 1_000, 100_000):
        counts = member_counts(tuple(weights), 42, rows)
        assert counts.sum() == rows
        # a low-discrepancy sequence: within a few rows of weight x rows, however many rows
        assert max(abs(c - w / total * rows) for c, w in zip(counts, weights)) <= 3
    # the rows of a step are a pure function of (data seed, row): counted in pieces or at once, the same
    assert (row_members(tuple(weights), 42, 40, 24) == row_members(tuple(weights), 42, 0, 64)[40:]).all()
    assert not (row_members(tuple(weights), 42, 0, 64) == row_members(tuple(weights), 7, 0, 64)).all()


@pytest.mark.slow
def test_a_run_reads_each_source_by_its_share_and_records_tokens_per_source(tmp_path, data_root):
    spec = parse_run_spec(mixed_spec(weights=(3, 1)))
    state = pretrain(spec, tmp_path / "run", log=_quiet)
    planned = {}
    for row in source_tokens(spec):
        planned[row["source"]] = planned.get(row["source"], 0) + row["tokens"]
    assert state.source_tokens == planned
    assert planned[MEDQUAD] == 6 * 4 * 32 // 4  # a quarter of the detour's rows
    assert state.source_tokens[E3C] + state.source_tokens[MEDQUAD] == state.tokens_seen == 6 * 4 * 32 + 4 * 4 * 48
    last = state.curves[-1]
    assert last[f"tokens/{E3C}"] == planned[E3C] and last[f"tokens/{MEDQUAD}"] == planned[MEDQUAD]


@pytest.mark.slow
def test_twins_read_identical_streams_by_source(tmp_path, data_root):
    """A CLM and an MNTP detour on the same mixture (and the same decay) read the same sequences of each source."""
    a = pretrain(parse_run_spec(mixed_spec(detour="clm")), tmp_path / "a", log=_quiet)
    b = pretrain(parse_run_spec(mixed_spec(detour="mntp", seed=18)), tmp_path / "b", log=_quiet)
    assert set(a.source_token_hashes) == {E3C, MEDQUAD}
    assert a.source_token_hashes == b.source_token_hashes and a.token_hash == b.token_hash
    c = pretrain(parse_run_spec(mixed_spec(weights=(0.3, 0.7))), tmp_path / "c", log=_quiet)
    assert c.source_token_hashes[MEDQUAD] != a.source_token_hashes[MEDQUAD]


def _killed_and_resumed(spec_file: Path, out: Path, pause_at: int | tuple[int, ...], tmp_path: Path) -> None:
    """`ablate run` held after its checkpoint at `pause_at` (ABLATE_PAUSE_AT), killed -9 there, then run again;
    several steps: killed at each in turn (each attempt resuming the last), then run to its end."""
    threads = str(torch.get_num_threads())  # what the in-process run compared with uses: the same sums
    cmd = [sys.executable, "-m", "ablate.cli", "run", str(spec_file), "--out", str(out)]
    for step in (pause_at,) if isinstance(pause_at, int) else pause_at:
        env = {**os.environ, "OMP_NUM_THREADS": threads, "ABLATE_PAUSE_AT": f"{step}:{tmp_path / 'never'}"}
        proc, _ = start_held(cmd, env)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not (out / "model").exists()
    done = subprocess.run(
        cmd, env={**os.environ, "OMP_NUM_THREADS": threads}, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert "resumed from step-" in (out / "log.txt").read_text()


@pytest.mark.slow
def test_kill_9_resume_is_bitwise_with_a_mixture_and_a_change_of_length(tmp_path, data_root):
    """Killed at a checkpoint inside the mixture, resumed, killed again inside the longer decay, resumed."""
    raw = mixed_spec()
    spec_file = tmp_path / "run.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    straight = pretrain(parse_run_spec(raw), tmp_path / "straight", log=_quiet)
    killed = tmp_path / "killed"
    _killed_and_resumed(spec_file, killed, (4, 8), tmp_path)
    a = load_file(str(tmp_path / "straight" / "model" / "model.safetensors"))
    b = load_file(str(killed / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    record = json.loads((killed / "records" / "run.json").read_text())
    assert record["source_token_hashes"] == straight.source_token_hashes
    assert record["source_tokens"] == straight.source_tokens
    curves = json.loads((killed / "records" / "curves.json").read_text())
    assert curves["loss"] == [row["loss"] for row in straight.curves]


def _tiny(spec_dict: dict):
    spec = parse_run_spec(spec_dict)
    return RunPlan(spec.run_id, spec, tuple(plan_phases(spec, 2)))


def test_branching_shares_nothing_between_two_weights():
    prelude = {"name": "warm", "objective": "mlm", "steps": 3}
    one = mixed_spec(weights=(0.5, 0.5))
    two = mixed_spec(weights=(0.9, 0.1))
    assert shared_prefix(_tiny(one), _tiny(two), lr_at)[0] == 0
    a, b = (_tiny({**s, "phases": [prelude, *s["phases"]]}) for s in (one, two))
    tree = plan_tree([a, b], lr_at)
    assert tree.branches[b.run_id].step == 3  # the shared warm-up, nothing of the mixture
    same = _tiny({**two, "phases": [prelude, *two["phases"]], "seed": 17})
    assert shared_prefix(b, same, lr_at)[0] == 3 + 6 + 4  # the same weights: everything


@pytest.mark.slow
def test_a_source_read_past_max_epochs_by_its_share_is_refused_before_submission(tmp_path, data_root):
    spec = parse_run_spec(mixed_spec(weights=(0.2, 0.8)))
    tokens = {E3C: 100_000, MEDQUAD: 400}  # MedQuAD: 12 sequences of 32 for ~19 planned
    with pytest.raises(SpecError) as err:
        check_source_epochs(spec, tokens)
    assert MEDQUAD in err.value.message and err.value.key == "data.max_epochs"
    check_source_epochs(spec, {E3C: 100_000, MEDQUAD: 100_000})
    # the CLI: a MedQuAD of 2 documents, read by a 0.8 share: exit 2, and no run folder
    raw = mixed_spec(weights=(0.2, 0.8))
    raw["phases"][0]["data"]["mixture"][1] = {"corpus": str(tmp_path / "small.txt"), "weight": 0.8}
    (tmp_path / "small.txt").write_text("A short question about a rare disease?\nAnd its short answer.\n" * 10)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    done = subprocess.run(
        [sys.executable, "-m", "ablate.cli", "run", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr
    assert "small.txt" in done.stderr and "max_epochs" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_run_without_phase_data_reads_as_before():
    """No mixture, no phase data: one member per phase, whose stream position is the sequences read before."""
    spec = parse_run_spec(
        {
            **mixed_spec(),
            "phases": [
                {"name": "a", "objective": "mlm", "steps": 5},
                {"name": "b", "objective": "clm", "steps": 3},
            ],
        }
    )
    assert not uses_own_data(spec)
    assert [d.starts for d in phase_data(spec)] == [(0,), (5 * 4,)]
    assert spec.run_id == parse_run_spec(json.loads(json.dumps(spec.model_dump(mode="json")))).run_id


def test_bad_data_names_the_key():
    with pytest.raises(SpecError, match="corpus or a mixture"):
        parse_run_spec({**mixed_spec(), "data": {"corpus": E3C, "mixture": [{"corpus": E3C, "weight": 1}]}})
    with pytest.raises(SpecError, match="each corpus once"):
        parse_run_spec(
            mixed_spec(weights=(1, 1))
            | {"data": {"mixture": [{"corpus": E3C, "weight": 1}, {"corpus": E3C, "weight": 2}]}}
        )
    with pytest.raises(SpecError, match="weight"):
        parse_run_spec(mixed_spec(weights=(0, 1)))


@pytest.mark.slow
def test_a_branch_of_a_one_corpus_parent_records_what_it_would_from_scratch(tmp_path, data_root):
    """A shared warm-up on the run's corpus, then a mixture: the branch's per-source tokens and hashes are the
    from-scratch run's (the parent counts its corpus too)."""
    from ablate.launch import worker
    from ablate.store import rundir

    warm = {"name": "warm", "objective": "mlm", "steps": 2}
    parent = parse_run_spec({**mixed_spec(), "phases": [warm, {"name": "mlm", "objective": "mlm", "steps": 12}]})
    child = parse_run_spec({**mixed_spec(), "phases": [warm, *mixed_spec()["phases"]]})
    plans = {s.run_id: RunPlan(s.run_id, s, tuple(plan_phases(s, 2))) for s in (parent, child)}
    tree = plan_tree(list(plans.values()), lr_at)
    assert tree.branches[child.run_id].step == 2
    folders = {}
    for s in (parent, child):
        folders[s.run_id] = folder = tmp_path / "runs" / s.run_id
        worker.prepare_run_dir(s, folder)
        b = tree.branches.get(s.run_id)
        rundir.write_branch(folder, b.parent if b else None, b.step if b else 0)
        rundir.write_branch_points(folder, tree.keep_steps(s.run_id))
    for s in (parent, child):
        assert worker.execute(folders[s.run_id]) == "done"
    assert "started from its checkpoint" in (folders[child.run_id] / "log.txt").read_text()
    scratch = pretrain(child, tmp_path / "scratch", log=_quiet)
    record = json.loads((folders[child.run_id] / "records" / "run.json").read_text())
    assert record["source_tokens"] == scratch.source_tokens
    assert record["source_token_hashes"] == scratch.source_token_hashes
    assert scratch.source_tokens[E3C] > 6 * 4 * 32 // 2  # the warm-up's E3C counted
