"""The arrows inside proxy/ (tests/test_architecture.py keeps those between the packages).

- The top-level modules are what http/ and compacting/ stand on (settings, errors, logs, metrics,
  tasks, the interception protocol): they import neither, except the entry points that build
  the app from them (app, cli, demo, __main__).
- The wire client is an optimisation behind one entry point: the rest of the proxy imports
  `proxy.http.wire` only, and the package imports nothing else of the proxy, so it can go whole.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from proxy.http import wire

PROXY = Path(__file__).resolve().parents[2] / "proxy"
ENTRY_POINTS = {"app.py", "cli.py", "demo.py", "__main__.py"}


def _imports(path: Path) -> Iterator[str]:
    """Every module `path` imports, at any depth (under TYPE_CHECKING and in functions too)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def test_top_level_modules_import_neither_http_nor_compacting_but_the_entry_points() -> None:
    upward = [
        f"{path.name} imports {name}"
        for path in sorted(PROXY.glob("*.py"))
        if path.name not in ENTRY_POINTS
        for name in _imports(path)
        if _under(name, "proxy.http") or _under(name, "proxy.compacting")
    ]
    assert upward == []


def test_the_wire_client_is_reached_through_its_package_only() -> None:
    inside = set((PROXY / "http" / "wire").glob("*.py"))
    entry = {"proxy.http.wire", *(f"proxy.http.wire.{name}" for name in wire.__all__)}
    past_the_entry = [
        f"{path.relative_to(PROXY)} imports {name}"
        for path in sorted(PROXY.rglob("*.py"))
        if path not in inside
        for name in _imports(path)
        if _under(name, "proxy.http.wire") and name not in entry
    ]
    assert past_the_entry == []


def test_the_wire_client_imports_nothing_else_of_the_proxy() -> None:
    outside = [
        f"{path.name} imports {name}"
        for path in sorted((PROXY / "http" / "wire").glob("*.py"))
        for name in _imports(path)
        if _under(name, "proxy") and not _under(name, "proxy.http.wire")
    ]
    assert outside == []
