"""Learning rate per optimizer step inside a phase: warmup, then constant / linear / 1-sqrt / cosine decay.
The schedule restarts at every phase (the optimizer state does not)."""

from __future__ import annotations

import math

from ablate.config.spec import LRSchedule


def warmup_steps(schedule: LRSchedule, phase_steps: int) -> int:
    if schedule.warmup_fraction:
        return int(round(schedule.warmup_fraction * phase_steps))
    return min(schedule.warmup_steps, phase_steps)


def lr_at(schedule: LRSchedule, peak: float, step: int, phase_steps: int) -> float:
    """LR for optimizer step `step` (0-based) of a phase of `phase_steps` steps.

    Warmup ramps linearly to peak over its steps (first step peak/warmup). The decay runs over the rest:
    at its last step the LR is exactly final_fraction * peak. 1-sqrt: peak * (1 - (1-f) * sqrt(progress)).
    """
    warm = warmup_steps(schedule, phase_steps)
    if step < warm:
        return peak * (step + 1) / warm
    if schedule.decay == "constant":
        return peak
    span = phase_steps - warm
    progress = 1.0 if span <= 1 else (step - warm) / (span - 1)
    floor = schedule.final_fraction
    if schedule.decay == "linear":
        factor = 1 - (1 - floor) * progress
    elif schedule.decay == "1-sqrt":
        factor = 1 - (1 - floor) * math.sqrt(progress)
    else:  # cosine
        factor = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return peak * factor
