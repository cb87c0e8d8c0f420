"""Request bodies as the proxy takes them from its clients: read whole (the hooked routes) or
streamed as they arrive (the rest), either way refused past `server.max_body_mb` (413) and after
`server.read_timeout_s` of silence (408), so a client cannot hold a handler by stopping halfway.

aiohttp's server does not decode request bodies here (`auto_decompress` is off, see
proxy.http.serving): a hooked route decodes its body itself, in a thread, a step at a time and
counting the decoded bytes against the limit (`read_body`), and the streamed routes relay the
bytes and their `Content-Encoding` untouched. So a small body that decodes to gigabytes costs at most the limit,
and nothing decodes the rest of it after the answer (aiohttp's lingering drain reads raw bytes,
and a 413 closes the connection instead).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

from aiohttp import StreamReader, web
from aiohttp.web_protocol import RequestPayloadError

from proxy.errors import BodyTooLarge, RequestTimeout, UnreadableBody
from proxy.http.encodings import BodyDecoder, encode_body, request_coding
from proxy.metrics import Metrics
from proxy.settings import ServerSettings

RequestBody = bytes | AsyncIterable[bytes] | None
"""A body as it goes upstream: read whole (`read_body`), streamed (`LimitedBody`), or none."""

# How much of a body aiohttp buffers before it stops reading the socket: enough to read a long
# conversation in few wake-ups, never the whole limit.
_READ_BUFFER_BYTES = 1024 * 1024
# A body re-encoded for the upstream past this size is encoded in a thread (the codecs release
# the GIL), so the event loop keeps moving other requests meanwhile.
_ENCODE_ON_LOOP_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class ClientBody:
    """A request body as read: `data` decoded (what the hook reads), `raw` as the client sent
    it, in `coding` ("" when the proxy does not decode it: then `data` is `raw`)."""

    data: bytes
    raw: bytes
    coding: str

    async def for_upstream(self, body: bytes) -> bytes:
        """`body` as it goes upstream with the client's headers, `Content-Encoding` included:
        the client's own bytes when unchanged, else `body` in the client's coding."""
        if not self.coding:
            return body
        if body is self.data or body == self.data:
            return self.raw
        if len(body) < _ENCODE_ON_LOOP_BYTES:
            return encode_body(body, self.coding)
        return await asyncio.to_thread(encode_body, body, self.coding)


async def read_body(request: web.Request, server: ServerSettings) -> ClientBody:
    """The whole body, refused past `server.max_body_mb` (of the bytes sent, and of the decoded
    bytes for a body in a coding the proxy decodes), and after `server.read_timeout_s` without a
    byte of it. Decoding runs off the event loop, a step (`DECODE_STEP` of output) at a time,
    and stops at the limit.

    Read as the chunks arrive and joined once: `request.read()` grows a bytearray chunk by chunk
    and then copies it into bytes, two to three copies of a body that may be megabytes, on
    every request of a long conversation."""
    limit, patience_s = server.max_body_bytes, server.read_timeout_s
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    content = request.content
    raise_buffer = getattr(content, "set_read_chunk_size", None)  # aiohttp 3.12 on
    if raise_buffer is not None:
        raise_buffer(min(limit, _READ_BUFFER_BYTES))
    coding = request_coding(request.headers)
    decoder = BodyDecoder(coding) if coding else None
    raw: list[bytes] = []
    decoded: list[bytes] = []
    size = decoded_size = 0
    try:
        while chunk := await _next_chunk(content, patience_s):
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            raw.append(chunk)
            if decoder is None:
                continue
            pieces, decoded_size = await asyncio.to_thread(
                _decode_within, decoder, chunk, decoded_size, limit
            )
            if decoded_size > limit:
                raise too_large(limit)
            decoded += pieces
    except RequestPayloadError:
        raise _unreadable(content) from None
    whole = _joined(raw)
    if decoder is None:
        return ClientBody(whole, whole, "")
    decoder.finish()
    return ClientBody(_joined(decoded), whole, coding)


def _decode_within(
    decoder: BodyDecoder, chunk: bytes, size: int, limit: int
) -> tuple[list[bytes], int]:
    """`chunk` decoded, a step at a time, stopping once the body's decoded `size` passes
    `limit`: the pieces and the new size. Run in a thread: the codecs release the GIL, and one
    step of brotli can take tens of milliseconds (a 16 MiB window filled at once)."""
    pieces: list[bytes] = []
    for piece in decoder.pieces(chunk):
        size += len(piece)
        if size > limit:
            break
        pieces.append(piece)
    return pieces, size


def _joined(chunks: list[bytes]) -> bytes:
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _unreadable(content: StreamReader) -> UnreadableBody:
    """The 400 for a body aiohttp's server failed to read (its chunked framing broke). Its
    parser gave the body up, so the reader is marked finished: after the answer, aiohttp would
    read it again, to drain it for the next request, and log the same failure as an unhandled
    exception, traceback and all."""
    content.feed_eof()
    return UnreadableBody("the request body is malformed (broken chunked framing)")


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
    its bytes and their coding untouched, stopped past `server.max_body_mb` (only chunked bodies
    can get there: a declared length is checked first) or after `server.read_timeout_s` of
    silence."""

    def __init__(
        self, request: web.Request, server: ServerSettings, metrics: Metrics, route: str
    ) -> None:
        self._content = request.content
        self._limit = server.max_body_bytes
        self._patience_s = server.read_timeout_s
        self._metrics = metrics
        self._route = route
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
            raise _unreadable(self._content) from None
