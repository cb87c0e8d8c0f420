"""Thin handlers, one per endpoint: each picks its inputs from the request and delegates.
The admin endpoints are in proxy.http.admin."""

from __future__ import annotations

import orjson
from aiohttp import HttpVersion11, web

from proxy import keys
from proxy.http.forwarding import forward_hooked, forward_verbatim


async def hooked(request: web.Request) -> web.StreamResponse:
    return await forward_hooked(request, request.match_info.get("session"))


async def forward(request: web.Request) -> web.StreamResponse:
    return await forward_verbatim(request, request.match_info.get("session"))


async def expect_within_limit(request: web.Request) -> None:
    """The answer to `Expect: 100-continue` on the forwarding routes: go ahead, unless the
    stated length is already past `server.max_body_mb`. Then the client is told nothing yet,
    the handler answers 413 at once (shaped, counted and logged by the edge), and the client
    never sends a body that would be refused (aiohttp's own handler says 100 to any length)."""
    expect = request.headers.get("Expect", "")
    if request.version != HttpVersion11:
        return
    if expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
    limit = request.app[keys.SETTINGS].server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        return
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    # What was written so far is not part of the response (aiohttp's own handler does this).
    request.writer.output_size = 0


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[keys.METRICS]
    return web.Response(body=registry.render(), headers={"Content-Type": registry.content_type})


def json_response(payload: object) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/json")
