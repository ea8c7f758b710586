"""How many test examples a score needs to be read at face value, per metric: the one place the threshold is
written. The scores table flags a task below it (`small_test`, ablate.report.paper_tables), from the `n_examples`
each score row records (ablate.evaluate.score_files).

May import: nothing. Pure data.
"""

from __future__ import annotations

# The fewest test examples (units of the metric: sentences, documents, pairs) a score is read at face value
# with. The paired bootstrap resamples fine-tuning seeds on one fixed test set, so it cannot see the test
# set's own sampling error; below these sizes that error alone is 4-5 points, twice the differences between
# arms the paper reports (1-3 points): accuracy / F1 near 0.8 over n units has a standard error of about
# sqrt(0.16 / n), 4 points at 100; a correlation near 0.8 over n pairs about (1 - r^2) / sqrt(n), 5 points
# at 50 (BIOSSES tests on 20 pairs, MantraGSC-FR patents on 10 documents).
MIN_TEST_EXAMPLES = {"pearson": 50, "spearman": 50}
DEFAULT_MIN_TEST_EXAMPLES = 100


def min_test_examples(metric: str) -> int:
    return MIN_TEST_EXAMPLES.get(metric, DEFAULT_MIN_TEST_EXAMPLES)
