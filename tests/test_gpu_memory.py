"""The GPU memory plan (ablate.predict.gpu_memory): a tiny ModernBERT's real training step traced on the meta
device, its peak split into weights, gradients, AdamW state, activations and temporaries; a grid whose
launcher states a GPU too small is exit 2 naming the largest micro-batch that fits; `micro_batch_size: auto`
resolves to one value for the runs compared and is recorded; bad GPU memory values are exit 2."""

from __future__ import annotations

import pytest
import torch
import yaml

from ablate.cli import main
from ablate.config.spec import parse_run_spec
from ablate.predict import gpu_memory
from ablate.launch.checks import checked_grid
from ablate.launch.oom import oom_reason
from builders import TOKENIZER, VALID_CORPUS, corpus_slice, run_spec, write_yaml

MODEL = "config:tiny-modernbert"


def _spec(seq_len: int = 64, batch: int = 4, objective: str = "clm", precision: str = "bf16"):
    """Traced on the meta device, never run: no tokenizer."""
    spec = run_spec(
        model=MODEL,
        data=corpus_slice(seq_len=seq_len),
        batch_size=batch,
        precision=precision,
        phases=[{"name": "p", "objective": objective, "steps": 1}],
    )
    del spec["tokenizer"]
    return parse_run_spec(spec)


def _grid(tmp_path, gpu_memory_gb, micro=4):
    grid = {
        "sweep": "mem",
        "base": {
            "model": MODEL,
            "tokenizer": TOKENIZER,
            "precision": "bf16",
            "data": corpus_slice(valid_corpus=VALID_CORPUS, max_documents=60, seq_len=64),
            "batch_size": 4,
            "micro_batch_size": micro,
            "probe": {"n_texts": 8, "max_length": 64},
        },
        "schedules": {
            "mlm": [{"name": "mlm", "objective": "mlm", "steps": 2}],
            "clm_detour": [{"name": "clm", "objective": "clm", "steps": 2}],
        },
        "axes": {"schedule": ["mlm", "clm_detour"]},
        "launcher": {"executor": "slurm", "slurm": {"gpus_per_node": 1, "gpu_memory_gb": gpu_memory_gb}},
    }
    return write_yaml(tmp_path / "mem.yaml", grid)


def _gib(n: int) -> float:
    return n / 2**30


@pytest.mark.slow
def test_the_peak_is_its_parts_and_grows_with_micro_batch_and_length():
    small, large = (gpu_memory.phase_memory(_spec(batch=4), m)[0] for m in (1, 4))
    longer = gpu_memory.phase_memory(_spec(seq_len=128, batch=4), 1)[0]
    for m in (small, large, longer):
        assert m.traced == m.weights + m.gradients + m.optimizer + m.activations + m.temporaries
        assert m.weights > 0 and m.activations > 0 and m.optimizer > 0
        assert m.predicted > m.traced + gpu_memory.CUDA_CONTEXT_BYTES
        assert m.kernels and set(m.kernels) <= {"cudnn", "flash", "efficient", "varlen"}  # fused, as on CUDA
    n_params = sum(p.numel() for p in gpu_memory._meta_model(MODEL, "sdpa").parameters())
    assert 4 * n_params <= small.weights < 4 * n_params + 2**20  # float32 master weights (+ small buffers)
    assert small.optimizer == 2 * 4 * n_params  # AdamW's two float32 moments (the step scalars: CPU)
    assert large.activations > small.activations and longer.activations > small.activations
    assert large.weights == small.weights and large.optimizer == small.optimizer


def test_bf16_autocast_keeps_float32_master_weights_and_takes_flash_attention():
    bf16 = gpu_memory.phase_memory(_spec(precision="bf16"), 2)[0]
    fp32 = gpu_memory.phase_memory(_spec(precision="fp32"), 2)[0]
    assert bf16.weights == fp32.weights and bf16.optimizer == fp32.optimizer
    assert {"cudnn", "varlen"} <= set(bf16.kernels)  # cuDNN (global layers) and flash varlen need bf16, as on CUDA
    assert not {"cudnn", "flash", "varlen"} & set(fp32.kernels)
    assert bf16.activations != fp32.activations


