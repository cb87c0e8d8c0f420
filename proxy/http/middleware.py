"""The middleware around every route's handler (`wrap_handler`), doing two things for each
request:

- bookkeeping (in-flight gauge, request counter, the one JSON access line), also for requests
  that fail or whose client goes away;
- the one place our errors become the OpenAI error shape (Anthropic's on Anthropic's paths).
  aiohttp's own HTTP errors (413…) get the same shape; anything unexpected is logged once and
  answered with a generic 500, never a traceback.

A wrapper put on each route's handler when the routes are made (app.py), not registered in
aiohttp's `app.middlewares`: any registered middleware at all makes aiohttp add its own
current-app layer, and the two layers together cost a pass-through request about 10 µs of its
~200 µs (measured with wrk against the bare forwarder of bench.passthrough). What the router
would answer by itself is routed here too, so it gets the same shape: a catch-all route answers
404 (`unmatched`), and the GET-only endpoints take every method and answer 405 themselves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection

from aiohttp import web

from proxy.dialects import Dialect, for_route
from proxy.errors import EncodedBodyRefused, HeaderTooLarge, ProxyError, error_body
from proxy.http import keys
from proxy.http.serving import MAX_FIELD_BYTES
from proxy.http.targets import is_anthropic_tail
from proxy.logs import RequestInfo, log_request

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# aiohttp's status for "the client closed the connection" has no HTTP code; nginx's 499 is the
# one operators know.
CLIENT_CLOSED = 499

GET_ONLY = ("GET", "HEAD")


def wrap_handler(
    handler: Handler,
    route: str,
    *,
    methods: Collection[str] | None = None,
    takes_body: bool = True,
) -> Handler:
    """`handler` with the middleware around it. `route` labels its metrics and access lines (and
    its dialect shapes its errors); `methods`, when given, are the only ones it takes, any other
    is a 405; a route that `takes_body=False` refuses an encoded body at once (415, connection
    closed): nothing reads it, and nothing should decode it."""

    async def handle(request: web.Request) -> web.StreamResponse:
        info = RequestInfo(route=route)
        request[keys.REQUEST_INFO] = info
        series = request.app[keys.METRICS].requests
        series.in_flight += 1
        status = 500
        try:
            try:
                verify_header_sizes(request)
                if not takes_body and _is_encoded(request):
                    raise EncodedBodyRefused(
                        f"{request.path} takes no request body, let alone an encoded one"
                    )
                if methods is not None and request.method not in methods:
                    raise web.HTTPMethodNotAllowed(request.method, methods)
                response = await handler(request)
            except Exception as exc:  # not CancelledError: a BaseException
                response = _shaped(request, route, exc)
            status = response.status
            return response
        except web.HTTPException as exc:  # a redirect: only errors are shaped
            status = exc.status
            raise
        except asyncio.CancelledError:
            # The client closed its connection, which cancels its handler (as the CLI serves):
            # mid-stream, or while its answer was awaited. (A shutdown's drain that ran out
            # closes the connections too, and looks the same from here.)
            status = CLIENT_CLOSED
            info.outcome = "client_gone"
            request.app[keys.METRICS].client_disconnects.labels(route).inc()
            raise
        finally:
            series.in_flight -= 1
            series.count_request(route, request.method, status)
            log_request(request.method, request.path, status, info)

    return handle


def verify_header_sizes(request: web.Request) -> None:
    """A header field past MAX_FIELD_BYTES is a 431 that names it, never quotes it."""
    for name, value in request.raw_headers:
        if len(value) > MAX_FIELD_BYTES or len(name) > MAX_FIELD_BYTES:
            shown = name.decode("latin-1") if len(name) <= 100 else "a header"
            raise HeaderTooLarge(
                f"the request header {shown} is larger than {MAX_FIELD_BYTES} bytes"
            )


def _is_encoded(request: web.Request) -> bool:
    coding = request.headers.get("Content-Encoding")
    return (
        coding is not None
        and coding.strip().lower() not in ("", "identity")
        and request.body_exists
    )


async def unmatched(request: web.Request) -> web.StreamResponse:
    """What the catch-all route answers: nothing lives here."""
    raise web.HTTPNotFound()


class AnyTarget(web.PlainResource):
    """The catch-all's resource: it matches every request target. A pattern route's path must
    start with `/`, so `OPTIONS *` would get aiohttp's own text 404, neither counted nor
    logged. Indexed under `/`, which the router tries last for every target but one with an
    empty path (`CONNECT host:443`, `GET http://host`): those never reach a route."""

    def __init__(self) -> None:
        super().__init__("/")

    def _match(self, path: str) -> dict[str, str] | None:
        return {}


def api_of(request: web.Request, route: str) -> Dialect | None:
    """The dialect whose error shape the request's errors take: its route's, Anthropic's on a
    path passed through to Anthropic; None (OpenAI's shape) for the rest."""
    dialect = for_route(route)
    if dialect is None and is_anthropic_tail(request.match_info.get("tail", "")):
        return for_route("messages")
    return dialect


def _shaped(request: web.Request, route: str, exc: Exception) -> web.Response:
    """The error response for `exc`, raised by the handler (called in its `except` block);
    re-raises an HTTPException that is not an error (a redirect)."""
    if isinstance(exc, ProxyError):
        response = error_response(exc.status, exc.body(api_of(request, route)))
        if exc.closes:
            response.force_close()
        return response
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        code = "not_found" if exc.status == 404 else None
        body = error_body(exc.reason, kind, code, status=exc.status, api=api_of(request, route))
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
        api=api_of(request, route),
    )
    return error_response(500, body)


def error_response(status: int, body: bytes) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/json")
