"""Request bodies as the proxy takes them from its clients: read whole (the hooked routes) or
streamed as they arrive (the rest), either way refused past `server.max_body_mb` (413) and after
`server.read_timeout_s` of silence (408), so a client cannot hold a handler by stopping halfway.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator

from aiohttp import StreamReader, web
from aiohttp.web_protocol import RequestPayloadError

from proxy.errors import BodyTooLarge, RequestTimeout, UnreadableBody
from proxy.http.encodings import unreadable_body
from proxy.metrics import Metrics
from proxy.settings import ServerSettings

RequestBody = bytes | AsyncIterable[bytes] | None
"""A body as it goes upstream: read whole (`read_body`), streamed (`LimitedBody`), or none."""


async def read_body(request: web.Request, server: ServerSettings) -> bytes:
    """The whole body, refused past `server.max_body_mb` (decoded bytes, for a compressed body),
    and after `server.read_timeout_s` without a byte of it.

    Read as the chunks arrive and joined once: `request.read()` grows a bytearray chunk by chunk
    and then copies it into bytes, two to three copies of a body that may be megabytes, on
    every request of a long conversation."""
    limit, patience_s = server.max_body_bytes, server.read_timeout_s
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    content = request.content
    # As request.read() does (where aiohttp has it): buffer limits raised to the limit, so a
    # compressed body decompresses in large pieces rather than 256 KiB at a time.
    raise_limits = getattr(content, "set_read_chunk_size", None)
    if raise_limits is not None:
        raise_limits(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := await _next_chunk(content, patience_s):
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            chunks.append(chunk)
    except RequestPayloadError:
        raise _unreadable(content, request.headers.get("Content-Encoding", "")) from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _unreadable(content: StreamReader, encoding: str) -> UnreadableBody:
    """The 400 for a body aiohttp's server failed to read. Its parser gave the body up, so the
    reader is marked finished: after the answer, aiohttp would read it again, to drain it for
    the next request, and log the same failure as an unhandled exception, traceback and all."""
    content.feed_eof()
    return unreadable_body(encoding)


async def _next_chunk(content: StreamReader, patience_s: float) -> bytes:
    """The next piece of a request body (b"" at its end), waited for at most `patience_s`."""
    if content.is_eof():  # the rest has arrived (all of a small body, often): no timer
        return await content.readany()
    try:
        async with asyncio.timeout(patience_s):
            return await content.readany()
    except TimeoutError:
        raise RequestTimeout(
            f"the client sent no part of its request body for {patience_s:g} s "
            "(server.read_timeout_s)"
        ) from None


def too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(
        f"request body exceeds the proxy's limit of {limit} bytes (server.max_body_mb)"
    )


class LimitedBody:
    """The request body as an async iterable for the client library, streamed as it arrives,
    stopped past `server.max_body_mb` (only chunked bodies can get there: a declared length is
    checked first) or after `server.read_timeout_s` of silence."""

    def __init__(
        self, request: web.Request, server: ServerSettings, metrics: Metrics, route: str
    ) -> None:
        self._content = request.content
        self._limit = server.max_body_bytes
        self._patience_s = server.read_timeout_s
        self._metrics = metrics
        self._route = route
        self._encoding = request.headers.get("Content-Encoding", "")
        self.exceeded = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        try:
            while chunk := await _next_chunk(self._content, self._patience_s):
                size += len(chunk)
                self._metrics.requests.add_request_bytes(self._route, len(chunk))
                if size > self._limit:
                    self.exceeded = True
                    raise too_large(self._limit)
                yield chunk
        except RequestPayloadError:
            # Raised inside the client library's body writer, which wraps it; Upstream.send
            # unwraps a ProxyError, so this stays the client's 400, not an upstream failure.
            raise _unreadable(self._content, self._encoding) from None
