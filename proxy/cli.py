"""The `compaction-proxy` command: parse flags, load settings, configure logging, run the app.

Settings are loaded and validated before anything listens; a bad one prints one line to stderr
and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from compaction import is_valid_session_id
from proxy.admin import inspect
from proxy.app import create_app
from proxy.http import keys
from proxy.logs import configure_logging
from proxy.settings import Settings, SettingsError, load_settings
from proxy.state.archive import search_session
from proxy.state.factory import build_reader

DEFAULT_CONFIG = "config.yaml"

log = logging.getLogger("proxy")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return _run_demo()
    if args.command == "inspect":
        return inspect.main(args, os.environ)
    try:
        settings = load_settings(_config_path(args.config), os.environ, _overrides(args))
    except SettingsError as exc:
        print(f"compaction-proxy: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.logging.level)
    if args.command == "recall":
        return asyncio.run(_recall(settings, args.session, args.query, args.limit))
    return _serve(settings)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction-proxy",
        description="OpenAI-compatible reverse proxy that compacts long conversations.",
    )
    parser.add_argument("--config", help=f"YAML config file (default: ./{DEFAULT_CONFIG} if any)")
    parser.add_argument("--host", help="listen address (server.host)")
    parser.add_argument("--port", type=int, help="listen port (server.port)")
    parser.add_argument("--upstream", help="upstream base URL (upstream.base_url)")
    commands = parser.add_subparsers(dest="command", metavar="{demo,inspect,recall}")
    commands.add_parser("demo", help="offline demo: fake upstream, scripted conversation")
    inspect.add_parser(commands)
    recall = commands.add_parser(
        "recall", help="search a session's archived turns and memory items (state per config)"
    )
    recall.add_argument("session", help="the session id")
    recall.add_argument("query", help="the words to search for")
    recall.add_argument("--limit", type=int, default=None, help="results (archive.search_limit)")
    return parser


async def _recall(settings: Settings, session: str, query: str, limit: int | None) -> int:
    """Print the best matches of `query` in `session`'s archive and memory items, every
    credential's (the operator's view), read from the state per config."""
    if not is_valid_session_id(session):
        print(f"compaction-proxy: not a session id: {session!r}", file=sys.stderr)
        return 2
    if limit is not None and limit < 1:
        print("compaction-proxy: --limit must be at least 1", file=sys.stderr)
        return 2
    # A reader: the proxy may be writing to the same file (proxy.state.sqlite_file).
    archive = build_reader(settings.state, settings.archive)
    try:
        await archive.open()
        found = await search_session(
            archive,
            settings.memory.dir,
            session,
            query,
            tenant=None,
            limit=limit or settings.archive.search_limit,
        )
    except Exception as exc:
        print(f"compaction-proxy: the archive could not be searched: {exc}", file=sys.stderr)
        return 1
    finally:
        await archive.close()
    if not found:
        print(f"no archived turn or memory item of {session} matches {query!r}")
    for rank, item in enumerate(found, 1):
        where = "memory item" if item.index is None else f"turn {item.index}"
        print(f"{rank}. {where} · {item.kind} · score {item.score:.2f}")
        print(textwrap.indent(_clip(item.text.strip()), "   "))
    return 0


def _clip(text: str, limit: int = 800) -> str:
    return text if len(text) <= limit else text[:limit] + " …"


def _config_path(flag: str | None) -> str | None:
    if flag is not None:
        return flag
    return DEFAULT_CONFIG if Path(DEFAULT_CONFIG).is_file() else None


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    overrides: dict[str, dict[str, object]] = {}
    if args.host is not None:
        overrides.setdefault("server", {})["host"] = args.host
    if args.port is not None:
        overrides.setdefault("server", {})["port"] = args.port
    if args.upstream is not None:
        overrides.setdefault("upstream", {})["base_url"] = args.upstream
    return overrides


def _serve(settings: Settings) -> int:
    app = create_app(settings)
    loop = _new_loop()
    where = f"{settings.server.host}:{settings.server.port}"
    listening = False

    def log_listening(_banner: str) -> None:
        # run_app "prints" its banner once every socket is bound: the moment to say listening.
        nonlocal listening
        listening = True
        _freeze_startup_heap()
        log.info(
            "listening",
            extra={
                "host": settings.server.host,
                "port": settings.server.port,
                "upstream": settings.upstream.base_url,
                "anthropic_upstream": settings.upstream.anthropic_base_url,
            },
        )

    async def log_drain(app: web.Application) -> None:
        if listening:  # not when start-up failed before serving
            in_flight = app[keys.METRICS].registry.get_sample_value(
                "compaction_proxy_in_flight_requests"
            )
            log.info(
                "shutting down: no new connections; in-flight requests get up to %g s",
                settings.server.shutdown_timeout_s,
                extra={"in_flight": int(in_flight or 0)},
            )

    app.on_shutdown.append(log_drain)
    try:
        web.run_app(
            app,
            host=settings.server.host,
            port=settings.server.port,
            loop=loop,
            access_log=None,  # our own access line is written by proxy.http.middleware
            print=log_listening,
            # aiohttp waits this twice for a handler that does not end by itself: for it to
            # finish, then again after failing its request body (which a relay no longer
            # reads), and only then cancels it. Half of it each: in-flight requests get
            # server.shutdown_timeout_s in all, not twice that.
            shutdown_timeout=settings.server.shutdown_timeout_s / 2,
            # A client that goes away cancels its handler at once, which closes the upstream
            # request even while the upstream is silent.
            handler_cancellation=True,
        )
    except OSError as exc:
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        print(f"compaction-proxy: cannot listen on {where}: {reason}", file=sys.stderr)
        return 1
    log.info("stopped")
    return 0


def _freeze_startup_heap() -> None:
    """What start-up built lives as long as the process: take it out of the cyclic garbage
    collector's sight, so the collections that requests trigger walk only what requests made.
    A full collection of the start-up heap (~50k objects, several ms) came every few hundred
    requests: a few percent of a pass-through request's CPU."""
    gc.collect()
    gc.freeze()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _run_demo() -> int:
    from proxy import demo  # only the demo needs it

    return demo.main()
