"""Intervals the figures draw: pure functions of arrays of numbers.

May import: nothing of ablate.
"""

from __future__ import annotations

import math

import numpy as np


def mean_ci(values) -> tuple[float, float, float, int]:
    """Mean and 95% t-interval of the finite values, and their count; bounds are NaN with fewer than two."""
    from scipy import stats

    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    n = len(v)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    m = float(v.mean())
    if n < 2:
        return m, math.nan, math.nan, n
    h = float(stats.t.ppf(0.975, n - 1) * v.std(ddof=1) / math.sqrt(n))
    return m, m - h, m + h, n


def welch_ci(a, b) -> tuple[float, float, float]:
    """Difference of means a - b with a 95% Welch interval (NaN bounds when either side has n < 2)."""
    from scipy import stats

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return d, math.nan, math.nan
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return d, d, d
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    h = float(stats.t.ppf(0.975, df) * se)
    return d, d - h, d + h
