"""Paired bootstrap: is an arm's score different from the baseline's, over the units both were measured on?

A pairing unit is one (pretraining seed, fine-tuning seed) pair, or one fine-tuning seed when the pretraining
seeds are not independent replicates. Per unit the difference arm - baseline is taken; the units are
resampled with replacement (`n_resamples` times, from `seed`); the CI of the mean difference is the
percentile interval of the resampled means, and the two-sided p-value is the share of resampled means at
least as far from the observed mean as the observed mean is from zero (the bootstrap distribution shifted to
the null, as in Berg-Kirkpatrick et al., 2012), with the +1 correction so it is never exactly 0.

May import: nothing of ablate. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

N_RESAMPLES = 10_000


@dataclass(frozen=True)
class PairedResult:
    delta: float  # mean over units of (arm - baseline)
    ci_low: float
    ci_high: float
    p_value: float
    n_units: int


def paired_bootstrap(
    arm, baseline, *, n_resamples: int = N_RESAMPLES, seed: int = 0, confidence: float = 0.95
) -> PairedResult:
    """`arm[i]` and `baseline[i]` are the scores of unit i. Needs at least two units."""
    diffs = np.asarray(arm, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if diffs.ndim != 1 or len(diffs) < 2:
        raise ValueError(f"a paired test needs at least two pairing units, got {diffs.size}")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(diffs), size=(n_resamples, len(diffs)))
    return _summarise(diffs, diffs[picks].mean(axis=1), confidence)


def _summarise(diffs: np.ndarray, means: np.ndarray, confidence: float, plus_one: bool = True) -> PairedResult:
    observed = float(diffs.mean())
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    extreme = int(np.sum(np.abs(means - observed) >= abs(observed) - 1e-12))
    p = (extreme + 1) / (len(means) + 1) if plus_one else extreme / len(means)
    return PairedResult(observed, float(low), float(high), float(min(p, 1.0)), len(diffs))


@dataclass(frozen=True)
class RecoveryResult:
    recovery: float  # mean(hybrid - into) / mean(source - into); nan when the gap is 0
    ci_low: float  # percentile interval over resamples whose gap is not 0
    ci_high: float
    n_units: int


def recovery_bootstrap(
    hybrid, into, source, *, n_resamples: int = N_RESAMPLES, seed: int = 0, confidence: float = 0.95
) -> RecoveryResult:
    """The share of the gap from `into` to `source` that `hybrid` recovers, the three scored on the same
    units (`x[i]`: unit i), resampled together as paired_bootstrap resamples (from `seed`). One unit: the
    ratio, no interval."""
    h, i, s = (np.asarray(x, dtype=np.float64) for x in (hybrid, into, source))
    gained, gap = h - i, s - i
    observed = float(gained.mean() / gap.mean()) if gap.mean() != 0 else float("nan")
    if len(gap) < 2:
        return RecoveryResult(observed, float("nan"), float("nan"), len(gap))
    picks = np.random.default_rng(seed).integers(0, len(gap), size=(n_resamples, len(gap)))
    gaps = gap[picks].mean(axis=1)
    kept = gaps != 0
    ratios = gained[picks].mean(axis=1)[kept] / gaps[kept]
    if observed != observed or not len(ratios):
        return RecoveryResult(observed, float("nan"), float("nan"), len(gap))
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return RecoveryResult(observed, float(low), float(high), len(gap))
