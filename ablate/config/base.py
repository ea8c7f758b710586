"""The config toolkit every file format of ablate uses (run specs, grids, tune files, task files):
one strict pydantic base, one YAML 1.2 loader, one translator from pydantic errors to located SpecErrors.

May import: config.errors.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from ablate.config.errors import SpecError

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """Unknown keys are errors and loaded values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1 for an int field (seed: true would be seed 1); a boolean is no number
        if isinstance(value, bool) and _number_not_bool(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected a number, not {str(value).lower()}")
        return value


def _leaf_types(annotation: Any) -> set:
    """The plain types an annotation admits at its top level (through X | Y, Optional and Annotated)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return set().union(*(_leaf_types(a) for a in get_args(annotation)))
    if origin is Annotated:
        return _leaf_types(get_args(annotation)[0])
    return {annotation}


def _number_not_bool(annotation: Any) -> bool:
    leaves = _leaf_types(annotation)
    return bool(leaves & {int, float}) and bool not in leaves and Any not in leaves


class Located(ValueError):
    """A cross-field error raised inside a validator, carrying the key path pydantic cannot know."""

    def __init__(self, message: str, key: str, value: object = None, allowed: str | None = None):
        super().__init__(message)
        self.key, self.value, self.allowed = key, value, allowed


def unique_items(values, what: str):
    """A list a user writes whose repeats would be done, or counted, twice (a seed fine-tuned twice and
    weighing double in a mean): refused, naming the repeat."""
    seen = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{what} {value!r} is listed twice; allowed: each {what} once")
        seen.add(value)
    return values


class _Loader(yaml.SafeLoader):
    """Safe YAML with the YAML 1.2 core schema's scalars, not PyYAML's 1.1 ones: 1e-4 is a number (1.1: a
    string); yes/no/on/off stay strings (1.1: booleans, so a label `no` became False); 012 is twelve (1.1:
    octal ten); 1:30 is a string (1.1: ninety, base 60); 2024-01-01 is a string (1.1: a date). A key given
    twice in one mapping is an error (PyYAML keeps the last one without a word)."""


_YAML11_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "timestamp")}
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _YAML11_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """Decimal as written (no octal for a leading 0), 0o octal, 0x hexadecimal."""
    text = loader.construct_scalar(node)
    return int(text, 0) if text.lstrip("+-")[:2] in ("0o", "0x") else int(text)


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
    """A mapping whose keys are each written once (a `<<` merge may still be overridden: that is its use)."""
    first: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (str, int, float, bool)) and key in first:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {key!r} is given twice in one mapping (first on line {first[key] + 1})",
                key_node.start_mark,
            )
        first.setdefault(key, key_node.start_mark.line)
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node, deep=True))


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def parse_yaml(text: str, file: str | None = None) -> Any:
    """Safe YAML 1.2 numbers; tags that construct Python objects are refused; errors name the line."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SpecError(
            f"not valid YAML: {getattr(exc, 'problem', None) or exc}",
            file=file,
            key=f"line {mark.line + 1}" if mark else None,
        ) from None


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
        msg, value, allowed = "missing required key", None, "a value for it"
    elif "; allowed: " in msg:  # a validator's ValueError says it in its message
        msg, allowed = msg.split("; allowed: ", 1)
    elif msg.startswith("Input should be "):  # pydantic's type and range errors say what is allowed
        allowed = msg.removeprefix("Input should be ")
    elif " should " in msg and err["type"] != "value_error":  # e.g. List should have at least 1 item
        allowed = msg.split(" should ", 1)[1]
    key = ".".join(p for p in (prefix, format_loc(loc)) if p)
    return key, msg, value, allowed, loc


def spec_error_from(
    exc: ValidationError,
    file: str | None,
    model: type[BaseModel] | None = None,
    prefix: str = "",
    hidden_keys: tuple[str, ...] = (),
) -> SpecError:
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


def validate(
    model: type[M],
    data: Any,
    file: str | None = None,
    what: str = "file",
    prefix: str = "",
    hidden_keys: tuple[str, ...] = (),
) -> M:
    """`data` (parsed YAML/JSON) as a `model`, or a located SpecError."""
    if not isinstance(data, dict):
        raise SpecError(
            f"a {what} must be a mapping of keys", file=file, key=prefix or None, value=type(data).__name__
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from(exc, file, model, prefix, hidden_keys) from None
