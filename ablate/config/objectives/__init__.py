"""Objectives as entries: every consumer asks the entry, none compares an objective's name.

An entry (a subclass of Objective, one module of this package, imported and registered below: ENTRY_MODULES)
says
- `batch(...)`: what it does to a batch of packed sequences (inputs, labels, the attention pattern per row);
- `pattern`: what the attention must allow: bidirectional, causal, or prefix (a bidirectional prefix and a
  causal suffix); the causal preflight (ablate.train.preflight) proves every pattern that is not
  bidirectional;
- `random_draws`: what a pretraining seed changes in it (the replicate rule, ablate.plan.replicates);
- `fields`: the phase fields it reads (any other objective field set on its phase is an error), and
  `identity(params)`: what makes it what it is, with defaults resolved (run ids keep their old form:
  ablate.config.identity; branching's shared prefixes compare it).

A phase names one objective (`objective: mlm`) or a weighted mixture (`objective: mixture`, `mixture:`
members, `granularity`): the mixture is an entry too (mixture.py), whose members are entries.

May import: config.
"""

from __future__ import annotations

from ablate.config.objectives.base import (
    BIDIRECTIONAL,
    CAUSAL,
    PATTERNS,
    PREFIX,
    Batch,
    Objective,
    TokenInfo,
    mask_rate_at,
)
from ablate.config.objectives.registry import get, leaves, names, needs_preflight, patterns_of, register

# the shipped entries: each module's ENTRY, registered (and checked) once the registry exists; a new objective
# is a new module and its name here (docs/extending.md, "An objective")
from ablate.config.objectives import clm, mixture, mlm, mntp, prefix_lm, span  # noqa: E402

ENTRY_MODULES = (clm, mixture, mlm, mntp, prefix_lm, span)
for _module in ENTRY_MODULES:
    register(_module.ENTRY)

__all__ = [
    "BIDIRECTIONAL",
    "CAUSAL",
    "PATTERNS",
    "PREFIX",
    "Batch",
    "Objective",
    "TokenInfo",
    "get",
    "leaves",
    "mask_rate_at",
    "names",
    "needs_preflight",
    "patterns_of",
    "register",
]
