"""Imports point down: the layering docs/ARCHITECTURE.md draws, checked with ast."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "farm"

# module -> farm modules it may import (prefix match on dotted names)
ALLOWED = {
    "errors": set(),
    "records": set(),
    "stats": set(),
    "regress": set(),
    "drift": set(),
    "artifacts": set(),
    "inventory": {"errors", "records"},
    "store": {"errors", "records"},
    "models": {"errors", "records"},
    "rpc": {"errors", "records", "rpc"},
    "devices": {"errors", "records", "rpc", "devices"},
    "compile": {"errors", "records", "models"},
    "measure": {"errors", "records", "rpc", "__init__"},
    "results": {"stats", "store"},
    "sweep": {"errors", "records", "compile", "devices", "measure", "models", "store"},
    "review": {"devices", "drift", "regress", "results", "stats", "store"},
    "report": {"results", "review", "stats", "store", "__init__"},
    "tune": {"compile", "errors", "records", "rpc", "store", "sweep"},
    "demo": {"devices", "inventory", "models", "records", "report", "rpc", "store", "sweep"},
    "dashboard": {"devices", "errors", "records", "rpc", "store"},
    "cli": {"*"},
    "__init__": set(),
}
TVM_OWNERS = {"rpc", "compile", "measure", "tune"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_farm_imports_point_down():
    problems = []
    for path in PACKAGE.rglob("*.py"):
        layer = _layer(path)
        allowed = ALLOWED[layer]
        for name in _imports(path):
            if name == "farm":
                target = "__init__"
            elif name.startswith("farm."):
                target = name.split(".")[1]
            else:
                continue
            if "*" not in allowed and target not in allowed and target != layer:
                problems.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert problems == []


def test_only_owners_import_tvm():
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if any(n == "tvm" or n.startswith("tvm.") for n in _imports(p)) and _layer(p) not in TVM_OWNERS]
    assert offenders == []


def test_only_store_writes_sqlite():
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if {"sqlite3", "psycopg"} & _imports(p) and _layer(p) != "store"]
    assert offenders == []
