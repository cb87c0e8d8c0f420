"""Thin handlers, one per endpoint: each picks its inputs from the request and delegates."""

from __future__ import annotations

import hmac

import orjson
from aiohttp import web

from proxy import keys
from proxy.errors import NotFound, Unauthorized
from proxy.forwarding import forward_chat, forward_verbatim
from proxy.sessions import check_session_id


async def chat(request: web.Request) -> web.StreamResponse:
    return await forward_chat(request, request.match_info.get("session"))


async def forward(request: web.Request) -> web.StreamResponse:
    return await forward_verbatim(request, request.match_info.get("session"))


async def healthz(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[keys.METRICS]
    return web.Response(body=registry.render(), headers={"Content-Type": registry.content_type})


async def admin_sessions(request: web.Request) -> web.Response:
    _require_admin(request)
    return _json(request.app[keys.RECORDS].list())


async def admin_session(request: web.Request) -> web.Response:
    _require_admin(request)
    session_id = check_session_id(request.match_info["session"], "the path")
    found = request.app[keys.RECORDS].get(session_id)
    if found is None:
        raise NotFound(f"no session {session_id!r} seen (or it was evicted)")
    return _json(found)


def _require_admin(request: web.Request) -> None:
    """404 while admin is disabled (the endpoints do not exist); 401 without the right token."""
    token = request.app[keys.SETTINGS].admin.token
    if token is None:
        raise NotFound("admin endpoints are disabled (set admin.token to enable them)")
    sent = request.headers.get("Authorization", "")
    scheme, _, value = sent.partition(" ")
    if not (
        scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())
    ):
        raise Unauthorized("missing or wrong admin token (Authorization: Bearer <admin.token>)")


def _json(payload: object) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/json")
