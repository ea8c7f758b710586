"""docs/config.md, the reference of every key a user writes, generated from the config models themselves (their
fields, types, defaults and `Field(description=...)`), so that the page cannot drift from the code.

    python -m ablate.cli.reference            # rewrite docs/config.md
    python -m ablate.cli.reference --check    # exit 1 when docs/config.md is not what the models give

It reads the models of config, evaluate and tune.

May import: every stage.
"""

from __future__ import annotations

import argparse
import re
import sys
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from ablate.config.grid import GridSpec
from ablate.config.launcher import Launcher
from ablate.config.objectives import get as get_objective
from ablate.config.objectives import names as objective_names
from ablate.config.spec import PhaseSpec, RunSpec
from ablate.evaluate.tasks import TaskSpec
from ablate.tune.schema import TuneSpec

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config.md"

# (heading, model, what the file is): one section per file format a user writes, nested models below each
FILES: tuple[tuple[str, type[BaseModel], str], ...] = (
    (
        "Grid file",
        GridSpec,
        "A sweep: `ablate sweep GRID.yaml` (`grids/*.yaml`; [grids.md](grids.md)). `base` is "
        "a partial [run spec](#run-spec); `prelude` and each schedule are lists of [phases](#phase).",
    ),
    (
        "Run spec",
        RunSpec,
        "One run: `ablate run RUN.yaml` (`grids/run_minilm.yaml`), or a grid's `base` with its axes filled in.",
    ),
    ("Phase", PhaseSpec, "One entry of a run's `phases`, a grid's `prelude` or one of its `schedules`."),
    (
        "Launcher",
        Launcher,
        "Where a grid's or a tune file's runs go: the `launcher:` block ([cluster.md](cluster.md)).",
    ),
    (
        "Task file",
        TaskSpec,
        "One downstream task: a file NAME.yaml in `grids/tasks/` (or `$ABLATE_TASKS_DIR`; "
        "[tasks.md](tasks.md)). A grid's `eval.finetune` overrides the `finetune` keys.",
    ),
    (
        "Tune file",
        TuneSpec,
        "An Optuna study: `ablate tune TUNE.yaml` (`grids/tune.yaml`; [tune.md](tune.md)). "
        "`base`, `prelude`, `schedules` and `freeze_masks` are as in a grid file.",
    ),
)

HEADER = """# Every key

Generated from the config models by `python -m ablate.cli.reference` (do not edit by hand:
`tests/test_config_reference.py` fails when this page and the models differ). Each table lists a block's keys
with their type, their default ("required" when there is none) and what they do. Unknown keys are errors
that name the file, the key and the keys allowed there.
"""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class an annotation holds (directly, in X | None, in a list or tuple of it), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType, tuple, list, Annotated):
        found = [m for m in map(_model_in, get_args(annotation)) if m is not None]
        return found[0] if found else None
    return None


def _type(annotation: Any, links: dict[type, str]) -> str:
    """An annotation in a reader's words: string, integer, list of ..., one of: a, b, mapping."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _type(args[0], links) + _bounds(args[1:])
    if origin is Literal:
        return "one of: " + ", ".join(_value(a) for a in args)
    if origin in (Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        text = " or ".join(_type(a, links) for a in kept)
        return f"{text} or null" if len(kept) < len(args) else text
    if origin in (tuple, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return "[" + ", ".join(_type(a, links) for a in args) + "]"
        return f"list of {_type(args[0], links)}" if args else "list"
    if origin is dict:
        return f"mapping of {_type(args[1], links)}" if args and args[1] is not Any else "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"mapping: [{links[annotation]}](#{_slug(links[annotation])})"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _value(value: Any) -> str:
    """A value as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(its defaults)"
    return f"`{_value(value)}`"


