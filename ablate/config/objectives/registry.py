"""Looking objectives up: the registered entries (base.OBJECTIVES, filled by ablate.config.objectives, which
imports and registers each entry module of this package) by name, and what a phase trains under. `register`
adds an entry defined elsewhere (a user's own, or a test's), checked as it is registered.

May import: config.
"""

from __future__ import annotations

from ablate.config.objectives.base import BIDIRECTIONAL, OBJECTIVES, Objective

register = OBJECTIVES.register


def names() -> tuple[str, ...]:
    return tuple(sorted(OBJECTIVES))


def get(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; allowed: {', '.join(names())}")
    return OBJECTIVES[name]


def leaves(params) -> list[tuple[Objective, object, float]]:
    """(entry, params, weight) of what trains in a phase (a mixture's members, or the phase's objective)."""
    return get(params.objective).members(params)


def patterns_of(params) -> tuple[str, ...]:
    """The attention patterns a phase trains under, in member order, each once."""
    return tuple(dict.fromkeys(entry.pattern for entry, _, _ in leaves(params)))


def needs_preflight(params) -> bool:
    return any(p != BIDIRECTIONAL for p in patterns_of(params))
