"""The two ways a request goes upstream.

- `forward_hooked`: routes a hook may change (chat completions, responses, Anthropic messages).
  The body is read whole (bounded by `server.max_body_mb`), handed to the app's `Hook`, and its
  `Exchange` says what is sent; an upstream 400/413/422 is shown to the exchange, which may ask
  for one retry with a new body.
- `forward_verbatim`: everything else under /v1/. The body streams to the upstream as it arrives.

Bodies are taken from the client by `bodies` (413 past the size limit, 408 after a silence).
Both relay the response with `relay.relay`. Invalid JSON in a hooked request is not our
business: the bytes go upstream unchanged and the upstream's own 400 comes back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterable

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.errors import InvalidPath, ProxyError, UpstreamStreamCut
from proxy.http import keys
from proxy.http.bodies import ClientBody, LimitedBody, RequestBody, read_body, too_large
from proxy.http.encodings import decode_body
from proxy.http.headers import upstream_request_headers
from proxy.http.keys import TimelineLine
from proxy.http.relay import relay
from proxy.http.upstream import Body, Response
from proxy.http.usage import UsageProbe
from proxy.interception import (
    Exchange,
    Followup,
    Hook,
    Passthrough,
    RequestContext,
    Resend,
    Usage,
)
from proxy.outcome import RecallFigures
from proxy.sessions import resolve_session_id

log = logging.getLogger(__name__)

RETRYABLE_STATUSES = frozenset({400, 413, 422})
MAX_ERROR_BODY_BYTES = 1024 * 1024


def raw_tail(request: web.Request, session: str | None) -> str:
    """The still percent-encoded path after `/v1/` (after `/s/{session}/v1/`)."""
    prefix = f"/s/{session}/v1/" if session is not None else "/v1/"
    raw_path = request.rel_url.raw_path
    if not raw_path.startswith(prefix):
        raise InvalidPath("invalid path: expected /v1/... or /s/{session}/v1/...")
    return raw_path[len(prefix) :]


async def forward_hooked(request: web.Request, path_session: str | None) -> web.StreamResponse:
    """A request the app's hook may change (see proxy.interception): body read whole, one
    Exchange."""
    app = request.app
    settings = app[keys.SETTINGS]
    upstream = app[keys.UPSTREAM]
    metrics = app[keys.METRICS]
    info = request[keys.REQUEST_INFO]

    explicit_session = resolve_session_id(request.headers, path_session)
    info.session = explicit_session
    tail = raw_tail(request, path_session)
    url = upstream.url_for(tail, request.rel_url.raw_query_string)
    sent = await read_body(request, settings.server)
    body = sent.data
    metrics.requests.add_request_bytes(info.route, len(sent.raw))
    headers, credential = upstream_request_headers(
        request.headers, upstream.api_key_for(tail, request.headers), keep_length=False
    )
    ctx = RequestContext(
        route=info.route,
        explicit_session=explicit_session,
        credential=credential,
        path=request.path,
        headers=request.headers,
        query=request.rel_url.raw_query_string,
    )
    exchange = await _prepare(app[keys.HOOK], ctx, body)
    session = exchange.session_id
    if session is not None:
        info.session = session
        app[keys.RECORDS].touch(session)
    overhead_ms = info.overhead_ms()  # what deciding cost before anything went upstream

    headers.update(exchange.upstream_headers)
    response = await _send(request, "POST", url, headers, await sent.for_upstream(exchange.body))
    already_read = b""
    if response.status in RETRYABLE_STATUSES:
        try:
            already_read, complete = await _read_error(request, response)
        except UpstreamStreamCut as cut:
            # The error body broke off: the client gets its status and the bytes that came,
            # then the stream ends short, as on any route (the relay logs and counts it).
            return await relay(
                request,
                response,
                _Failing(cut),
                info=info,
                metrics=metrics,
                outcome=exchange.outcome,
                already_read=cut.partial,
            )
        retry = None
        if complete:
            decoded = decode_body(already_read, response.headers.get("Content-Encoding", ""))
            if decoded is not None:
                retry = await _retry_after_error(exchange, response.status, decoded)
        if retry is not None:
            response.close()
            log.info("retrying upstream once with the hook's body", extra={"path": request.path})
            headers.update(exchange.upstream_headers)
            response = await _send(request, "POST", url, headers, await sent.for_upstream(retry))
            already_read = b""

    followup = exchange.followup
    if followup is not None and response.status == 200:
        return await _relay_followed(request, exchange, followup, response, body, overhead_ms,
                                     _Resend(request, url, headers, sent))  # fmt: skip

    # Only an exchange that will use `usage` pays for the (cheap) probe.
    probe = (
        None
        if not exchange.wants_usage
        else UsageProbe(
            response.headers.get("Content-Type", ""), response.headers.get("Content-Encoding", "")
        )
    )
    status = response.status
    relayed = await relay(
        request,
        response,
        upstream.chunks(response),
        info=info,
        metrics=metrics,
        outcome=exchange.outcome,
        already_read=already_read,
        probe=probe,
    )
    _observe(exchange, status, probe)
    if session is not None:
        app[keys.RECORDS].add_request(
            session, timeline_line(info.route, body, exchange, status, overhead_ms)
        )
    return relayed


async def _relay_followed(
    request: web.Request,
    exchange: Exchange,
    followup: Followup,
    first: Response,
    body: bytes,
    overhead_ms: float,
    resend: Resend,
) -> web.StreamResponse:
    """Relay what the exchange's followup makes of the upstream's first response."""
    app = request.app
    info = request[keys.REQUEST_INFO]
    followed = await followup.follow(first, resend)
    relayed = await relay(
        request,
        _Rewritten(followed.response, followed.length) if followed.rewritten else followed.response,
        followed.chunks,
        info=info,
        metrics=app[keys.METRICS],
        outcome=exchange.outcome,
        recall=followed.recall,
    )
    _observe_usage(exchange, followed.response.status, followed.usage)
    session = exchange.session_id
    if session is not None:
        # A stream's followup tells its rounds once it is over: read them now.
        line = timeline_line(
            info.route, body, exchange, followed.response.status, overhead_ms, followed.recall
        )
        app[keys.RECORDS].add_request(session, line)
    return relayed


class _Resend:
    """The upstream for a followup: the request's URL and headers, bodies in the client's
    coding, waits counted as upstream waits."""

    def __init__(
        self, request: web.Request, url: URL, headers: CIMultiDict[str], sent: ClientBody
    ) -> None:
        self._request = request
        self._url = url
        self._headers = headers
        self._sent = sent

    async def send(self, body: bytes) -> Response:
        data = await self._sent.for_upstream(body)
        return await _send(self._request, "POST", self._url, self._headers, data)

    def chunks(self, response: Response) -> AsyncIterable[bytes]:
        return self._request.app[keys.UPSTREAM].chunks(response)

    async def read(self, response: Response) -> bytes:
        info = self._request[keys.REQUEST_INFO]
        started = time.perf_counter()
        try:
            read, complete = await self._request.app[keys.UPSTREAM].read_bounded(
                response, self._request.app[keys.SETTINGS].server.max_body_bytes
            )
        finally:
            info.upstream_wait_s += time.perf_counter() - started
        decoded = decode_body(read, response.headers.get("Content-Encoding", ""))
        if not complete or decoded is None:
            raise UpstreamStreamCut("closed", partial=read)
        return decoded


class _Rewritten:
    """An upstream response whose body a followup rewrote: its length and encoding headers no
    longer hold (the body is relayed decoded), its length is `length` (None: unknown until
    written, so sent chunked)."""

    def __init__(self, response: Response, length: int | None) -> None:
        self._response = response
        headers = CIMultiDict(response.headers)
        for name in ("Content-Length", "Content-Encoding"):
            headers.popall(name, None)
        if length is not None:
            headers["Content-Length"] = str(length)
        self.headers = CIMultiDictProxy(headers)

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def reason(self) -> str | None:
        return self._response.reason

    @property
    def content(self) -> Body:
        return self._response.content

    def release(self) -> object:
        return self._response.release()

    def close(self) -> None:
        self._response.close()


def timeline_line(
    route: str,
    body: bytes,
    exchange: Exchange,
    status: int,
    overhead_ms: float,
    recall: RecallFigures | None = None,
) -> TimelineLine:
    """A session's timeline line for one hooked request (AdminRecords.add_request): what the
    exchange's outcome and a followup's `recall` rounds told the client."""
    return (
        time.time(),
        route,
        exchange.outcome,
        recall,
        len(body),
        len(exchange.body),
        status,
        overhead_ms,
    )


async def forward_verbatim(request: web.Request, path_session: str | None) -> web.StreamResponse:
    app = request.app
    settings = app[keys.SETTINGS]
    upstream = app[keys.UPSTREAM]
    info = request[keys.REQUEST_INFO]

    info.session = resolve_session_id(request.headers, path_session)
    tail = raw_tail(request, path_session)
    url = upstream.url_for(tail, request.rel_url.raw_query_string)
    limit = settings.server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    headers, _ = upstream_request_headers(
        request.headers, upstream.api_key_for(tail, request.headers), keep_length=True
    )
    body = (
        LimitedBody(request, settings.server, app[keys.METRICS], info.route)
        if request.body_exists
        else None
    )
    try:
        response = await _send(request, request.method, url, headers, body)
    except ProxyError:
        if body is not None and body.exceeded:
            raise too_large(limit) from None
        raise
    if body is not None and body.exceeded:
        response.close()
        raise too_large(limit)
    return await relay(
        request, response, upstream.chunks(response), info=info, metrics=app[keys.METRICS]
    )


async def _send(
    request: web.Request, method: str, url: URL, headers: CIMultiDict[str], data: RequestBody
) -> Response:
    info = request[keys.REQUEST_INFO]
    started = time.perf_counter()
    try:
        response = await request.app[keys.UPSTREAM].send(
            method, url, headers, data, route=info.route
        )
    finally:
        info.upstream_wait_s += time.perf_counter() - started
    info.upstream_status = response.status
    return response


async def _read_error(request: web.Request, response: Response) -> tuple[bytes, bool]:
    info = request[keys.REQUEST_INFO]
    started = time.perf_counter()
    try:
        return await request.app[keys.UPSTREAM].read_bounded(response, MAX_ERROR_BODY_BYTES)
    except BaseException:
        response.close()
        raise
    finally:
        info.upstream_wait_s += time.perf_counter() - started


# The hook is the compaction layer's code: it must fail open, so the handler treats any
# exception from it (other than a deliberate ProxyError) as "pass through" and says so in the log.


async def _prepare(hook: Hook, ctx: RequestContext, body: bytes) -> Exchange:
    try:
        return await hook.prepare(ctx, body)
    except ProxyError:
        raise
    except Exception:
        log.exception("hook failed in prepare; forwarding the original request")
        return Passthrough(body=body, session_id=ctx.explicit_session)


async def _retry_after_error(exchange: Exchange, status: int, body: bytes) -> bytes | None:
    try:
        return await exchange.retry_after_error(status, body)
    except Exception:
        log.exception("hook failed in retry_after_error; relaying the upstream error")
        return None


def _observe(exchange: Exchange, status: int, probe: UsageProbe | None) -> None:
    _observe_usage(exchange, status, probe.usage() if probe is not None else None)


def _observe_usage(exchange: Exchange, status: int, usage: Usage | None) -> None:
    try:
        exchange.observe(status, usage)
    except Exception:
        log.exception("hook failed in observe")


class _Failing:
    """A body that fails at once with `cut`: what is left of an error body that broke off."""

    def __init__(self, cut: UpstreamStreamCut) -> None:
        self._cut = cut

    def __aiter__(self) -> _Failing:
        return self

    async def __anext__(self) -> bytes:
        raise self._cut
