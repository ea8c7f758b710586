"""The config toolkit every file format of ablate uses (run specs, grids, tune files, task files):
one strict pydantic base, one YAML 1.2 loader, one translator from pydantic errors to located SpecErrors.

May import: config.errors only.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from ablate.config.errors import SpecError

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """Unknown keys are errors and loaded values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Located(ValueError):
    """A cross-field error raised inside a validator, carrying the key path pydantic cannot know."""

    def __init__(self, message: str, key: str, value: object = None, allowed: str | None = None):
        super().__init__(message)
        self.key, self.value, self.allowed = key, value, allowed


class _Loader(yaml.SafeLoader):
    """Safe YAML that reads 1e-4 as a number (YAML 1.2), not as the string PyYAML's 1.1 rules give."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
    r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))


def parse_yaml(text: str, file: str | None = None) -> Any:
    """Safe YAML 1.2 numbers; tags that construct Python objects are refused; errors name the line."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SpecError(f"not valid YAML: {getattr(exc, 'problem', None) or exc}", file=file,
                        key=f"line {mark.line + 1}" if mark else None) from None


def parse_assignments(pairs: list[str] | None, flag: str) -> dict:
    """["k=v", ...] from the command line as {k: YAML value of v}; a pair without "=" is a SpecError."""
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SpecError("expected KEY=VALUE", key=flag, value=pair)
        key, value = pair.split("=", 1)
        out[key] = parse_yaml(value, file=flag)
    return out


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise SpecError("file not found", file=str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"not UTF-8 text: {exc}", file=str(path)) from None
    return parse_yaml(text, str(path))


def format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_class(annotation: Any) -> Any:
    """The model class inside X | None and tuple[X, ...]; anything else as it is."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _model_class(args[0]) if len(args) == 1 else None
    if origin is tuple:
        args = get_args(annotation)
        return _model_class(args[0]) if args else None
    return annotation


def _keys(cls: type[BaseModel]) -> dict[str, Any]:
    """A model's fields by the key a file writes (the alias, where one is set: `from` for a Python keyword)."""
    return {f.alias or name: f for name, f in cls.model_fields.items()}


def keys_at(model: type[BaseModel], loc: tuple) -> list[str] | None:
    """The keys allowed at `loc` inside `model`, when that is a model; else None."""
    cls: Any = model
    for part in loc:
        if isinstance(part, int):
            continue  # an element of a tuple[Model, ...]: cls is the element's class already
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or part not in _keys(cls):
            return None
        cls = _model_class(_keys(cls)[part].annotation)
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return list(_keys(cls))
    return None


def _problem(err: dict, prefix: str) -> tuple[str, str, Any, str | None, tuple]:
    loc = tuple(p for p in err["loc"] if p != "function-after")
    msg, value, allowed = err["msg"].removeprefix("Value error, "), err.get("input"), None
    located = (err.get("ctx") or {}).get("error")
    if isinstance(located, Located):
        loc += tuple(located.key.split("."))
        msg, value, allowed = str(located), located.value, located.allowed
    elif err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg, value = "missing required key", None
    key = ".".join(p for p in (prefix, format_loc(loc)) if p)
    return key, msg, value, allowed, loc


def spec_error_from(exc: ValidationError, file: str | None, model: type[BaseModel] | None = None,
                    prefix: str = "", hidden_keys: tuple[str, ...] = ()) -> SpecError:
    """The first validation problem, located as file + key path (every other problem listed after it);
    for an unknown key, the keys allowed there (less `hidden_keys`)."""
    problems = [_problem(err, prefix) for err in exc.errors()]
    key, msg, value, allowed, loc = problems[0]
    if exc.errors()[0]["type"] == "extra_forbidden" and model is not None:
        keys = keys_at(model, loc[:-1])
        if keys:
            allowed = ", ".join(k for k in keys if k not in hidden_keys)
    if len(problems) > 1:
        msg += "".join(f"\n  also {k or '(top level)'}: {m}" for k, m, *_ in problems[1:])
    shown = value if isinstance(value, (str, int, float, bool)) else None
    return SpecError(msg, file=file, key=key or "(top level)", value=shown, allowed=allowed)


def validate(model: type[M], data: Any, file: str | None = None, what: str = "file", prefix: str = "",
             hidden_keys: tuple[str, ...] = ()) -> M:
    """`data` (parsed YAML/JSON) as a `model`, or a located SpecError."""
    if not isinstance(data, dict):
        raise SpecError(f"a {what} must be a mapping of keys", file=file, key=prefix or None,
                        value=type(data).__name__)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from(exc, file, model, prefix, hidden_keys) from None
