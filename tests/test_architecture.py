"""The package's shape as docs/architecture.md draws it: each stage imports only itself and the stages below
it, so the import graph has no circles and a newcomer can read the stages bottom-up; and each module imports
only what its docstring's "May import:" line names, so the line is a true summary of what the module needs.

Every import edge is resolved to the module it names (`from ablate.x.y import name` is an edge to
`ablate.x.y`, or to `ablate.x.y.name` when that is a module), so no edge goes unchecked; a test plants a
forbidden import in a copy of the package and sees each guard fail on it."""

from __future__ import annotations

import ast
import functools
import re
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ablate"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _drawn_floors() -> list[str]:
    """The stages in the order docs/architecture.md's tree draws them (its indented lines under `ablate/`): the
    lowest floor first. tests/test_docs.py checks that tree against the folders."""
    tree = re.search(r"^```\n(.*?)^```", ARCHITECTURE.read_text(), re.M | re.S).group(1)
    return [line.split()[0].rstrip("/") for line in tree.splitlines() if line.startswith("  ") and line.strip()]


FLOORS = _drawn_floors()


@functools.cache
def _parse(text: str) -> ast.Module:
    return ast.parse(text)  # cached by text: a copy of the package parses only the files it changed


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "ablate" else None


def _module_files(package: Path) -> dict[str, Path]:
    """module name -> its file, for every module of the package (packages by their __init__.py)."""
    out = {}
    for path in package.rglob("*.py"):
        rel = path.relative_to(package.parent).with_suffix("")
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return out


@functools.cache
def _statements(text: str) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
    """A file's import statements, function-level ones included, as (level, module, names): `import a.b` is
    (-1, "a.b", ()). Cached by text: a copy of the package reads again only the files it changed."""
    found = []
    for node in ast.walk(_parse(text)):
        if isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or "", tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            found += [(-1, a.name, ()) for a in node.names]
    return tuple(found)


