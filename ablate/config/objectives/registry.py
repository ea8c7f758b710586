"""The registered objectives: every module of this package that defines ENTRY (an Objective) is one, so a new
objective is one new module."""

from __future__ import annotations

import importlib
import pkgutil

from ablate.config.objectives.base import _ENTRIES, BIDIRECTIONAL, Objective

_NOT_ENTRIES = {"base", "registry"}


def _load() -> dict[str, Objective]:
    if not _ENTRIES:
        package = importlib.import_module("ablate.config.objectives")
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            if info.name in _NOT_ENTRIES:
                continue
            entry = getattr(importlib.import_module(f"{package.__name__}.{info.name}"), "ENTRY", None)
            if isinstance(entry, Objective):
                _ENTRIES[entry.name] = entry
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
