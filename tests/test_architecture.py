"""The package's shape as docs/architecture.md draws it: each stage imports only itself and the stages below
it, so the import graph has no circles and a newcomer can read the stages bottom-up."""

from __future__ import annotations

import ast
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
    "launch",
    "tune",
    "report",
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