def test_a_gpu_too_small_is_exit_2_naming_the_largest_micro_batch_that_fits(tmp_path, capsys):
    spec = _spec()
    two, four = (
        max(
            m.predicted
            for mlm_or_clm in ("mlm", "clm")
            for m in gpu_memory.phase_memory(_spec(objective=mlm_or_clm), micro)
        )
        for micro in (2, 4)
    )
    limit = _gib((two + four) / 2)  # micro-batch 2 fits, 4 does not
    assert spec.batch_size == 4
    assert main(["sweep", str(_grid(tmp_path, limit)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "largest micro-batch that fits: 2" in err and "micro_batch_size: 2" in err

    assert main(["sweep", str(_grid(tmp_path, limit, micro=2)), "--dry-run", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "GPU memory per device" in out and "peak_GiB" in out and " NO" not in out


def test_auto_picks_one_micro_batch_for_the_compared_runs_and_records_it(tmp_path):
    fits = {
        micro: max(m.predicted for o in ("mlm", "clm") for m in gpu_memory.phase_memory(_spec(objective=o), micro))
        for micro in (2, 4)
    }
    limit = _gib(fits[2] / (1 - gpu_memory.AUTO_MARGIN) * 1.001)  # 2 fits with the margin kept free, 4 not
    assert fits[4] > limit * 2**30 * (1 - gpu_memory.AUTO_MARGIN)
    checked = checked_grid(str(_grid(tmp_path, limit, micro="auto")))
    assert {r.spec.micro_batch_size for r in checked.runs} == {2}
    assert all(r.spec.labels["micro_batch_size"] == "auto" for r in checked.runs)
    assert any("micro_batch_size auto: 2" in n and "dropout" in n for n in checked.notes)


def test_auto_without_the_gpu_s_memory_and_bad_gpu_memory_values_are_exit_2(tmp_path, capsys):
    assert main(["sweep", str(_grid(tmp_path, None, micro="auto")), "--dry-run"]) == 2
    assert "gpu_memory_gb" in capsys.readouterr().err
    for bad in ("H100", -3, True):
        assert main(["sweep", str(_grid(tmp_path, bad)), "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert "launcher.slurm.gpu_memory_gb" in err and "H100-80" in err and "A100-40" in err


def test_an_out_of_memory_at_run_time_is_named_in_the_run_s_status(tmp_path, monkeypatch, capsys):
    from ablate.launch import worker
    from ablate.store import rundir

    spec = _spec(batch=4).model_copy(update={"micro_batch_size": 2})
    out = tmp_path / "run"
    worker.prepare_run_dir(spec, out)

    def oom(*_args, **_kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(worker, "_pretrain_then_evaluate", oom)
    with pytest.raises(torch.OutOfMemoryError):
        worker.execute(out)
    status = rundir.read_status(out)
    said = status["out_of_gpu_memory"]
    assert status["state"] == "failed" and status["error"].rstrip().endswith(said)  # `ablate status` shows it
    assert "out of GPU memory in phase p" in said and "micro-batch 2" in said
    expected = gpu_memory.phase_memory(spec, 2)[0].predicted
    assert f"predicted peak {gpu_memory.gib(expected)} GiB" in said
    assert oom_reason(RuntimeError("other"), spec, None) is None
    named = oom_reason(
        torch.OutOfMemoryError("x"), spec, {"phase": "p", "step": 7}, device_bytes=80 * 2**30, predict=False
    )
    assert "after step 7" in named and "device memory 80.0 GiB" in named


def test_a_run_spec_with_auto_is_exit_2(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": MODEL,
                "data": {"corpus": "corpus_en_e3c/train.txt", "seq_len": 64},
                "batch_size": 4,
                "micro_batch_size": "auto",
                "phases": [{"name": "p", "objective": "mlm", "steps": 1}],
            }
        )
    )
    assert main(["run", str(path)]) == 2
    assert "gpu_memory_gb" in capsys.readouterr().err


@pytest.mark.slow
def test_the_meta_trace_accounts_what_real_tensors_hold_on_the_cpu():
    """The same step (float32, so the CPU runs what meta traces but its own SDPA kernel) under MemTracker
    with real tensors: every part within 0.1% of the meta trace (BENCHMARKS.md)."""
    for objective, length in (("clm", 64), ("mlm", 128)):
        spec = _spec(seq_len=length, objective=objective, precision="fp32")
        shape = gpu_memory.step_shapes(spec, 2)[0]
        meta, real = gpu_memory.trace_step(shape, spec), gpu_memory.trace_step(shape, spec, "cpu")
        for part in gpu_memory.PARTS:
            assert abs(getattr(meta, part) - getattr(real, part)) <= 1e-3 * max(getattr(real, part), 2**20), part
        assert abs(meta.traced - real.traced) <= 1e-3 * real.traced


def _finetune_grid(tmp_path, gpu_memory_gb, tasks=("hoc",)):
    path = _grid(tmp_path, gpu_memory_gb, micro=2)
    grid = yaml.safe_load(path.read_text())
    # bf16: the English paper profile fine-tunes in fp32 as its harness does, which flash varlen cannot serve
    grid["base"]["eval"] = {"tasks": list(tasks), "finetune": {"precision": "bf16"}}
    return write_yaml(path, grid)


def _hoc_shape(tmp_path, batch: int):
    import dataclasses

    from ablate.predict.finetune_memory import finetune_shapes

    [shape] = finetune_shapes(checked_grid(str(_finetune_grid(tmp_path, None))).runs[0].spec)
    return dataclasses.replace(shape, batch=batch)


@pytest.mark.slow
def test_each_fine_tuning_task_s_peak_is_printed_and_one_that_does_not_fit_is_exit_2(tmp_path, capsys):
    """HoC's step at its own batch (16) on its longest batch: traced on meta as pretraining's is; a GPU that
    holds pretraining (micro-batch 2) but not that step is refused before anything runs, with the largest
    batch that fits."""
    from ablate.predict.finetune_memory import finetune_step_memory

    hoc = {b: finetune_step_memory(_hoc_shape(tmp_path, b)) for b in (16, 8)}
    assert hoc[16].batch == 16 and hoc[16].length == 512 and hoc[16].type == "multi_label_classification"
    full = hoc[16].memory
    assert full.traced == sum(getattr(full, p) for p in gpu_memory.PARTS)
    assert full.activations > hoc[8].memory.activations
    assert abs(full.weights - hoc[8].memory.weights) < 2**10  # (the peaks fall at other moments of the step)
    assert full.optimizer > full.weights > 0  # AdamW's two moments of every trained parameter
    assert set(full.kernels) == {"varlen"}  # each row's tokens, unpadded (evaluate.finetune._unpadded)
    pretraining = max(m.predicted for o in ("mlm", "clm") for m in gpu_memory.phase_memory(_spec(objective=o), 2))
    below = max(pretraining, hoc[8].memory.predicted)
    assert below < full.predicted
    limit = _gib((below + full.predicted) / 2)
    assert main(["sweep", str(_finetune_grid(tmp_path, limit)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "fine-tuning hoc (batch 16, longest batch 512 tokens)" in err and "largest batch that fits: 8" in err
    assert "base.eval.finetune.batch_size" in err and "got 16" in err

    assert main(["sweep", str(_finetune_grid(tmp_path, 80)), "--dry-run", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table = out.split("GPU memory of fine-tuning")[1]
    assert "hoc" in table and "512" in table and gpu_memory.gib(full.predicted) in table


def test_an_out_of_memory_while_fine_tuning_names_the_task_its_batch_and_predicted_peak(tmp_path):
    from ablate.predict.finetune_memory import finetune_step_memory

    spec = checked_grid(str(_finetune_grid(tmp_path, None))).runs[0].spec
    progress = {"stage": "finetune", "phase": "fine-tuning hoc", "task": "hoc", "seed": 3, "step": 5}
    said = oom_reason(torch.OutOfMemoryError("x"), spec, progress, device_bytes=40 * 2**30)
    expected = finetune_step_memory(_hoc_shape(tmp_path, 16)).memory.predicted
    assert said.startswith("out of GPU memory fine-tuning hoc (seed 3) after step 5, batch 16")
    assert f"predicted peak {gpu_memory.gib(expected)} GiB (longest batch, 512 tokens)" in said
    assert "device memory 40.0 GiB" in said
    before = oom_reason(
        torch.OutOfMemoryError("x"), spec, {"stage": "finetune", "phase": "fine-tuning hoc", "step": 0}
    )
    assert before.startswith("out of GPU memory fine-tuning, before the first task reported")


@pytest.mark.slow
def test_an_out_of_memory_in_a_sweep_is_named_the_sweep_goes_on_and_a_retry_takes_a_smaller_auto_micro_batch(
    tmp_path, monkeypatch, capsys
):
    """Two arms with micro_batch_size auto (4 fits an 80 GiB GPU); the CLM arm runs out of GPU memory at 4
    (injected). The MLM arm still finishes; `ablate status` names the OOM; --retry-failed moves both arms
    (compared runs share one micro-batch) to 2 and they finish."""
    import json

    from ablate.launch import worker
    from ablate.store import rundir

    path = _grid(tmp_path, None, micro="auto")
    grid = yaml.safe_load(path.read_text())
    grid["launcher"] = {"executor": "debug", "local": {"gpu_memory_gb": 80}}
    grid["base"]["data"]["max_documents"] = 20
    path.write_text(yaml.safe_dump(grid))
    results = tmp_path / "r"
    real = worker._pretrain_then_evaluate

    def oom_for_clm_at_4(spec, *args, **kwargs):
        if spec.micro_batch_size == 4 and spec.phases[0].objective == "clm":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(worker, "_pretrain_then_evaluate", oom_for_clm_at_4)
    monkeypatch.setattr("pdb.post_mortem", lambda *_a, **_k: None)  # the debug executor's debugger on a failure
    assert main(["sweep", str(path), "--results", str(results)]) == 1
    out = capsys.readouterr().out
    assert "summary: 1 done, 1 failed" in out
    runs = results / "mem" / "runs"
    states = {d.name: rundir.read_status(d) for d in runs.iterdir()}
    [failed] = [s for s in states.values() if s["state"] == "failed"]
    assert "out of GPU memory in phase clm" in failed["out_of_gpu_memory"] and "micro-batch 4" in failed["error"]
    assert main(["status", "mem", "--results", str(results)]) in (0, 1)
    assert "out of GPU memory in phase clm" in capsys.readouterr().out
    assert main(["report", str(results / "mem"), "--html"]) == 0
    assert "out of GPU memory in phase clm" in (results / "mem" / "report.html").read_text()

    assert main(["sweep", str(path), "--retry-failed", "--results", str(results)]) == 0
    captured = capsys.readouterr()
    assert "ran out of GPU memory at 4, now 2" in captured.err
    ids = json.loads((results / "mem" / "sweep.json").read_text())["run_ids"]
    specs = [json.loads((runs / i / "spec.json").read_text()) for i in ids]
    assert [s["micro_batch_size"] for s in specs] == [2, 2]
    assert all(rundir.read_status(runs / i)["state"] == "done" for i in ids)
    assert failed["out_of_gpu_memory"] in [
        s.get("out_of_gpu_memory") for s in (rundir.read_status(d) for d in runs.iterdir())
    ]  # the record kept


@pytest.mark.slow
def test_the_fine_tuning_trace_accounts_what_real_tensors_hold_on_the_cpu(tmp_path):
    """A multi-label (HoC) and a token-classification (NCBI-disease) step of tiny ModernBERT, float32, traced
    on meta and run with real tensors under MemTracker on the CPU: the same parts within 0.1% (BENCHMARKS.md)."""
    import dataclasses
    import json

    from ablate.predict import finetune_memory

    for task in ("hoc", "ncbi_disease"):
        shape = finetune_memory.finetune_shapes(
            checked_grid(str(_finetune_grid(tmp_path, None, tasks=(task,)))).runs[0].spec
        )[0]
        fp32 = json.dumps({**json.loads(shape.settings), "precision": "fp32"}, sort_keys=True)
        shape = dataclasses.replace(shape, settings=fp32, batch=8)
        meta, real = finetune_memory._trace(shape), finetune_memory._trace(shape, "cpu")
        assert meta.length == real.length > 64
        for part in gpu_memory.PARTS:
            assert abs(getattr(meta.memory, part) - getattr(real.memory, part)) <= 1e-3 * max(
                getattr(real.memory, part), 2**20
            ), (task, part)
