"""The app factory: everything the proxy is made of is built here, from `Settings` alone."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from proxy import keys
from proxy.compacting.hook import create_pipeline
from proxy.hook import ChatPipeline
from proxy.http import admin, handlers
from proxy.http.middlewares import error_middleware, observe_middleware
from proxy.http.sessions import SessionRecords
from proxy.http.upstream import Upstream, open_session
from proxy.metrics import Metrics
from proxy.settings import Settings
from proxy.tasks import BackgroundTasks


def create_app(
    settings: Settings,
    *,
    pipeline: ChatPipeline | None = None,
    metrics: Metrics | None = None,
) -> web.Application:
    """A ready-to-run proxy. `pipeline` handles chat requests (default: compaction);
    `metrics` lets a caller supply an extended `Metrics`. Reads no file or environment."""
    app = web.Application(
        client_max_size=settings.server.max_body_bytes,
        middlewares=[observe_middleware, error_middleware],
    )
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = metrics if metrics is not None else Metrics()
    app[keys.RECORDS] = SessionRecords(
        max_sessions=settings.admin.max_sessions,
        records_per_session=settings.admin.records_per_session,
    )
    app[keys.TASKS] = BackgroundTasks()
    app[keys.CHAT_PIPELINE] = (
        pipeline if pipeline is not None else create_pipeline(app, app[keys.TASKS])
    )
    app.cleanup_ctx.append(_upstream_ctx)
    # Cleanup runs in reverse order: background work stops before the ClientSession closes.
    app.cleanup_ctx.append(_tasks_ctx)
    _add_routes(app.router)
    return app


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    """One pooled ClientSession for the app's lifetime. aiohttp runs cleanup after in-flight
    requests finished (or the shutdown timeout passed), so no relay loses its session."""
    settings = app[keys.SETTINGS].upstream
    session = open_session(settings)
    app[keys.UPSTREAM] = Upstream(session, settings.base_url, app[keys.METRICS])
    try:
        yield
    finally:
        await session.close()


async def _tasks_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[keys.TASKS].close()


def _add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/v1/chat/completions", handlers.chat, name="chat")
    router.add_post("/s/{session}/v1/chat/completions", handlers.chat, name="session_chat")
    router.add_route("*", "/v1/{tail:.*}", handlers.forward, name="forward")
    router.add_route("*", "/s/{session}/v1/{tail:.*}", handlers.forward, name="session_forward")
    router.add_get("/healthz", handlers.healthz, name="healthz")
    router.add_get("/metrics", handlers.metrics, name="metrics")
    router.add_get("/admin/sessions", admin.admin_sessions, name="admin")
    router.add_get("/admin/sessions/{session}", admin.admin_session, name="admin_session")
