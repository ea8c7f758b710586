"""Dropout on the CPU from a fast bit stream, drawn in the same order and from the same seeds as torch's.

torch's CPU `bernoulli_` draws one Mersenne-Twister number per element in a single thread (its vectorised MKL
path runs on Intel processors only), so on other CPUs a MiniLM step spends about a tenth of its time drawing
dropout masks. Here each dropout call takes one 63-bit seed from torch's default generator, so the loop's
per-micro-batch seeding, a checkpoint's RNG state and bit-exact resume govern it exactly as they govern
`bernoulli_`, and numpy's PCG64 turns the seed into 16 random bits per element: an element is kept with
probability 1 - round(p * 65536) / 65536 (p = 0.1: 0.0000061 away from p), and the kept ones are scaled by
the inverse of that probability, so the expectation is exact. CUDA and other devices keep torch's dropout.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

LEVELS = 1 << 16


def cpu_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """x with each element zeroed with probability p (16-bit resolution) and the rest scaled: training mode."""
    dropped = round(p * LEVELS)
    if dropped <= 0:
        return x
    if dropped >= LEVELS:
        return x * 0
    seed = int(torch.randint(0, 2**63 - 1, (1,)))
    words = -(-x.numel() // 4)                          # four 16-bit draws in each 64-bit word
    bits = np.random.PCG64(seed).random_raw(words).view(np.int16)[: x.numel()]
    keep = torch.from_numpy(bits).view(x.shape) >= dropped - LEVELS // 2
    return x * keep.to(x.dtype).mul_(LEVELS / (LEVELS - dropped))


class CpuDropout(nn.Dropout):
    """nn.Dropout whose training-mode masks on the CPU come from cpu_dropout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not self.inplace and x.device.type == "cpu":
            return cpu_dropout(x, self.p)
        return super().forward(x)


def use_cpu_dropout(model: nn.Module) -> nn.Module:
    """The model with every plain nn.Dropout drawing its CPU masks through cpu_dropout (no parameters change,
    so saved weights and checkpoints are the same files)."""
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = CpuDropout
    return model
