"""Where a data-parallel run puts its tensors: a resumed checkpoint lands on each parameter's device (moments
and `step` where torch wants them), whatever device it was saved from; a rank gets its own GPU or an error;
a Slurm launcher asks for one task per GPU; the base model's probe runs on the run's device, at the first
phase end (after the process group forms), with the numbers it always had on CPU.

No GPU needed: other devices are the "meta" device, a checkpoint written as a CUDA machine writes it, and
mocked device counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ablate.analysis import probe
from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.config.grid import load_grid
from ablate.config.spec import parse_run_spec
from ablate.models import loading
from ablate.models.loading import load_masked_lm, load_tokenizer
from ablate.train.checkpoint import TrainState, load_checkpoint, save_checkpoint
from ablate.config.device import local_device_index, pick_device
from ablate.train.optimizer import Optimizer
from builders import MODEL, TOKENIZER, VALID_CORPUS, corpus_slice, run_spec, write_yaml

SPEC = run_spec(data=corpus_slice(valid_corpus=VALID_CORPUS), probe={"n_texts": 8, "max_length": 32})


def _spec():
    return parse_run_spec(SPEC)


def _trained_checkpoint(tmp_path, fused: bool):
    """A checkpoint after one AdamW step of tiny-bert on CPU: (its folder, the optimizer's moments by name,
    the weights)."""
    model = load_masked_lm(MODEL, seed=0)
    opt = Optimizer(model, _spec(), fused=fused)
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.01)
    opt.torch.step()
    path = save_checkpoint(tmp_path / "ckpt", model, opt, TrainState(global_step=1))
    return path, opt.state_by_name(), {n: p.detach().clone() for n, p in model.named_parameters()}


def _on_meta(monkeypatch, fused: bool):
    """tiny-bert and its optimizer on the meta device. Its weights hold nothing to load (and safetensors
    cannot tell meta tensors' ties apart), so load_checkpoint loads only the optimizer's tensors into it."""
    from ablate.train import checkpoint

    monkeypatch.setattr(checkpoint, "load_model", lambda model, filename, **kw: None)
    model = load_masked_lm(MODEL, seed=0).to("meta")
    model.tie_weights()  # moving to meta makes new parameters, one per module: tie the decoder again
    return model, Optimizer(model, _spec(), fused=fused)


# ---------------------------------------------------------------- resuming onto another device


@pytest.mark.parametrize("fused", [True, False])
def test_a_resume_puts_moments_and_step_where_torch_wants_them_for_parameters_on_another_device(
    tmp_path, fused, monkeypatch
):
    path, _, _ = _trained_checkpoint(tmp_path, fused)
    model, opt = _on_meta(monkeypatch, fused)
    load_checkpoint(path, model, opt)
    loaded = opt.state_by_name()
    assert set(loaded) == set(opt.named)
    for name, moments in loaded.items():
        assert moments.keys() == {"step", "exp_avg", "exp_avg_sq"}, name
        assert moments["exp_avg"].device.type == moments["exp_avg_sq"].device.type == "meta", name
        # fused: on the parameter's device (torch refuses a step elsewhere); else the CPU scalar torch keeps
        assert moments["step"].device.type == ("meta" if fused else "cpu"), name
        assert moments["step"].dtype == torch.float32 and moments["step"].dim() == 0, name


@pytest.mark.parametrize("fused", [True, False])
def test_the_placement_is_the_one_torchs_own_load_state_dict_chooses(tmp_path, fused, monkeypatch):
    path, saved, _ = _trained_checkpoint(tmp_path, fused)
    model, opt = _on_meta(monkeypatch, fused)
    load_checkpoint(path, model, opt)
    reference = torch.optim.AdamW(list(model.parameters()), **({"fused": True} if fused else {}))
    by_param = {id(p): n for n, p in model.named_parameters()}
    reference.load_state_dict(
        {
            "state": {i: saved[by_param[id(p)]] for i, p in enumerate(model.parameters())},
            "param_groups": [{**reference.param_groups[0], "params": list(range(len(saved)))}],
        }
    )
    ours = opt.state_by_name()
    for p, theirs in reference.state.items():
        for key, value in theirs.items():
            mine = ours[by_param[id(p)]][key]
            assert (mine.device, mine.dtype) == (value.device, value.dtype), (by_param[id(p)], key)


def _save_as_from_cuda(monkeypatch, tmp_path, fused: bool):
    """A checkpoint whose optimizer.pt records cuda:0 for every tensor, as rank 0 of a GPU job writes it
    (torch.save writes a CUDA tensor's bytes from a host copy, so only the location tag differs)."""
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        return _trained_checkpoint(tmp_path, fused)


def test_a_checkpoint_saved_from_cuda_0_loads_on_a_machine_without_that_device(tmp_path, monkeypatch):
    path, saved, weights = _save_as_from_cuda(monkeypatch, tmp_path, fused=True)
    if not torch.cuda.is_available():  # the file really says cuda:0: read as saved, it cannot load here
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(path / "optimizer.pt", weights_only=True)
    model = load_masked_lm(MODEL, seed=1)
    opt = Optimizer(model, _spec(), fused=True)
    load_checkpoint(path, model, opt)
    loaded = opt.state_by_name()
    for name, moments in saved.items():
        for key, value in moments.items():
            assert loaded[name][key].device.type == "cpu" and torch.equal(loaded[name][key], value), (name, key)
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())  # not seed 1's: the saved ones


def test_optimizer_pt_is_read_to_cpu_without_running_code(tmp_path, monkeypatch):
    path, _, _ = _trained_checkpoint(tmp_path, fused=True)
    calls, load = [], torch.load

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording)
    model, opt = _on_meta(monkeypatch, True)
    load_checkpoint(path, model, opt)
    assert [(c.get("map_location"), c.get("weights_only")) for c in calls] == [("cpu", True)]


