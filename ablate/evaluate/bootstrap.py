"""Paired bootstrap: is an arm's score different from the baseline's, over the units both were measured on?

A pairing unit is one (pretraining seed, fine-tuning seed) pair, or one fine-tuning seed when the pretraining
seeds are not independent replicates. Per unit the difference arm - baseline is taken; the units are
resampled with replacement (`n_resamples` times, from `seed`); the CI of the mean difference is the
percentile interval of the resampled means, and the two-sided p-value is the share of resampled means at
least as far from the observed mean as the observed mean is from zero (the bootstrap distribution shifted to
the null, as in Berg-Kirkpatrick et al., 2012), with the +1 correction so it is never exactly 0.

May import: nothing of ablate (pure numpy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

N_RESAMPLES = 10_000


@dataclass(frozen=True)
class PairedResult:
    delta: float          # mean over units of (arm - baseline)
    ci_low: float
    ci_high: float
    p_value: float
    n_units: int


def paired_bootstrap(arm, baseline, *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                     confidence: float = 0.95) -> PairedResult:
    """`arm[i]` and `baseline[i]` are the scores of unit i. Needs at least two units."""
    diffs = np.asarray(arm, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if diffs.ndim != 1 or len(diffs) < 2:
        raise ValueError(f"a paired test needs at least two pairing units, got {diffs.size}")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(diffs), size=(n_resamples, len(diffs)))
    return _summarise(diffs, diffs[picks].mean(axis=1), confidence)


def exact_bootstrap(arm, baseline, confidence: float = 0.95) -> PairedResult:
    """Every one of the n**n resamples, each once (small n only): the distribution the random resampling
    of paired_bootstrap estimates."""
    diffs = np.asarray(arm, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    n = len(diffs)
    if n < 2 or n ** n > 2_000_000:
        raise ValueError(f"exact bootstrap takes 2 to 7 units, got {n}")
    picks = np.array(np.meshgrid(*[np.arange(n)] * n, indexing="ij")).reshape(n, -1).T
    return _summarise(diffs, diffs[picks].mean(axis=1), confidence, plus_one=False)


def _summarise(diffs: np.ndarray, means: np.ndarray, confidence: float, plus_one: bool = True) -> PairedResult:
    observed = float(diffs.mean())
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    extreme = int(np.sum(np.abs(means - observed) >= abs(observed) - 1e-12))
    p = (extreme + 1) / (len(means) + 1) if plus_one else extreme / len(means)
    return PairedResult(observed, float(low), float(high), float(min(p, 1.0)), len(diffs))
