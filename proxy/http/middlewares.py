"""The one middleware, `edge_middleware`, does two things around every handler:

- bookkeeping (in-flight gauge, request counter, the one JSON access line), also for requests
  that fail or whose client goes away;
- the one place our errors become the OpenAI error shape (Anthropic's on Anthropic's paths).
  aiohttp's own HTTP errors (404, 405, 413…) get the same shape; anything unexpected is logged
  once and answered with a generic 500, never a traceback.

One middleware rather than two: each layer is a coroutine per request (and any middleware at
all adds aiohttp's own current-app layer), a measurable share of a pass-through request.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy import keys
from proxy.errors import ProxyError, error_body
from proxy.http.upstream import is_anthropic_tail
from proxy.logs import RequestInfo, log_request

log = logging.getLogger(__name__)

# aiohttp's status for "the client closed the connection" has no HTTP code; nginx's 499 is the
# one operators know.
CLIENT_CLOSED = 499

_ROUTES = {
    "chat": "chat",
    "session_chat": "chat",
    "responses": "responses",
    "session_responses": "responses",
    "messages": "messages",
    "session_messages": "messages",
    "forward": "forward",
    "session_forward": "forward",
}


def api_of(request: web.Request) -> str:
    """ "anthropic" for Anthropic's paths (their errors take Anthropic's shape), else "openai"."""
    if route_of(request) == "messages" or is_anthropic_tail(request.match_info.get("tail", "")):
        return "anthropic"
    return "openai"


def route_of(request: web.Request) -> str:
    name = request.match_info.route.name
    if name is None:
        return "unmatched"
    return _ROUTES.get(name, name)


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    info = RequestInfo(route=route_of(request))
    request[keys.REQUEST_INFO] = info
    traffic = request.app[keys.METRICS].traffic
    traffic.in_flight += 1
    status = 500
    try:
        try:
            response = await handler(request)
        except Exception as exc:  # not CancelledError: a BaseException
            response = _shaped(request, exc)
        status = response.status
        return response
    except web.HTTPException as exc:  # a redirect: only errors are shaped
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = CLIENT_CLOSED
        info.outcome = info.outcome or "client_gone"
        raise
    finally:
        traffic.in_flight -= 1
        traffic.count_request(info.route, request.method, status)
        log_request(request.method, request.path, status, info)


def _shaped(request: web.Request, exc: Exception) -> web.Response:
    """The error response for `exc`, raised by the handler (called in its `except` block);
    re-raises an HTTPException that is not an error (a redirect)."""
    if isinstance(exc, ProxyError):
        return error_response(exc.status, exc.body(api_of(request)))
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        code = "not_found" if exc.status == 404 else None
        body = error_body(exc.reason, kind, code, status=exc.status, api=api_of(request))
        response = error_response(exc.status, body)
        if exc.status == 405 and "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    log.exception("unexpected error", extra={"method": request.method, "path": request.path})
    body = error_body(
        "internal error in compaction-proxy",
        "server_error",
        "internal_error",
        status=500,
        api=api_of(request),
    )
    return error_response(500, body)


def error_response(status: int, body: bytes) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/json")