# ---------------------------------------------------------------- one GPU per rank


def _gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)


def test_each_rank_gets_the_gpu_of_its_local_rank(monkeypatch):
    _gpus(monkeypatch, 4)
    assert [local_device_index(r) for r in range(4)] == [0, 1, 2, 3]
    assert pick_device("cuda", 3) == torch.device("cuda", 3) == pick_device("auto", 3)


def test_a_task_that_sees_one_gpu_has_it_for_its_own(monkeypatch):
    _gpus(monkeypatch, 1)  # --gpus-per-task=1 / --gpu-bind: each task sees its own GPU as cuda:0
    assert local_device_index(0) == local_device_index(3) == 0


@pytest.mark.parametrize("visible, rank", [(2, 2), (4, 7), (0, 0)])
def test_a_rank_beyond_the_visible_gpus_is_refused_not_sent_to_gpu_0(monkeypatch, visible, rank):
    _gpus(monkeypatch, visible)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(visible))))
    with pytest.raises(SpecError) as info:
        local_device_index(rank)
    err = info.value
    assert (err.key, err.value) == ("LOCAL_RANK", rank)
    assert f"local rank {rank}" in err.message and f"sees {visible} GPUs" in err.message
    if visible:
        assert f"0..{visible - 1}" in err.allowed
        assert f"(CUDA_VISIBLE_DEVICES={','.join(map(str, range(visible)))})" in err.message
        with pytest.raises(SpecError, match=f"local rank {rank}"):
            pick_device("cuda", rank)


# ---------------------------------------------------------------- the Slurm launcher: one task per GPU


def _grid(tmp_path, **slurm):
    grid = {
        "sweep": "t",
        "base": {k: SPEC[k] for k in ("model", "tokenizer", "data")},
        "schedules": {"mlm": SPEC["phases"]},
        "launcher": {"executor": "slurm", "slurm": slurm},
    }
    return write_yaml(tmp_path / "grid.yaml", grid)


