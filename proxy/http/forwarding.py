"""The two ways a request goes upstream.

- `forward_chat`: chat completions. The body is read whole (bounded by `server.max_body_mb`),
  handed to the app's `ChatPipeline`, and what it returns is sent; an upstream 400/413/422 is
  shown to the pipeline, which may ask for one retry with a new body.
- `forward_verbatim`: everything else under /v1/. The body streams to the upstream as it arrives.

Both relay the response with `streaming.relay`. Invalid JSON in a chat request is not our
business: the bytes go upstream unchanged and the upstream's own 400 comes back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from proxy import keys
from proxy.errors import BodyTooLarge, InvalidPath, ProxyError
from proxy.hook import ChatContext, ChatPipeline, Prepared
from proxy.http.encodings import decode_body
from proxy.http.headers import upstream_request_headers
from proxy.http.relay import relay
from proxy.http.sessions import resolve_session_id
from proxy.http.upstream import read_bounded
from proxy.http.usage import UsageProbe
from proxy.metrics import Metrics

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


async def forward_chat(request: web.Request, path_session: str | None) -> web.StreamResponse:
    app = request.app
    settings = app[keys.SETTINGS]
    upstream = app[keys.UPSTREAM]
    metrics = app[keys.METRICS]
    info = request[keys.REQUEST_INFO]

    session_id = resolve_session_id(request.headers, path_session)
    info.session = session_id
    url = upstream.url_for(raw_tail(request, path_session), request.rel_url.raw_query_string)
    body = await _read_body(request, settings.server.max_body_bytes)
    metrics.labelled(metrics.request_bytes, info.route).inc(len(body))
    headers, credential = upstream_request_headers(
        request.headers, settings.upstream.api_key, keep_length=False
    )
    ctx = ChatContext(
        session_id=session_id, credential=credential, path=request.path, headers=request.headers
    )
    pipeline = app[keys.CHAT_PIPELINE]
    prepared = await _prepare(pipeline, ctx, body)
    if prepared.session_id is not None:
        info.session = prepared.session_id
        app[keys.RECORDS].touch(prepared.session_id)

    response = await _send(request, "POST", url, headers, prepared.body)
    already_read = b""
    if response.status in RETRYABLE_STATUSES:
        already_read, complete = await _read_error(request, response)
        retry = None
        if complete:
            decoded = decode_body(already_read, response.headers.get("Content-Encoding", ""))
            if decoded is not None:
                retry = await _on_upstream_error(pipeline, ctx, prepared, response.status, decoded)
        if retry is not None:
            response.close()
            log.info(
                "retrying upstream once with the pipeline's body", extra={"path": request.path}
            )
            response = await _send(request, "POST", url, headers, retry)
            already_read = b""

    # Only a pipeline that will use `usage` pays for the (cheap) probe.
    probe = (
        None
        if not prepared.wants_usage
        else UsageProbe(
            response.headers.get("Content-Type", ""), response.headers.get("Content-Encoding", "")
        )
    )
    status = response.status
    relayed = await relay(
        request,
        response,
        info=info,
        metrics=metrics,
        extra_headers=prepared.headers,
        already_read=already_read,
        probe=probe,
    )
    _on_response(pipeline, ctx, prepared, status, probe)
    return relayed


async def forward_verbatim(request: web.Request, path_session: str | None) -> web.StreamResponse:
    app = request.app
    settings = app[keys.SETTINGS]
    upstream = app[keys.UPSTREAM]
    info = request[keys.REQUEST_INFO]

    info.session = resolve_session_id(request.headers, path_session)
    url = upstream.url_for(raw_tail(request, path_session), request.rel_url.raw_query_string)
    limit = settings.server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    headers, _ = upstream_request_headers(
        request.headers, settings.upstream.api_key, keep_length=True
    )
    body = (
        _LimitedBody(request, limit, app[keys.METRICS], info.route) if request.body_exists else None
    )
    try:
        response = await _send(request, request.method, url, headers, body)
    except ProxyError:
        if body is not None and body.exceeded:
            raise _too_large(limit) from None
        raise
    if body is not None and body.exceeded:
        response.close()
        raise _too_large(limit)
    return await relay(request, response, info=info, metrics=app[keys.METRICS])


async def _send(
    request: web.Request, method: str, url: Any, headers: Any, data: Any
) -> aiohttp.ClientResponse:
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


async def _read_error(request: web.Request, response: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    info = request[keys.REQUEST_INFO]
    started = time.perf_counter()
    try:
        return await read_bounded(response, MAX_ERROR_BODY_BYTES, request.app[keys.METRICS])
    except BaseException:
        response.close()
        raise
    finally:
        info.upstream_wait_s += time.perf_counter() - started


async def _read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(limit) from None


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(
        f"request body exceeds the proxy's limit of {limit} bytes (server.max_body_mb)"
    )


# The pipeline is the compaction layer's code: it must fail open, so the handler treats any
# exception from it (other than a deliberate ProxyError) as "pass through" and says so in the log.


async def _prepare(pipeline: ChatPipeline, ctx: ChatContext, body: bytes) -> Prepared:
    try:
        return await pipeline.prepare(ctx, body)
    except ProxyError:
        raise
    except Exception:
        log.exception("chat pipeline failed in prepare; forwarding the original request")
        return Prepared(body=body, session_id=ctx.session_id)


async def _on_upstream_error(
    pipeline: ChatPipeline, ctx: ChatContext, prepared: Prepared, status: int, body: bytes
) -> bytes | None:
    try:
        return await pipeline.on_upstream_error(ctx, prepared, status, body)
    except Exception:
        log.exception("chat pipeline failed in on_upstream_error; relaying the upstream error")
        return None


def _on_response(
    pipeline: ChatPipeline,
    ctx: ChatContext,
    prepared: Prepared,
    status: int,
    probe: UsageProbe | None,
) -> None:
    try:
        pipeline.on_response(ctx, prepared, status, probe.usage() if probe is not None else None)
    except Exception:
        log.exception("chat pipeline failed in on_response")


class _LimitedBody:
    """The request body as an async iterable for the client library, streamed as it arrives and
    stopped past `limit` (only chunked bodies can get there: a declared length is checked first).
    """

    def __init__(self, request: web.Request, limit: int, metrics: Metrics, route: str) -> None:
        self._content = request.content
        self._limit = limit
        self._metrics = metrics
        self._route = route
        self.exceeded = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._content.iter_any():
            size += len(chunk)
            self._metrics.labelled(self._metrics.request_bytes, self._route).inc(len(chunk))
            if size > self._limit:
                self.exceeded = True
                raise _too_large(self._limit)
            yield chunk
