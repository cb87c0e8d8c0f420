"""The app factory: everything the proxy is made of is built here, from `Settings` alone."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from compaction import CheckpointStore, prune_memory
from proxy.admin import dashboard, routes
from proxy.admin.records import SessionRecords
from proxy.compacting.background.archiving import Archiving
from proxy.compacting.background.workers import Workers
from proxy.compacting.hook import Replacements, Shared, build_hook
from proxy.compacting.models.calibration import Calibration
from proxy.compacting.models.llm_client import LLMFactory
from proxy.compacting.models.overflow import LearnedWindows
from proxy.heap import find_trim, trim_heap_every
from proxy.http import handlers, keys, serving
from proxy.http.middleware import GET_ONLY, AnyTarget, unmatched, wrap_handler
from proxy.http.upstream import Upstream
from proxy.interception import Hook
from proxy.loop_lag import watch_loop_lag
from proxy.metrics import Metrics
from proxy.recall import Recall
from proxy.settings import Settings
from proxy.state.archive import Archive
from proxy.state.factory import State, build_state
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

# The processes compactions' CPU work runs in (started on first use, stopped with the app). Only
# the app reads it: it is not among proxy.http.keys, which the handlers read.
WORKERS = web.AppKey("workers", Workers)
# How often memory folders idle past archive.max_age_days are looked for (and once at start).
_MEMORY_PRUNE_S = 3600.0


def create_app(
    settings: Settings,
    *,
    hook: Hook | None = None,
    store: CheckpointStore | None = None,
    llm_for: LLMFactory | None = None,
    metrics: Metrics | None = None,
    archive: Archive | None = None,
) -> web.Application:
    """A ready-to-run proxy. Reads no file or environment. Every part may be passed in:
    `hook` changes requests on the hooked routes (default: compaction); `store` keeps the
    checkpoints (default: the `state.backend`, which also keeps cooldowns and single-flight
    leases); `llm_for` gives the summarizer for a request (default:
    over the upstream); `metrics` lets a caller supply an extended `Metrics`; `archive` keeps
    folded turns (default: the `state.backend`'s)."""
    app = web.Application(
        client_max_size=settings.server.max_body_bytes, handler_args=serving.SERVER_ARGS
    )
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = metrics if metrics is not None else Metrics()
    app[keys.TASKS] = BackgroundTasks()
    app[keys.UPSTREAM] = Upstream(settings.upstream, app[keys.METRICS])
    app[WORKERS] = Workers(
        settings.compaction.workers,
        timeout_s=settings.compaction.worker_timeout_s,
        replacements=app[keys.METRICS].compaction.worker_replacements,
        scanned_chars=settings.compaction.scanned_chars,
    )
    # One file or one Redis client for every role (proxy.state.factory).
    state = build_state(
        settings.state,
        settings.compaction,
        settings.archive,
        app[keys.METRICS].state,
        app[keys.TASKS],
        given_archive=archive,
        admin=settings.admin,
    )
    app[keys.ARCHIVE] = state.archive
    # Built here, written by the compacting hook and forwarding, read by proxy.admin; with
    # Redis also kept there, where every replica reads them (state.records).
    records = SessionRecords(
        max_sessions=settings.admin.max_sessions,
        records_per_session=settings.admin.records_per_session,
        max_bytes=int(settings.admin.max_records_mb * 1024 * 1024),
        preview_chars=settings.admin.preview_chars,
        shared=state.records,
    )
    app[keys.RECORDS] = records
    if hook is None:
        shared = Shared(
            upstream=app[keys.UPSTREAM],
            records=records,
            metrics=app[keys.METRICS].compaction,
            tasks=app[keys.TASKS],
            calibration=Calibration(settings.models.max_models),
            learned=LearnedWindows(settings.models.max_models),
            offload=app[WORKERS],
            archiving=Archiving(app[keys.ARCHIVE], app[keys.METRICS].archive, app[keys.TASKS])
            if settings.archive.enabled
            else None,
            recall=Recall(
                app[keys.ARCHIVE],
                settings.memory.dir,
                settings.compaction.recall_max_rounds,
                app[keys.METRICS].recall,
                native=settings.compaction.summarizer == "native",
            )
            if settings.compaction.recall == "on" and settings.compaction.recall_max_rounds
            else None,
        )
        replacements = Replacements(
            store=store or state.backend, state=state.backend, llm_for=llm_for
        )
        hook = build_hook(settings, shared, replacements)
    app[keys.HOOK] = hook
    app.cleanup_ctx.append(_upstream_ctx)
    app.cleanup_ctx.append(_workers_ctx)
    app.cleanup_ctx.append(_state_ctx(state))
    # Cleanup runs in reverse order: background work stops before the ClientSession closes.
    app.cleanup_ctx.append(_tasks_ctx)
    _add_routes(app.router)
    return app


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    """One pooled ClientSession for the app's lifetime. aiohttp runs cleanup after in-flight
    requests finished (or the shutdown timeout passed), so no relay loses its session."""
    upstream = app[keys.UPSTREAM]
    await upstream.open()
    try:
        yield
    finally:
        await upstream.close()


async def _workers_ctx(app: web.Application) -> AsyncIterator[None]:
    workers = app[WORKERS]
    workers.open()
    try:
        yield
    finally:
        await workers.close()


def _state_ctx(state: State) -> Callable[[web.Application], AsyncIterator[None]]:
    """Open the state at start (an unreachable backend or archive is reported, never fatal) and
    close it after the background work stopped, so pending writes land."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        await state.open()
        try:
            yield
        finally:
            await state.close()

    return ctx


async def _tasks_ctx(app: web.Application) -> AsyncIterator[None]:
    app[keys.TASKS].spawn(
        watch_loop_lag(app[keys.METRICS].loop_lag), name="loop-lag", lifelong=True
    )
    trim_s = app[keys.SETTINGS].server.heap_trim_s
    trim = find_trim() if trim_s > 0 else None
    if trim is not None:
        app[keys.TASKS].spawn(trim_heap_every(trim_s, trim), name="heap-trim", lifelong=True)
    settings = app[keys.SETTINGS]
    app[keys.TASKS].spawn(
        _prune_memory_every(settings.memory.dir, settings.archive.max_age_s),
        name="memory-prune",
        lifelong=True,
    )
    yield
    await app[keys.TASKS].close()


async def _prune_memory_every(root: Path, max_age_s: float) -> None:
    """A session's memory folder goes with its archived turns: once idle past the archive's age
    bound (`archive.max_age_days`), at start and then every hour."""
    while True:
        try:
            removed = await asyncio.to_thread(prune_memory, root, max_age_s, now=time.time())
        except OSError as exc:  # an unreadable root: said, and tried again later
            log.warning("memory folders not pruned", extra={"error": repr(exc)})
        else:
            if removed:
                log.info("memory folders pruned", extra={"sessions": len(removed)})
        await asyncio.sleep(_MEMORY_PRUNE_S)


def _add_routes(router: web.UrlDispatcher) -> None:
    """Every route's handler is wrapped in the middleware (proxy.http.middleware) with the
    route's kind, which labels its metrics and access lines; hooked routes' kinds are also their
    dialects (proxy.dialects). Nothing is left to the router's own answers: GET-only
    endpoints take every method and refuse the others in the middleware (the admin ones in
    their handler), a catch-all route answers every unknown target, and every route answers an
    `Expect` header through its middleware too, so a 405, 404 or 417 is shaped and counted like
    any error."""
    for path, kind in (
        ("chat/completions", "chat"),
        ("responses", "responses"),
        ("messages", "messages"),
    ):
        hooked = wrap_handler(handlers.hooked, kind)
        for prefix in ("", "/s/{session}"):
            router.add_post(
                f"{prefix}/v1/{path}", hooked, expect_handler=handlers.expect_handler(kind)
            )
    forward = wrap_handler(handlers.forward, "forward")
    for prefix in ("", "/s/{session}"):
        router.add_route(
            "*",
            f"{prefix}/v1/{{tail:.*}}",
            forward,
            expect_handler=handlers.expect_handler("forward"),
        )
    for path, handler, route in (
        ("/healthz", handlers.healthz, "healthz"),
        ("/metrics", handlers.metrics, "metrics"),
    ):
        router.add_route(
            "*",
            path,
            wrap_handler(handler, route, methods=GET_ONLY, takes_body=False),
            expect_handler=handlers.expect_handler(route),
        )
    # The admin endpoints refuse other methods themselves, after answering 404 while disabled.
    for path, handler, route in (
        ("/admin/sessions", routes.admin_sessions, "admin"),
        ("/admin/sessions/{session}", routes.admin_session, "admin_session"),
        ("/admin/sessions/{session}/archive", routes.admin_archive, "admin_archive"),
    ):
        router.add_route(
            "*",
            path,
            wrap_handler(handler, route, takes_body=False),
            expect_handler=handlers.expect_handler(route),
        )
    # The dashboard: its page and files (no token: they hold no data), and its JSON (token).
    for path, handler, route in (
        ("/admin/", dashboard.dashboard_page, "admin_dashboard"),
        ("/admin/assets/{name}", dashboard.dashboard_asset, "admin_dashboard"),
        ("/admin/api/sessions", dashboard.api_sessions, "admin_api"),
        ("/admin/api/sessions/{session}", dashboard.api_session, "admin_api"),
        ("/admin/api/sessions/{session}/memory", dashboard.api_memory, "admin_api"),
        ("/admin/api/live", dashboard.api_live, "admin_api"),
    ):
        router.add_route(
            "*",
            path,
            wrap_handler(handler, route, takes_body=False),
            expect_handler=handlers.expect_handler(route),
        )
    anywhere = AnyTarget()
    router.register_resource(anywhere)
    anywhere.add_route(
        "*",
        wrap_handler(unmatched, "unmatched"),
        expect_handler=handlers.expect_handler("unmatched"),
    )