@pytest.mark.parametrize("gpus, tasks", [(4, 1), (1, 2), (2, 4)])
def test_gpus_per_node_other_than_tasks_per_node_exits_2_naming_both(tmp_path, capsys, gpus, tasks):
    path = _grid(tmp_path, gpus_per_node=gpus, tasks_per_node=tasks)
    rc = main(["sweep", str(path), "--dry-run", "--results", str(tmp_path / "results")])
    err = capsys.readouterr().err
    assert rc == 2 and not (tmp_path / "results").exists()
    assert err.startswith(
        f"error: {path}: launcher.slurm.tasks_per_node: one data-parallel rank per GPU: "
        f"launcher.slurm.gpus_per_node is {gpus}, so tasks_per_node must be {gpus}"
    )
    assert f"got {tasks}; allowed: {gpus} (= gpus_per_node), or gpus_per_node: 0 for CPU ranks" in err


@pytest.mark.parametrize("gpus, tasks", [(4, 4), (1, 1), (0, 3)])
def test_one_task_per_gpu_or_cpu_ranks_are_accepted(tmp_path, gpus, tasks):
    launcher = load_grid(_grid(tmp_path, gpus_per_node=gpus, tasks_per_node=tasks, nodes=2)).launcher
    assert (launcher.ranks(), launcher.gpus()) == (2 * tasks, 2 * gpus)


# ---------------------------------------------------------------- the base model's probe


@pytest.fixture
def model_loads(monkeypatch):
    """The sources of every load_masked_lm call from now on."""
    loads, load = [], loading.load_masked_lm

    def recording(source, *args, **kwargs):
        loads.append(source)
        return load(source, *args, **kwargs)

    monkeypatch.setattr(loading, "load_masked_lm", recording)
    return loads


def _moved(model: torch.nn.Module) -> torch.nn.Module:
    """The model with its weights changed as a phase of training would (deterministically)."""
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(torch.sin(torch.arange(p.numel(), dtype=p.dtype) + i).view_as(p) * 0.05)
    return model


def test_the_base_probe_waits_for_the_first_phase_end_and_keeps_its_cpu_numbers(data_root, model_loads):
    spec = _spec()
    hook = probe.cka_vs_base_hook(spec)
    assert model_loads == [], "the base model was loaded before pretraining formed the process group"
    trained = _moved(load_masked_lm(MODEL, seed=spec.seed))
    rng = torch.get_rng_state()
    rows = hook("mlm", trained)
    assert torch.equal(torch.get_rng_state(), rng), "the probe changed the run's random stream"
    assert model_loads == [MODEL]
    tokenizer, texts = (
        load_tokenizer(TOKENIZER),
        probe.probe_texts(probe.held_out_texts(spec), 8, spec.probe.seed, corpus=spec.data.valid_corpus),
    )
    base = probe.representations_for(load_masked_lm(MODEL, seed=spec.seed), tokenizer, texts, 32)
    expected = probe.cka_vs_reference(probe.representations_for(trained, tokenizer, texts, 32), base)
    assert [r["value"] for r in rows] == expected and [r["layer"] for r in rows] == list(range(-1, len(base) - 1))
    assert all(0 < v < 1 for v in expected[1:]), expected  # the trained model did move
    hook("mlm_decay", trained)
    assert model_loads == [MODEL], "the base model was probed again"


def test_the_base_probe_runs_on_the_device_of_the_run(data_root, model_loads, monkeypatch):
    devices = []

    def representations(model, tokenizer, texts, max_length):
        devices.append(next(model.parameters()).device.type)
        return [np.eye(len(texts), 3) + i for i in range(3)]

    monkeypatch.setattr(probe, "representations_for", representations)
    hook = probe.cka_vs_base_hook(_spec())
    hook("mlm", load_masked_lm(MODEL, seed=0).to("meta"))
    assert devices == ["meta", "meta"] and model_loads == [MODEL]  # the base model, then the run's