def _bounds(metadata) -> str:
    """The limits a field's metadata sets (> 0, 0 <= x < 1, a pattern, a least length), as a reader writes them."""
    words = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    parts = []
    for item in metadata:
        for attr, sign in words.items():
            if getattr(item, attr, None) is not None:
                parts.append(f"{sign} {getattr(item, attr)}")
        if getattr(item, "min_length", None) is not None:
            parts.append(f"at least {item.min_length}")
        if getattr(item, "pattern", None) is not None:
            parts.append(f"matching `{item.pattern}`")
    return f" ({', '.join(parts)})" if parts else ""


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _keys(model: type[BaseModel]) -> list[tuple[str, Any]]:
    """(key as a file writes it, field) in the model's order."""
    return [(f.alias or name, f) for name, f in model.model_fields.items()]


def undescribed() -> list[str]:
    """Every key of every file format without a description (the reference would say nothing of it)."""
    missing = []
    for model, path in _models():
        missing += [f"{path}.{key}" for key, field in _keys(model) if not (field.description or "").strip()]
    return missing


def _models() -> list[tuple[type[BaseModel], str]]:
    """Every model of every file format once, with the path of its first place (Grid file.launcher.slurm,
    ...), each file's own model first and the models inside it after it."""
    out: list[tuple[type[BaseModel], str]] = []
    seen: set[type] = {model for _, model, _ in FILES}

    def walk(model: type[BaseModel], path: str) -> None:
        for key, field in _keys(model):
            inner = _model_in(field.annotation)
            if inner is not None and inner not in seen:
                seen.add(inner)
                out.append((inner, f"{path}.{key}"))
                walk(inner, f"{path}.{key}")

    for heading, model, _ in FILES:
        out.append((model, heading))
        walk(model, heading)
    return out


def _heading(path: str) -> str:
    """`Run spec.data` -> `Run spec: data`; `Grid file.launcher.slurm` -> `Grid file: launcher.slurm`."""
    top, _, rest = path.partition(".")
    return f"{top}: {rest}" if rest else top


def _table(model: type[BaseModel], links: dict[type, str]) -> list[str]:
    rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for key, field in _keys(model):
        kind = _type(field.annotation, links) + _bounds(field.metadata)
        rows.append(f"| `{key}` | {_cell(kind)} | {_cell(_default(field))} | {_cell(field.description or '')} |")
    return rows


def _docstring(model: type[BaseModel]) -> str:
    return " ".join((model.__dict__.get("__doc__") or "").split())


def _objectives() -> list[str]:
    rows = [
        "## Objectives",
        "",
        "What a phase's `objective` names ([objectives.md](objectives.md)). Each reads only its own "
        "[phase](#phase) fields: another objective's field on its phase is an error.",
        "",
        "| objective | fields it reads | what it trains |",
        "|---|---|---|",
    ]
    for name in objective_names():
        entry = get_objective(name)
        fields = ", ".join(f"`{f}`" for f in entry.fields) or "none"
        rows.append(f"| `{name}` | {fields} | {_cell(entry.summary)} |")
    return rows


def render() -> str:
    """docs/config.md as the models give it."""
    models = _models()
    links = {model: _heading(path) for model, path in models}
    intro = {model: text for _, model, text in FILES}
    lines = [HEADER]
    for model, path in models:
        level = "##" if model in intro else "###"
        lines += [f"{level} {links[model]}", ""]
        text = intro.get(model) or _docstring(model)
        if model in intro and _docstring(model):
            text += " " + _docstring(model)
        if text:
            lines += [text, ""]
        lines += _table(model, links) + [""]
        if model is PhaseSpec:
            lines += _objectives() + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ablate.cli.reference", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the page differs from the models")
    ap.add_argument("--out", default=str(PAGE), help="the page to write or check (default docs/config.md)")
    args = ap.parse_args(argv)
    page, text = Path(args.out), render()
    if args.check:
        if not page.is_file() or page.read_text() != text:
            print(f"{page} is stale: run python -m ablate.cli.reference", file=sys.stderr)
            return 1
        return 0
    page.write_text(text)
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
