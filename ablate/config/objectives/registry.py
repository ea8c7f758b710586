"""The registered objectives: ENTRY_MODULES lists the modules of this package that each define one entry
(`ENTRY`, an Objective), so a new objective is a new module and one line here; `register` adds an entry
defined elsewhere (a user's own, or a test's). The registries of ablate all take this shape: the entries
listed in one place, looked up by name (families: ablate.models.families.FAMILIES; task types:
ablate.evaluate.task_types; converters: ablate.data.converters.CONVERTERS; figures:
ablate.report.registry.FIGURES).

May import: config.
"""

from __future__ import annotations

import importlib

from ablate.config.objectives.base import _ENTRIES, BIDIRECTIONAL, Objective

# imported when an objective is first asked for: mixture.py asks this registry for its members
ENTRY_MODULES = ("clm", "mixture", "mlm", "mntp", "prefix_lm", "span")
_LOADED: list[bool] = []


def register(entry: Objective) -> Objective:
    """Add an objective entry (its name once)."""
    if not isinstance(entry, Objective):
        raise TypeError(f"an objective entry is an Objective, not {type(entry).__name__}")
    if entry.name in _ENTRIES and _ENTRIES[entry.name] is not entry:
        raise ValueError(f"objective {entry.name!r} registered twice")
    _ENTRIES[entry.name] = entry
    return entry


def _load() -> dict[str, Objective]:
    if not _LOADED:
        _LOADED.append(True)
        for module in ENTRY_MODULES:
            register(importlib.import_module(f"ablate.config.objectives.{module}").ENTRY)
    return _ENTRIES


def names() -> tuple[str, ...]:
    return tuple(sorted(_load()))


def get(name: str) -> Objective:
    entries = _load()
    if name not in entries:
        raise ValueError(f"unknown objective {name!r}; allowed: {', '.join(sorted(entries))}")
    return entries[name]


def leaves(params) -> list[tuple[Objective, object, float]]:
    """(entry, params, weight) of what trains in a phase (a mixture's members, or the phase's objective)."""
    return get(params.objective).members(params)


def patterns_of(params) -> tuple[str, ...]:
    """The attention patterns a phase trains under, in member order, each once."""
    return tuple(dict.fromkeys(entry.pattern for entry, _, _ in leaves(params)))


def needs_preflight(params) -> bool:
    return any(p != BIDIRECTIONAL for p in patterns_of(params))
