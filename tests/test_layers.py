"""Layers point one way: configuration and extensions, then models, then schemas, then services,
then what runs them (blueprints, workers, commands, the demo fixtures), then the app. A module
importing from a layer above its own is how a rule ends up written twice, so none may."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAYER = {
    "config": 0,
    "extensions": 0,
    "observability": 0,
    "models": 1,
    "schemas": 2,
    "services": 3,
    "blueprints": 4,
    "commands": 4,
    "fixtures": 4,
    "workers": 4,
    "app": 5,
}


def modules() -> list[Path]:
    found = [REPO / f"{name}.py" for name in ("app", "config", "extensions")]
    for package in (
        "observability",
        "models",
        "schemas",
        "services",
        "blueprints",
        "commands",
        "fixtures",
        "workers",
    ):
        found += sorted((REPO / package).rglob("*.py"))
    return found


def imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """Every absolute import, at module level or inside a function."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.lineno, node.module))
    return names


def upward_imports(path: Path) -> list[str]:
    own = path.relative_to(REPO).parts[0].removesuffix(".py")
    found = []
    for line, name in imported_names(ast.parse(path.read_text())):
        target = name.split(".")[0]
        if target in LAYER and LAYER[target] > LAYER[own]:
            found.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    return found


def test_no_module_imports_from_a_layer_above_its_own():
    assert [found for path in modules() for found in upward_imports(path)] == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The check itself: a schema that imports a service is reported."""
    fake_repo = tmp_path
    (fake_repo / "schemas").mkdir()
    offender = fake_repo / "schemas" / "leaky.py"
    offender.write_text("def f():\n    from services.api_keys import create_api_key\n")
    monkeypatch.setitem(globals(), "REPO", fake_repo)
    assert upward_imports(offender) == ["schemas/leaky.py:2 imports services.api_keys"]
