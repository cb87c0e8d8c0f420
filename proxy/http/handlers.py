"""Thin handlers, one per endpoint: each picks its inputs from the request and delegates.
The admin endpoints and the dashboard are in proxy.admin."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from aiohttp import HttpVersion11, web

from proxy.errors import ExpectationFailed
from proxy.http import keys
from proxy.http.forwarding import forward_hooked, forward_verbatim, raw_tail
from proxy.http.middleware import wrap_handler
from proxy.http.websocket import answer_upgrade, is_websocket_upgrade

ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


async def hooked(request: web.Request) -> web.StreamResponse:
    return await forward_hooked(request, request.match_info.get("session"))


async def forward(request: web.Request) -> web.StreamResponse:
    session = request.match_info.get("session")
    if is_websocket_upgrade(request):
        return await answer_upgrade(request, raw_tail(request, session), session)
    return await forward_verbatim(request, session)


def expect_handler(route: str) -> ExpectHandler:
    """The answer to an `Expect` header on `route`'s requests, before their handler runs.

    `100-continue`: go ahead, unless the stated length is already past `server.max_body_mb`.
    Then the client is told nothing yet, the handler answers 413 at once (shaped, counted and
    logged by the middleware), and the client never sends a body that would be refused
    (aiohttp's own handler says 100 to any length). Any other expectation is a 417, answered
    through the middleware in the handler's stead (aiohttp's own is a plain-text 417, neither
    counted nor logged)."""
    refuse = wrap_handler(_refuse_expectation, route)

    async def expect(request: web.Request) -> web.StreamResponse | None:
        if request.version != HttpVersion11:
            return None
        if request.headers.get("Expect", "").lower() != "100-continue":
            return await refuse(request)
        limit = request.app[keys.SETTINGS].server.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return None
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        # What was written so far is not part of the response (aiohttp's own handler does this).
        request.writer.output_size = 0
        return None

    return expect


async def _refuse_expectation(request: web.Request) -> web.StreamResponse:
    expect = request.headers.get("Expect", "")
    raise ExpectationFailed(f"unsupported Expect header {expect!r}: only 100-continue is")


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[keys.METRICS]
    return web.Response(body=registry.render(), headers={"Content-Type": registry.content_type})


def json_response(payload: object) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/json")
