"""The one error type for bad user input: the CLI prints it and exits with code 2."""

from __future__ import annotations


class SpecError(ValueError):
    """Bad input, located: which file, which key path, what value, what is allowed."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        value: object = None,
        allowed: str | None = None,
    ):
        self.file, self.key, self.value, self.allowed = file, key, value, allowed
        self.message = message
        super().__init__(self.format())

    def format(self) -> str:
        where = ": ".join(p for p in (self.file, self.key) if p)
        parts = [f"{where}: {self.message}" if where else self.message]
        if self.value is not None:
            parts.append(f"got {self.value!r}")
        if self.allowed:
            parts.append(f"allowed: {self.allowed}")
        return "; ".join(parts)
