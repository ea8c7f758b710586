"""Local runs on a machine with several GPUs: each job run at once gets GPUs of its own, every GPU going to
one of them (launch.gpus), the device list faked at the seam (CUDA_VISIBLE_DEVICES, the device count); the sweep's jobs themselves are
checked in tests/test_launch.py (local_sweep)."""

from __future__ import annotations

import pytest

from ablate.config.errors import SpecError
from ablate.launch.gpus import GpuPool, gpu_sets, job_parameters, visible_gpus


def test_visible_gpus_come_from_cuda_visible_devices_else_the_device_count():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 5"}, device_count=8) == ("3", "5")
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, device_count=8) == ()  # set but empty: none
    assert visible_gpus({}, device_count=4) == ("0", "1", "2", "3")
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aa,MIG-bb"}) == ("GPU-aa", "MIG-bb")


def test_each_run_at_once_gets_a_disjoint_set_and_too_many_is_an_error():
    assert gpu_sets(("3", "5"), parallel=2) == [("3",), ("5",)]
    assert gpu_sets(("0", "1", "2", "3"), parallel=2, per_run=2) == [("0", "1"), ("2", "3")]
    assert gpu_sets((), parallel=8) == []  # a CPU machine: nothing to share out
    with pytest.raises(SpecError, match="3 local runs at once need 3 GPUs") as err:
        gpu_sets(("0", "1"), parallel=3)
    assert err.value.key == "launcher.local.parallel" and "1..2" in err.value.allowed


def test_every_gpu_goes_to_a_run_its_fine_tunings_spread_over():
    # a run pretrains on the first GPU of its set; its fine-tunings use all of it (launch.shares)
    assert gpu_sets(("0", "1", "2", "3"), parallel=2) == [("0", "1"), ("2", "3")]
    assert gpu_sets(("0", "1", "2", "3", "4"), parallel=2) == [("0", "1", "2"), ("3", "4")]
    assert gpu_sets(("0", "1", "2", "3"), parallel=1) == [("0", "1", "2", "3")]
    assert gpu_sets(("GPU-aa", "GPU-bb", "GPU-cc"), parallel=3) == [("GPU-aa",), ("GPU-bb",), ("GPU-cc",)]
    assert job_parameters(("2", "3")) == {"visible_gpus": (2, 3), "gpus_per_node": 2, "setup": []}


def test_the_pool_hands_each_running_job_its_own_set_and_takes_it_back():
    pool = GpuPool(gpu_sets(("0", "1"), parallel=2))
    first, second = pool.take("a"), pool.take("b")
    assert {first, second} == {("0",), ("1",)}
    with pytest.raises(RuntimeError, match="no free GPU set"):
        pool.take("c")
    pool.give_back("a")
    assert pool.take("c") == first
    assert GpuPool([]).take("x") is None  # no GPUs: the job's environment is left alone


def test_job_parameters_use_submitits_visible_gpus_for_indices_and_an_export_otherwise():
    assert job_parameters(None) == {}
    assert job_parameters(("1",)) == {"visible_gpus": (1,), "gpus_per_node": 1, "setup": []}
    uuid = job_parameters(("GPU-1f2e",))
    assert uuid["gpus_per_node"] == 0 and uuid["setup"] == ["export CUDA_VISIBLE_DEVICES=GPU-1f2e"]
