"""Thin handlers, one per endpoint: each picks its inputs from the request and delegates.
The admin endpoints are in proxy.http.admin."""

from __future__ import annotations

import orjson
from aiohttp import web

from proxy import keys
from proxy.http.forwarding import forward_hooked, forward_verbatim


async def hooked(request: web.Request) -> web.StreamResponse:
    return await forward_hooked(request, request.match_info.get("session"))


async def forward(request: web.Request) -> web.StreamResponse:
    return await forward_verbatim(request, request.match_info.get("session"))


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[keys.METRICS]
    return web.Response(body=registry.render(), headers={"Content-Type": registry.content_type})


def json_response(payload: object) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/json")
