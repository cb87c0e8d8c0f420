"""The arrows between the packages, kept by tests.

- compaction/ is a library: it imports nothing from proxy/ or aiohttp.
- proxy/ uses the library through its public names only (`from compaction import X`, X in
  `compaction.__all__`): what the library does inside may change without the proxy knowing.
- proxy/http/ moves bytes: it reaches what changes a request only through proxy/interception.py
  (the hook protocol), never proxy/compacting/, and never the library (the session id rule is
  proxy/sessions.py's, the memory file admin's).
- What a compaction did reaches HTTP as one typed value (proxy/outcome.py), and its
  `x-compaction-*` headers are named and rendered in one place: at most two modules spell them.
- proxy/admin/ reads the records: it imports nothing of how a request is compacted
  (proxy/compacting/, proxy/recall/) and spells no header to parse back.
- The speed machinery (proxy/compacting/fast/) is entered through its package only, so the
  plain design reads without it and each optimisation can go on its own.
- proxy/compacting/ reads from its door down: the hook, fast/, decision/, then background/ and
  models/; each imports only the rooms after it, so background work and what is known of the
  models stand below the decision that uses them.
- proxy's shared modules (settings, logs, metrics, keys, ...) sit below both http/ and
  compacting/: only the app's assembly (app.py, cli.py, demo.py) imports those.
- No import cycle between the modules of proxy/ and compaction/ (imports under TYPE_CHECKING,
  which never run, aside): a cycle means two modules share one job, or one of them has two.
- Each API's wire lives in its dialect (proxy/dialects/): no other module of proxy/ (the demo
  aside, which plays a client) names a wire item, block or event of one API, and the dialects
  stand below the rooms that ask them (http/, compacting/, recall/), importing none of them.
- The state (proxy/state/) is one layer below the rest: it imports neither http/, compacting/
  nor recall/; one module of proxy/ opens the SQLite file (`sqlite3.connect`) and one builds
  the Redis client, so the file's locks and the client's bounds are decided once.

Module size is not tested: modules are split by responsibility, never by line count. `make
review` lists the long ones for a reviewer to look at (tests/review.py).
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Callable, Iterator
from pathlib import Path

import compaction

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("proxy", "compaction")

KNOWN_CYCLES: dict[str, str] = {}
"""Packages holding an import cycle that is known and being removed, each with why. A cycle
whose every module lies in one of them is tolerated; any other fails. Keep this short."""

KNOWN_UPWARD_IMPORTS: dict[str, str] = {}
"""Shared modules that still import up into http/ or compacting/, each with why."""

ASSEMBLY = (
    "proxy/__init__.py",
    "proxy/__main__.py",
    "proxy/app.py",
    "proxy/cli.py",
    "proxy/demo.py",
)
"""The modules that put the proxy together: they may import everything."""


WIRE_STRINGS = frozenset(
    {
        # items and blocks
        "tool_use",
        "tool_result",
        "server_tool_use",
        "function_call",
        "function_call_output",
        "reasoning",
        "thinking",
        "redacted_thinking",
        "input_schema",
        # their fields
        "tool_calls",
        "tool_call_id",
        "tool_use_id",
        "call_id",
        "stop_reason",
        "finish_reason",
        "choices",
        # stream events and deltas
        "chat.completion.chunk",
        "[DONE]",
        "message_start",
        "message_delta",
        "message_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "text_delta",
        "thinking_delta",
        "signature_delta",
        "input_json_delta",
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.output_item.done",
        "response.completed",
        "response.incomplete",
        "response.failed",
        # identity and usage fields
        "prompt_cache_key",
        "client_metadata",
        "prompt_tokens",
        "completion_tokens",
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    }
)
"""Wire names of one API (items, blocks, their fields, stream events, identity and usage
fields): only proxy/dialects/ spells them."""

WIRE_EXEMPT = ("proxy/dialects", "proxy/demo.py")
"""The dialects, and the demo, which plays a client and its upstream."""


def _modules(where: str) -> list[Path]:
    path = REPO / where
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST, *, runtime: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under `node`, at any depth (function-level ones included);
    with `runtime`, not those under `if TYPE_CHECKING:` (their `else:` branch counts)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif runtime and isinstance(child, ast.If) and _is_type_checking(child):
            for branch in child.orelse:
                yield from _import_nodes(ast.Module(body=[branch], type_ignores=[]), runtime=True)
        else:
            yield from _import_nodes(child, runtime=runtime)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imported(path: Path) -> Iterator[tuple[int, str]]:
    """Every module name `path` imports, at any depth (function-level imports included)."""
    for node in _import_nodes(_parse(path), runtime=False):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif node.module is not None and node.level == 0:
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


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of proxy/ and compaction/ it imports when it runs. `from p import
    name` is an arrow to `p.name` when that is a module, else to `p`."""
    paths = {_module_name(path): path for package in PACKAGES for path in _modules(package)}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _import_nodes(_parse(path), runtime=True):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in paths else base)
        graph[name] = {target for target in targets if target in paths and target != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, with an
    explicit stack)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _is_known(cycle: list[str]) -> bool:
    return any(
        all(module.startswith(f"{package}.") for module in cycle) for package in KNOWN_CYCLES
    )


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


