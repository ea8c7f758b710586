"""Registry: the one shape of every extension point of ablate (model families, objectives, task types,
figures, converters, executors). A registry maps names to entries, each entry a frozen dataclass carrying its
own `name` and everything other modules look up about it; `register(entry)` adds one, from any module, and
checks it then (its type, its name once, the extension point's own `check`), so a broken entry fails when it
is loaded, not when it is first used. Nothing reads a registry's names at import: an entry registered after
the modules that look entries up were imported is served as the shipped ones are. An unknown name is a
SpecError naming what was asked and listing the registered names.

docs/extending.md says, for each extension point, where its entries live and which files a new one touches.

May import: config.errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from ablate.config.errors import SpecError

E = TypeVar("E")


class Registry(dict, Generic[E]):
    """name -> entry of one extension point. `kind` names the point in messages ("figure", "task type");
    `entry_type` is the class every entry is an instance of; `check(entry, registry)` raises on an entry that
    cannot work (the registry holds the entries registered before it)."""

    def __init__(self, kind: str, entry_type: type, check: Callable[[E, Registry], object] | None = None):
        super().__init__()
        self.kind, self.entry_type, self._check = kind, entry_type, check

    def register(self, entry: E) -> E:
        """Add `entry` under its name, checked; a second entry of the same name is an error."""
        name = getattr(entry, "name", None)
        if name in self and self[name] is not entry:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self[name] = entry
        return entry

    def __setitem__(self, name: str, entry: E) -> None:
        # also the way a test swaps an entry for the length of one test (monkeypatch.setitem): checked the same
        if not isinstance(entry, self.entry_type):
            raise TypeError(f"a {self.kind} entry is a {self.entry_type.__name__}, not {type(entry).__name__}")
        if getattr(entry, "name", None) != name:
            raise ValueError(f"a {self.kind} entry is registered under its own name, {entry.name!r}, not {name!r}")
        if self._check is not None:
            self._check(entry, self)
        super().__setitem__(name, entry)

    def names(self) -> tuple[str, ...]:
        return tuple(self)

    def lookup(self, name: str, *, key: str | None = None, file: str | None = None) -> E:
        """The entry of `name`; a SpecError (exit 2) naming `file` and `key` and listing the names otherwise."""
        if name not in self:
            raise SpecError(f"unknown {self.kind}", file=file, key=key, value=name, allowed=", ".join(self))
        return self[name]
