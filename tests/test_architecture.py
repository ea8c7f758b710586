"""The package's shape as docs/architecture.md draws it: each stage imports only itself and the stages below
it, so the import graph has no circles and a newcomer can read the stages bottom-up."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ablate"
FLOORS = [
    "config",
    "store",
    "data",
    "models",
    "plan",
    "analysis",
    "train",
    "evaluate",
    "predict",
    "launch",
    "tune",
    "report",
    "release",
    "cli",
]


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "ablate" else None


def _imports() -> dict[str, set[str]]:
    """module -> the ablate modules it imports (function-level imports included)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = module if rel.name == "__init__" else module.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(
                        "."
                    )
                found |= {base} | {f"{base}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[module] = {m for m in found if m.startswith("ablate.") and m != module}
    return graph


def test_every_stage_imports_only_itself_and_lower_stages():
    wrong = []
    for module, imported in _imports().items():
        here = _stage(module)
        if here is None:
            continue
        for target in imported:
            there = _stage(target)
            if there in FLOORS and here in FLOORS and FLOORS.index(there) > FLOORS.index(here):
                wrong.append(f"{module} imports {target} ({there} is above {here})")
    assert not wrong, "\n".join(sorted(wrong))


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


def _declared(doc: str) -> str | None:
    """The text of a docstring's "May import:" paragraph, whitespace folded; None without one."""
    found = re.search(r"^May import:(.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
    return " ".join(found.group(1).split()).rstrip(".") if found else None


def _allowed(declared: str) -> set[str] | None:
    """The ablate modules and stages a "May import:" line names (None: every stage). `stage`, `stage.module`
    and `stage (module, module)` name what may be imported; "nothing ..." names nothing; parentheses that are
    prose (not module names) leave their stage whole."""
    if declared.lower().startswith("every stage"):
        return None
    if declared.lower().startswith("nothing"):
        return set()
    items, depth, current = [], 0, ""
    for ch in declared:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += ch
    items.append(current.strip())
    allowed = set()
    for item in items:
        named = re.match(r"^([a-z_]+(?:\.[a-z_]+)*)\s*(?:\((.*)\))?", item)
        if not named:
            continue
        name, inside = named.group(1), named.group(2)
        if inside and re.fullmatch(r"[a-z_.*, ]+", inside.strip()):
            allowed |= {f"{name}.{sub.strip().removesuffix('.*')}" for sub in inside.split(",")}
        else:
            allowed.add(name)
    return allowed


def _module_files() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return out


def test_every_module_imports_only_what_its_may_import_line_names():
    """A module's docstring says which stages (or which of their modules) it may import: its "May import:"
    paragraph, or its package's when it has none. Its own stage is always allowed ("nothing" means nothing of
    the other stages); "every stage" allows all."""
    files, graph = _module_files(), _imports()
    declared = {m: _declared(ast.get_docstring(ast.parse(p.read_text())) or "") for m, p in files.items()}
    missing, wrong = [], []
    for module, path in sorted(files.items()):
        line = declared[module]
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        while line is None and package.count("."):
            line = declared.get(package)
            package = package.rsplit(".", 1)[0]
        if line is None:
            missing.append(module)
            continue
        allowed = _allowed(line)
        if allowed is None:
            continue
        own = _stage(module)
        for target in sorted(graph[module]):
            name = target.removeprefix("ablate.")
            if target not in files:  # a name imported from a module, not a module
                continue
            if any(target != m and m.startswith(target + ".") for m in graph[module]):
                continue  # `from ablate.stage import module`: the module is what is imported
            if (own and name.split(".")[0] == own) or any(name == a or name.startswith(a + ".") for a in allowed):
                continue
            wrong.append(f"{module} imports {name}; its line says: May import: {line}")
    assert not missing, f"modules without a 'May import:' line (nor their package): {missing}"
    assert not wrong, "\n".join(wrong)