def test_the_proxy_uses_only_the_librarys_public_names() -> None:
    public = set(compaction.__all__)
    found = []
    for path in _modules("proxy"):
        where = path.relative_to(REPO)
        for node in _import_nodes(_parse(path), runtime=False):
            if isinstance(node, ast.Import):
                found += [
                    f"{where}:{node.lineno} imports {alias.name}"
                    for alias in node.names
                    if alias.name.split(".")[0] == "compaction"
                ]
            elif node.level == 0 and (node.module or "").split(".")[0] == "compaction":
                found += [
                    f"{where}:{node.lineno} imports {node.module}.{alias.name}"
                    for alias in node.names
                    if node.module != "compaction" or alias.name not in public
                ]
    assert found == []


def test_every_public_name_of_the_library_exists() -> None:
    assert [name for name in compaction.__all__ if not hasattr(compaction, name)] == []


def test_http_reaches_compacting_only_through_the_hook_protocol() -> None:
    assert _violations("proxy/http", ("proxy.compacting",)) == []


def test_http_imports_nothing_of_the_library() -> None:
    assert _violations("proxy/http", ("compaction",)) == []


def _spelling(where: str, text: str) -> list[str]:
    """The modules under `where` whose source spells `text` (case aside)."""
    return [
        str(path.relative_to(REPO))
        for path in _modules(where)
        if text.lower() in path.read_text(encoding="utf-8").lower()
    ]


def test_at_most_two_modules_spell_the_compaction_headers() -> None:
    # proxy/outcome.py names and renders them; reading one back would be a second place.
    assert len(_spelling("proxy", "x-compaction-")) <= 2, _spelling("proxy", "x-compaction-")


def test_admin_reads_records_and_never_parses_headers() -> None:
    assert _violations("proxy/admin", ("proxy.compacting", "proxy.recall")) == []
    assert _spelling("proxy/admin", "x-compaction-") == []


def test_the_spelling_finder_finds_a_header_name() -> None:
    assert "proxy/outcome.py" in _spelling("proxy", "x-compaction-")


def test_the_hook_protocol_knows_neither_side() -> None:
    assert (
        _violations("proxy/interception.py", ("proxy.compacting", "proxy.http", "compaction")) == []
    )


def test_the_shared_modules_import_neither_http_nor_compacting() -> None:
    shared = [
        path
        for path in _modules("proxy")
        if path.parent == REPO / "proxy"
        and str(path.relative_to(REPO)) not in (*ASSEMBLY, *KNOWN_UPWARD_IMPORTS)
    ]
    found = [
        violation
        for path in shared
        for violation in _violations(
            str(path.relative_to(REPO)), ("proxy.http", "proxy.compacting")
        )
    ]
    assert found == []


def test_no_import_cycles_but_the_known_ones() -> None:
    cycles = _cycles(_import_graph())
    assert [cycle for cycle in cycles if not _is_known(cycle)] == []


def test_the_known_cycles_and_upward_imports_still_exist() -> None:
    # An entry whose cycle is gone must go too: the lists only ever shrink.
    cycles = _cycles(_import_graph())
    assert [
        package
        for package in KNOWN_CYCLES
        if not any(all(module.startswith(f"{package}.") for module in cycle) for cycle in cycles)
    ] == []
    assert [
        name
        for name in KNOWN_UPWARD_IMPORTS
        if not _violations(name, ("proxy.http", "proxy.compacting"))
    ] == []


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_review_lists_long_modules_without_failing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.review"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert done.stdout.startswith("review: ")


COMPACTING_ROOMS = ("hook", "fast", "decision", ("background", "models"))
"""proxy/compacting/ from its door down: each room imports (when it runs) only the rooms after
it; rooms in one tuple import none of each other."""


