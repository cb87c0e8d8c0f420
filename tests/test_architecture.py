"""The arrows between the packages, and module size, kept by tests.

- compaction/ is a library: it imports nothing from proxy/ or aiohttp.
- proxy/http/ moves bytes: it reaches what changes a request only through proxy/interception.py
  (the hook protocol), never proxy/compacting/.
- No module grows past about 300 lines: past that it has a second job.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 300
# Modules allowed past MAX_LINES, each with its reason. Keep this list short.
OVERSIZE: dict[str, str] = {
    "proxy/compacting/conversations.py": "finding a conversation's stored checkpoint is its job",
    "proxy/compacting/stores/sqlite_file.py": "the file's whole life on its one thread, faults too",
    "proxy/compacting/stores/redis.py": "every role in Redis, and what keeps a process out of it",
    "proxy/settings.py": "every section of the configuration, each validated where it is read",
    "proxy/metrics.py": "every metric the proxy serves, in one place",
}


def _modules(where: str) -> list[Path]:
    path = REPO / where
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def _imported(path: Path) -> Iterator[tuple[int, str]]:
    """Every module name `path` imports, at any depth (function-level imports included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def _violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in _modules(folder):
        for line, name in _imported(path):
            if any(name == prefix or name.startswith(f"{prefix}.") for prefix in forbidden):
                found.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    return found


def test_the_library_imports_neither_the_proxy_nor_aiohttp() -> None:
    assert _violations("compaction", ("proxy", "aiohttp")) == []


def test_importing_every_library_module_loads_neither_aiohttp_nor_proxy() -> None:
    probe = (
        "import importlib, pkgutil, sys, compaction\n"
        "for info in pkgutil.walk_packages(compaction.__path__, 'compaction.'):\n"
        "    importlib.import_module(info.name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'proxy'))\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert done.stdout.strip() == ""


def test_http_reaches_compacting_only_through_the_hook_protocol() -> None:
    assert _violations("proxy/http", ("proxy.compacting",)) == []


def test_the_hook_protocol_knows_neither_side() -> None:
    assert (
        _violations("proxy/interception.py", ("proxy.compacting", "proxy.http", "compaction")) == []
    )


def test_no_module_is_over_three_hundred_lines() -> None:
    oversize = {
        str(path.relative_to(REPO)): len(path.read_text(encoding="utf-8").splitlines())
        for folder in ("proxy", "compaction")
        for path in _modules(folder)
    }
    too_long = {
        name: lines
        for name, lines in oversize.items()
        if lines > MAX_LINES and name not in OVERSIZE
    }
    assert too_long == {}
