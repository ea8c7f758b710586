"""The Hypothesis settings every fuzz test of the suite runs under: the same examples on every run
(derandomized, no example database), no deadline on a loaded 2-core machine, no health check failing a slow
strategy. A test sets its own max_examples: `@settings(FUZZ, max_examples=N)`."""

from hypothesis import HealthCheck, Phase, settings

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
