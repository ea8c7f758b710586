"""Fine-tuning's own progress reports (ablate.evaluate.finetune): about 20 an epoch and one after each dev
evaluation, as dicts the console and trackers read (stage "finetune").

May import: evaluate.tasks.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ablate.evaluate.tasks import TaskSpec


class FinetuneProgress:
    """finetune's own progress: about 20 reports an epoch and one after each dev evaluation."""

    def __init__(
        self, progress: Callable[[dict], None] | None, task: TaskSpec, seed: int, epochs: int, steps_per_epoch: int
    ):
        self.progress, self.task, self.seed, self.epochs = progress, task, seed, epochs
        self.total, self.every = steps_per_epoch * epochs, max(1, steps_per_epoch // 20)
        self.step, self.epoch, self.best, self.started = 0, 1, None, time.perf_counter()

    def step_done(self, loss: torch.Tensor) -> None:
        self.step += 1
        if self.step % self.every == 0:
            self.report(loss)

    def report(self, loss: torch.Tensor) -> None:
        if self.progress is None:
            return
        eta = (time.perf_counter() - self.started) / self.step * (self.total - self.step) if self.step else 0.0
        task = self.task
        self.progress(
            {
                "stage": "finetune",
                "phase": f"fine-tuning {task.name}",
                "task": task.name,
                "seed": self.seed,
                "epoch": self.epoch,
                "epochs": self.epochs,
                "step": self.step,
                "total_steps": self.total,
                "loss": loss.item(),
                "dev_metric": task.primary_metric,
                "dev": self.best,
                "eta_s": eta,
            }
        )
