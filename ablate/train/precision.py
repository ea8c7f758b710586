"""How a run computes on its device: bf16 autocast or float32, torch.compile of the encoder, deterministic
algorithms. Each is a RunSpec field and each path runs on the CPU too, so the tests execute what a GPU runs.

- `precision`: auto is bf16 autocast on CUDA and float32 on the CPU (what runs always did); bf16 and fp32 say
  it whatever the device. Master weights, AdamW moments and the saved model stay float32 either way.
- `compile`: auto (the default) compiles on CUDA and not on the CPU; true and false say it whatever the device.
  Each encoder block goes through torch.compile (inductor; on the CPU it needs a C++ compiler), one graph
  per block kind shared by the blocks, recompiles named in the run's log, the compiled code cached across
  processes (ablate.train.compiled). The compiled blocks are the model's own modules, so they read the live
  parameters; Dynamo guards on each parameter's requires_grad (and on the is_causal flags a CLM phase sets),
  so a phase that freezes other layers recompiles instead of reusing a graph traced for another trainable
  set (tests/test_precision_compile.py checks the weights). On CUDA the vocabulary loss's softmax is
  compiled whatever this says (ablate.train.vocab_loss).
- `deterministic`: torch.use_deterministic_algorithms, cuDNN's deterministic kernels and a fixed cuBLAS
  workspace. On CUDA this is what makes the fused loss's index_add_ and SDPA's backward repeatable; on the CPU
  our kernels are already deterministic for a given thread count and the switch changes no number.

May import: config.
"""

from __future__ import annotations

import contextlib
import os

import torch

from ablate.config.spec import RunSpec

CUBLAS_DETERMINISTIC = ":4096:8"  # torch's reproducibility notes: cuBLAS needs a fixed workspace


def uses_autocast(spec: RunSpec, device: torch.device) -> bool:
    """Whether the run's forward runs under bf16 autocast on `device`."""
    return autocast_on(spec.precision, device)


def autocast_on(precision: str, device: torch.device | str) -> bool:
    """Whether a forward with this precision setting (auto, bf16, fp32) runs under bf16 autocast on `device`:
    pretraining (RunSpec.precision) and fine-tuning (FinetuneSettings.precision) decide alike."""
    return precision == "bf16" or (precision == "auto" and torch.device(device).type == "cuda")


def uses_compile(spec: RunSpec, device: torch.device) -> bool:
    """Whether the run's encoder goes through torch.compile on `device` (auto: on CUDA only), or every run of
    this process with ABLATE_COMPILE=1."""
    if os.environ.get("ABLATE_COMPILE", "0") not in ("", "0", "false", "no"):
        return True
    return spec.compile is True or (spec.compile == "auto" and device.type == "cuda")


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on `device` when enabled, else nothing (devices without autocast, such as the meta device
    the CUDA-path tests run on, refuse even a disabled torch.autocast)."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def set_determinism(on: bool) -> None:
    """Process-wide, as torch keeps it: set by every run's setup, so a run asking for nothing after one that
    asked for determinism runs with torch's defaults again. CUBLAS_WORKSPACE_CONFIG is read when cuBLAS makes
    its handle: this runs before the model touches the GPU."""
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.deterministic = on