def _imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the ablate modules it imports. Each edge is the module an import statement names: `from a.b
    import c` is an edge to `a.b.c` when that is a module, else to `a.b`."""
    files = _module_files(package)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        here = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        found = set()
        for level, base, names in _statements(path.read_text()):
            if level > 0:
                parts = here.split(".")
                base = ".".join(parts[: len(parts) - level + 1] + ([base] if base else []))
            found |= {f"{base}.{name}" if f"{base}.{name}" in files else base for name in names} or {base}
        graph[module] = {m for m in found if m.startswith("ablate.") and m != module}
    return graph


def _floor_violations(package: Path = PACKAGE) -> list[str]:
    wrong = []
    for module, imported in _imports(package).items():
        here = _stage(module)
        for target in imported:
            there = _stage(target)
            if there in FLOORS and here in FLOORS and FLOORS.index(there) > FLOORS.index(here):
                wrong.append(f"{module} imports {target} ({there} is above {here})")
    return sorted(wrong)


def test_every_stage_imports_only_itself_and_lower_stages():
    wrong = _floor_violations()
    assert not wrong, "\n".join(wrong)


def test_no_import_circles_between_modules():
    graph = _imports()
    modules = set(graph)
    edges = {m: {t for t in graph[m] if t in modules} for m in modules}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycle.extend(path[path.index(t) :] + [m, t] if t in path else [m, t])
                return True
            if t not in state and visit(t, path + [m]):
                return True
        state[m] = 2
        return False

    for m in sorted(modules):
        if m not in state and visit(m, []):
            break
    assert not cycle, " -> ".join(cycle)


def test_every_stage_says_what_it_owns_and_may_import():
    for stage in FLOORS[:-1]:
        doc = ast.get_docstring(ast.parse((PACKAGE / stage / "__init__.py").read_text())) or ""
        assert "May import" in doc, f"ablate/{stage}/__init__.py needs a docstring saying what it may import"


# ---------------------------------------------------------------- each module's "May import:" line

_NAME = r"[a-z_]+(?:\.[a-z_]+)*"
_ITEM = re.compile(rf"({_NAME})(?:\s*\(\s*({_NAME}(?:\.\*)?(?:\s*,\s*{_NAME}(?:\.\*)?)*)\s*\))?")


def _declared(doc: str) -> str | None:
    """The list of a docstring's "May import:" paragraph: its text up to the first full stop or semicolon,
    whitespace folded (what follows is prose); None without one."""
    found = re.search(r"^May import:(.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
    if not found:
        return None
    return re.split(r"[.;](?:\s|$)", " ".join(found.group(1).split()) + " ", maxsplit=1)[0].strip()


def _allowed(declared: str) -> set[str] | None:
    """The ablate modules and stages a "May import:" list names; None: every stage. The grammar: `every
    stage`; `nothing`, `nothing of ablate` or `nothing from ablate`; or a comma-separated list of `stage`,
    `stage.module` and `stage (module, module.*)`. Anything else (prose in parentheses, a stray word) raises
    ValueError: prose belongs in the sentences before the line, where no parser reads it."""
    if declared == "every stage":
        return None
    if declared in ("nothing", "nothing of ablate", "nothing from ablate"):
        return set()
    allowed, rest = set(), declared
    while True:
        item = _ITEM.match(rest)
        if not item:
            raise ValueError(f"cannot read {rest!r}")
        name, inside = item.groups()
        if inside:
            allowed |= {f"{name}.{sub.strip().removesuffix('.*')}" for sub in inside.split(",")}
        else:
            allowed.add(name)
        rest = rest[item.end() :].lstrip()
        if not rest:
            return allowed
        if not rest.startswith(","):
            raise ValueError(f"cannot read {rest!r}")
        rest = rest[1:].lstrip()


def _line_violations(package: Path = PACKAGE) -> list[str]:
    """What is wrong with the package's "May import:" lines: a module without one (nor its package's), a line
    the grammar cannot read or that names a module that does not exist, an import the line does not name, and
    (a module's own line) another stage or module named that it does not import: a module's line is exactly
    what it imports from other stages; a package's line is the bound for its modules that have none. A
    module's own stage is always allowed; "every stage" allows all."""
    files, graph = _module_files(package), _imports(package)
    declared = {m: _declared(ast.get_docstring(_parse(p.read_text())) or "") for m, p in files.items()}
    problems = []
    for module, path in sorted(files.items()):
        line, owner = declared[module], module
        parent = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        while line is None and parent.count("."):
            line, owner = declared.get(parent), parent
            parent = parent.rsplit(".", 1)[0]
        if line is None:
            problems.append(f"{module} has no 'May import:' line (nor its package)")
            continue
        try:
            allowed = _allowed(line)
        except ValueError as err:
            if owner == module:
                problems.append(f"{module}: 'May import: {line}': {err}")
            continue
        if allowed is None:
            continue
        own = _stage(module)
        if owner == module:
            problems += [
                f"{module}: 'May import:' names {name}, which is no stage or module of ablate"
                for name in sorted(allowed)
                if f"ablate.{name}" not in files
            ]
        if owner == module and path.name != "__init__.py":  # a package's line bounds its modules' imports
            imported = {t.removeprefix("ablate.") for t in graph[module]}
            problems += [
                f"{module}: 'May import:' names {name}, which it does not import"
                for name in sorted(allowed)
                if name.split(".")[0] != own and not any(i == name or i.startswith(name + ".") for i in imported)
            ]
        for target in sorted(graph[module]):
            name = target.removeprefix("ablate.")
            if name.split(".")[0] == own or any(name == a or name.startswith(a + ".") for a in allowed):
                continue
            problems.append(f"{module} imports {name}; its line says: May import: {line}")
    return problems


def test_every_module_imports_only_what_its_may_import_line_names():
    """A module's docstring says which stages (or which of their modules) it may import: its "May import:"
    paragraph, or its package's when it has none."""
    problems = _line_violations()
    assert not problems, "\n".join(problems)


def test_the_may_import_grammar_reads_lists_and_refuses_prose():
    assert _allowed("config, evaluate (tasks, task_types.*), train.precision") == {
        "config",
        "evaluate.tasks",
        "evaluate.task_types",
        "train.precision",
    }
    assert _allowed("nothing of ablate") == set() and _allowed("every stage") is None
    assert _declared("x\n\nMay import: config, models. Pure arithmetic (over a config).") == "config, models"
    for prose in ("config (pure pandas otherwise)", "config, models and plan", "config.errors only"):
        try:
            _allowed(prose)
        except ValueError:
            continue
        raise AssertionError(f"{prose!r} was read as a list of modules")


def test_each_guard_fails_on_an_import_planted_in_a_copy_of_the_package(tmp_path):
    """The guards are only as good as the edges they see: a copy of the package with one import planted in
    train/rope.py (a module named by `from ... import name`, the form the old guard skipped) must fail them."""
    copy = tmp_path / "ablate"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.yaml", "*.tsv", "*.json"))
    rope = copy / "train" / "rope.py"
    text = rope.read_text()
    rope.write_text(
        text + "\n\ndef _planted():\n    from ablate.launch.worker import execute\n\n    return execute\n"
    )
    assert _floor_violations(copy) == ["ablate.train.rope imports ablate.launch.worker (launch is above train)"]
    assert any(p.startswith("ablate.train.rope imports launch.worker;") for p in _line_violations(copy))
    # an edge the floors allow (train may import store) but rope.py's line does not name
    rope.write_text(text + "\n\ndef _planted():\n    from ablate.store.atomic import atomic_write\n\n")
    assert _floor_violations(copy) == []
    assert [p for p in _line_violations(copy) if p.startswith("ablate.train.rope")] == [
        f"ablate.train.rope imports store.atomic; its line says: May import: {_declared_of(rope)}"
    ]
    # a line naming a stage the module does not import
    rope.write_text(text.replace("\nMay import: models.", "\nMay import: models, store."))
    assert [p for p in _line_violations(copy) if p.startswith("ablate.train.rope")] == [
        "ablate.train.rope: 'May import:' names store, which it does not import"
    ]


def _declared_of(path: Path) -> str | None:
    return _declared(ast.get_docstring(_parse(path.read_text())) or "")


# ---------------------------------------------------------------- environment variables


def _env_names(path: Path) -> set[str]:
    """The ABLATE_* variable names a file spells out as string constants."""
    return {
        node.value
        for node in ast.walk(_parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if re.fullmatch(r"ABLATE_[A-Z0-9_]+", node.value)
    }


def test_an_environment_variable_is_a_users_setting_or_a_fault_injection_request():
    """Variables only the tests set (a child process held, killed or out of memory at a chosen point) are read
    through ablate/config/faults.py alone and listed in CONTRIBUTING.md; every other ABLATE_* variable ablate
    reads is a user's setting, documented in README.md or docs/."""
    faults = PACKAGE / "config" / "faults.py"
    requests = _env_names(faults)
    assert requests, "ablate/config/faults.py names no variable: the pattern no longer matches its style"
    contributing = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    assert [name for name in sorted(requests) if name not in contributing] == []
    docs = "".join(p.read_text() for p in [PACKAGE.parent / "README.md", *(PACKAGE.parent / "docs").glob("*.md")])
    for module, path in sorted(_module_files(PACKAGE).items()):
        if path != faults:
            names = _env_names(path)
            assert not names & requests, f"{module} reads {names & requests} itself, not through config.faults"
            assert [n for n in sorted(names) if n not in docs] == [], f"{module}: undocumented variables"
