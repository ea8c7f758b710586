"""The paired bootstrap behind the scores tables' p-values and CIs, against direct computations."""

import itertools

import numpy as np
import pytest

from ablate.evaluate.bootstrap import _summarise, paired_bootstrap


def exact_bootstrap(arm, baseline, confidence: float = 0.95):
    """Every one of the n**n resamples, each once (small n only): the distribution the random resampling of
    paired_bootstrap estimates, summarised as it summarises its draws (without the +1 of a random draw)."""
    diffs = np.asarray(arm, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    n = len(diffs)
    picks = np.array(np.meshgrid(*[np.arange(n)] * n, indexing="ij")).reshape(n, -1).T
    return _summarise(diffs, diffs[picks].mean(axis=1), confidence, plus_one=False)


def test_identical_arms_are_not_different():
    base = [71.2, 69.8, 70.5, 72.0, 70.1]
    got = paired_bootstrap(base, base, n_resamples=2000)
    assert got.delta == 0 and got.ci_low == 0 and got.ci_high == 0 and got.p_value == 1.0


def test_a_constant_shift_is_as_significant_as_the_resampling_can_say():
    base = np.array([71.2, 69.8, 70.5, 72.0, 70.1])
    got = paired_bootstrap(base + 1.5, base, n_resamples=999)
    assert (
        got.delta == pytest.approx(1.5) and got.ci_low == pytest.approx(1.5) and got.ci_high == pytest.approx(1.5)
    )
    assert got.p_value == pytest.approx(1 / 1000)


def test_a_noisy_shift_is_found_and_covered_by_its_interval():
    rng = np.random.default_rng(3)
    base = 70 + rng.normal(0, 2, size=20)  # units differ a lot from each other...
    arm = base + 2.0 + rng.normal(0, 0.5, size=20)  # ...but the pairing removes that
    got = paired_bootstrap(arm, base)
    assert got.p_value < 0.01 and got.ci_low < 2.0 < got.ci_high and got.n_units == 20
    null = paired_bootstrap(base + rng.normal(0, 0.5, size=20), base)
    assert null.p_value > 0.05


def test_exact_bootstrap_equals_a_direct_enumeration():
    arm, base = [3.0, 4.0, 9.0], [2.0, 2.0, 3.0]  # differences 1, 2, 6: mean 3
    means = sorted(np.mean([d for d in pick]) for pick in itertools.product([1.0, 2.0, 6.0], repeat=3))
    got = exact_bootstrap(arm, base)
    assert got.delta == pytest.approx(3.0)
    assert got.ci_low == pytest.approx(np.quantile(means, 0.025))
    assert got.ci_high == pytest.approx(np.quantile(means, 0.975))
    # resamples at least as far from 3 as 3 is from 0: means <= 0 or >= 6, i.e. only (6, 6, 6)
    assert got.p_value == pytest.approx(sum(abs(m - 3) >= 3 for m in means) / 27) == pytest.approx(1 / 27)


def test_random_resampling_approximates_the_exact_distribution_and_is_seeded():
    arm, base = [3.0, 4.0, 9.0, 5.0, 4.5], [2.0, 2.0, 3.0, 5.5, 4.0]
    exact = exact_bootstrap(arm, base)
    mc = paired_bootstrap(arm, base, n_resamples=20_000, seed=1)
    assert mc.ci_low == pytest.approx(exact.ci_low, abs=0.15) and mc.ci_high == pytest.approx(
        exact.ci_high, abs=0.15
    )
    assert mc.p_value == pytest.approx(exact.p_value, abs=0.01)
    assert paired_bootstrap(arm, base, seed=7) == paired_bootstrap(arm, base, seed=7)


def test_one_unit_is_no_test():
    with pytest.raises(ValueError, match="at least two pairing units"):
        paired_bootstrap([1.0], [0.5])