def _room(module: str) -> tuple[int, str] | None:
    """(rank, room) of a module of proxy/compacting/ in COMPACTING_ROOMS, or None."""
    parts = module.split(".")
    if parts[:2] != ["proxy", "compacting"] or len(parts) < 3:
        return None
    for rank, rooms in enumerate(COMPACTING_ROOMS):
        if parts[2] in ((rooms,) if isinstance(rooms, str) else rooms):
            return rank, parts[2]
    return None


def test_the_rooms_of_compacting_import_only_the_rooms_below() -> None:
    graph = _import_graph()
    found = [
        f"{name} imports {target}"
        for name, targets in graph.items()
        if (source := _room(name)) is not None
        for target in targets
        if (room := _room(target)) is not None and room[1] != source[1] and room[0] <= source[0]
    ]
    assert found == []


def test_every_module_of_compacting_is_in_a_room() -> None:
    modules = [
        name
        for name in _import_graph()
        if name.startswith("proxy.compacting.") and _room(name) is None
    ]
    assert modules == []


def test_the_speed_machinery_is_entered_through_its_package_only() -> None:
    fast = REPO / "proxy/compacting/fast"
    inner = tuple(f"proxy.compacting.fast.{path.stem}" for path in fast.glob("*.py"))
    outside = [path for path in _modules("proxy") if fast not in path.parents]
    found = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in outside
        for line, name in _imported(path)
        if any(name == module or name.startswith(f"{module}.") for module in inner)
    ]
    assert found == []


def _wire_strings(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string constant of `source` that is a wire name of one API,
    alone or quoted as a JSON key in bytes (b'"tool_use"')."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Constant):
            continue
        if isinstance(node.value, str) and node.value in WIRE_STRINGS:
            found.append((node.lineno, node.value))
        elif isinstance(node.value, bytes):
            text = node.value.decode("utf-8", "replace")
            found += [(node.lineno, name) for name in WIRE_STRINGS if f'"{name}"' in text]
            if text in WIRE_STRINGS:
                found.append((node.lineno, text))
    return found


def test_no_module_outside_the_dialects_names_a_wire_item_or_event() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line} names {name!r}"
        for path in _modules("proxy")
        if not str(path.relative_to(REPO)).startswith(WIRE_EXEMPT)
        for line, name in _wire_strings(path.read_text(encoding="utf-8"))
    ]
    assert found == []


def test_the_wire_scan_finds_a_wire_name_and_only_one() -> None:
    source = (
        '"""A docstring about tool_use blocks is prose."""\n'
        'kind = "tool_use"\n'
        "marker = b'\"content_block_delta\"'\n"
        'other = "tool"\n'
    )
    assert _wire_strings(source) == [(2, "tool_use"), (3, "content_block_delta")]


def test_the_dialects_import_none_of_the_rooms_that_ask_them() -> None:
    assert _violations("proxy/dialects", ("proxy.http", "proxy.compacting", "proxy.recall")) == []


def _calling(folder: str, matches: Callable[[ast.Call], bool]) -> list[str]:
    """The modules under `folder` holding a call that `matches`."""
    return [
        str(path.relative_to(REPO))
        for path in _modules(folder)
        if any(isinstance(node, ast.Call) and matches(node) for node in ast.walk(_parse(path)))
    ]


def _is_sqlite_connect(call: ast.Call) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "connect"
        and isinstance(func.value, ast.Name)
        and func.value.id == "sqlite3"
    )


def _builds_a_redis_client(call: ast.Call) -> bool:
    """`Redis(...)`, `Redis.from_url`/`from_pool`, `redis.asyncio.from_url`, or a pool of
    connections built by hand."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    owner = func.value if isinstance(func, ast.Attribute) else None
    owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
    return (
        name in ("Redis", "StrictRedis", "BlockingConnectionPool", "ConnectionPool")
        or (name in ("from_url", "from_pool") and "redis" in owner_name.lower())
        or (name in ("from_url", "from_pool") and owner_name.endswith("Pool"))
    )


def test_one_module_opens_the_sqlite_state_file() -> None:
    assert _calling("proxy", _is_sqlite_connect) == ["proxy/state/sqlite_file.py"]


def test_one_module_builds_the_redis_client() -> None:
    assert _calling("proxy", _builds_a_redis_client) == ["proxy/state/redis_client.py"]


def test_the_call_finders_find_what_they_look_for() -> None:
    def calls(source: str) -> list[ast.Call]:
        return [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)]

    assert [_is_sqlite_connect(c) for c in calls("sqlite3.connect(p); other.connect(p)")] == [
        True,
        False,
    ]
    built = "aioredis.from_url(u); aioredis.Redis.from_pool(p); redis.asyncio.Redis(); x.get(u)"
    assert [_builds_a_redis_client(c) for c in calls(built)] == [True, True, True, False]


def test_the_state_imports_neither_http_compacting_nor_recall() -> None:
    forbidden = ("proxy.http", "proxy.compacting", "proxy.recall", "proxy.admin", "proxy.app")
    assert _violations("proxy/state", forbidden) == []


# A dotted name of one of our modules, in prose or code: `proxy.compacting.hook`,
# `compaction.plan.Trigger`. Config keys (`compaction.trigger_ratio`) and attributes of a variable
# named like a package (`proxy.port`) start with one component that is not a subpackage.
_DOTTED = re.compile(r"(?<![\w/.])((?:proxy|compaction)(?:\.[A-Za-z_]\w*)+)")


def _module_paths() -> dict[str, Path]:
    found = {}
    for path in [*_modules("proxy"), *_modules("compaction")]:
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _defines(path: Path, name: str) -> bool:
    """True when `name` is bound at the top of the module at `path` (defined, assigned,
    imported, or listed in its `__all__`)."""
    text = path.read_text(encoding="utf-8")
    bound = rf"(^|\n)\s*((async )?def|class)\s+{name}\b|(^|\n){name}\s*[:=]"
    return (
        re.search(bound, text) is not None
        or re.search(rf"\b{name}\b,?\s*(\n|\))", text) is not None
    )


def _prose(path: Path) -> str:
    """What a reader reads of `path`: a module's strings and comments (its code names variables
    that may share a package's name), a page whole."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return text
    kept = (tokenize.STRING, tokenize.COMMENT)
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return "\n".join(token.string for token in tokens if token.type in kept)


def stale_references(text: str, modules: dict[str, Path]) -> list[str]:
    """The dotted names in `text` that name a module of ours, or a name in one, that does not
    exist. A name whose second part is no subpackage or module of that package is a config key
    (`compaction.recall`) and is left alone."""
    stale = []
    for match in _DOTTED.finditer(text):
        parts = match.group(1).split(".")
        children = {name.split(".")[1] for name in modules if name.startswith(f"{parts[0]}.")}
        if parts[1] not in children:
            continue
        deepest = max(k for k in range(1, len(parts) + 1) if ".".join(parts[:k]) in modules)
        if deepest < len(parts) and not _defines(
            modules[".".join(parts[:deepest])], parts[deepest]
        ):
            stale.append(match.group(1))
    return stale


def test_no_module_or_doc_names_a_module_that_does_not_exist() -> None:
    modules = _module_paths()
    texts = [*_modules("proxy"), *_modules("compaction"), *sorted((REPO / "docs").glob("*.md"))]
    found = [
        f"{path.relative_to(REPO)}: {name}"
        for path in [*texts, REPO / "README.md"]
        for name in stale_references(_prose(path), modules)
    ]
    assert found == []


def test_the_reference_check_finds_a_module_that_is_gone() -> None:
    modules = _module_paths()
    text = (
        "see proxy.compacting.forwarded and proxy.compacting.hook.CompactingHook, the key"
        " compaction.trigger_ratio, proxy.compacting.hook.Nowhere"
    )
    assert stale_references(text, modules) == [
        "proxy.compacting.forwarded",
        "proxy.compacting.hook.Nowhere",
    ]


def test_no_module_cites_a_document_outside_the_repository() -> None:
    cited = [
        f"{path.relative_to(REPO)}"
        for path in [*_modules("proxy"), *_modules("compaction")]
        if re.search(r"DESIGN §|style guide", path.read_text(encoding="utf-8"))
    ]
    assert cited == []


def test_every_package_of_the_proxy_is_on_the_map() -> None:
    """docs/development.md names every package folder under proxy/ (as `name/`)."""
    development = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    packages = sorted(
        path.parent.relative_to(REPO / "proxy")
        for path in (REPO / "proxy").glob("**/__init__.py")
        if path.parent != REPO / "proxy"
    )
    missing = [str(p) for p in packages if f"{p.name}/" not in development]
    assert missing == []
