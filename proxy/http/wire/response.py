"""One HTTP/1.1 response as the wire client reads it off its connection, parsed by httptools
(llhttp): the head, then the body as it arrives, framed by Content-Length, the chunked coding
(decoded, as aiohttp does) or the end of the connection, never decompressed, and handed out by
`content.readany()` as aiohttp's ClientResponse does. Reading pauses while more than
`_HIGH_WATER` bytes wait for a slow client.

It gives a connection whose response was read whole back to its pool (`Pool`: what it uses
of proxy.http.wire.pool.WirePool, so that this module does not import that one).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.http.wire.connection import Connection, WireError

_MAX_HEAD = 64 * 1024
_HIGH_WATER = 512 * 1024
_HEAD, _BODY, _DONE = range(3)


class Pool(Protocol):
    """Where a response gives its connection back, and how long it waits for bytes."""

    @property
    def read_timeout_s(self) -> float: ...

    def release(self, connection: Connection) -> None: ...


class WireResponse:
    """One response: `status`, `reason`, `headers` once the head arrived, then the body through
    `content.readany()` (b"" at its end), as aiohttp's ClientResponse offers them."""

    status: int
    reason: str | None
    headers: CIMultiDictProxy[str]

    def __init__(self, connection: Connection, pool: Pool) -> None:
        self._connection = connection
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        # As lenient as aiohttp's parser was: bare LF line ends, spaces after a chunk size,
        # control characters in header values.
        self._parser.set_dangerous_leniencies(
            lenient_headers=True,
            lenient_optional_cr_before_lf=True,
            lenient_spaces_after_chunk_size=True,
        )
        self._state = _HEAD
        self._head_size = 0
        self._raw_headers: CIMultiDict[str] = CIMultiDict()
        self._reason = b""
        self._to_close = False  # framed by the end of the connection
        self._reusable = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: WireError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._settled = False  # released or closed

    @property
    def content(self) -> WireResponse:
        return self

    # -- the consumer's side ------------------------------------------------------------------

    async def wait_head(self) -> None:
        while self._state == _HEAD and self._error is None:
            await self._wait()
        if self._state == _HEAD:
            raise self._error or WireError("closed")

    async def readany(self) -> bytes:
        """What arrived since the last call (waiting for some), b"" once the body is complete."""
        while not self._chunks:
            if self._state == _DONE:
                self.release()  # read whole: back to the pool, as aiohttp's client does
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            self._connection.reading(True)
        return data

    def release(self) -> None:
        """Done with it: a connection whose response was read whole goes back to the pool."""
        if self._settled:
            return
        if self._state == _DONE and self._reusable and not self._chunks:
            self._settled = True
            self._connection.response = None
            self._pool.release(self._connection)
        else:
            self.close()

    def close(self) -> None:
        """Drop the connection (what tells the upstream to stop generating)."""
        if self._settled:
            return
        self._settled = True
        self._connection.response = None
        self._connection.close()  # the pool forgets it once it is lost
        if self._state != _DONE and self._error is None:
            self._fail("closed")

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(self._pool.read_timeout_s, self._timed_out, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _timed_out(self, waiter: asyncio.Future[None]) -> None:
        if waiter is self._waiter and not waiter.done():
            self._fail("timeout")
            self._connection.close()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, kind: str) -> None:
        if self._error is None and self._state != _DONE:
            self._error = WireError(kind)
        self._wake()

    # -- the connection's side ------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self._state == _HEAD:
            self._head_size += len(data)
        try:
            self._parser.feed_data(data)
            if self._state == _HEAD and self._head_size > _MAX_HEAD:
                raise WireError("protocol")
        except (httptools.HttpParserError, httptools.HttpParserUpgrade, WireError):
            if self._state == _DONE:
                self._reusable = False  # bytes past the end: the connection is not reused
                return
            self._fail("protocol")
            self._connection.close()
            return
        if self._chunks or self._state != _HEAD:
            self._wake()
        if self._buffered > _HIGH_WATER and not self._paused:
            self._paused = True
            self._connection.reading(False)

    def end(self) -> None:
        """The connection ended: the end of a body read to the close, else a failure."""
        if self._state == _BODY and self._to_close:
            self._state = _DONE
            self._wake()
        else:
            self._fail("closed")

    # httptools' callbacks

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_message_begin(self) -> None:
        if self._state == _DONE:  # bytes of another answer after this one
            self._reusable = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._state == _HEAD:  # not the trailers after a chunked body: never headers
            self._raw_headers.add(name.decode("latin-1"), value.decode("utf-8", "surrogateescape"))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if self._state != _HEAD:  # a second answer to one request
            raise WireError("protocol")
        if 100 <= status < 200:  # informational (100 Continue, 103 Early Hints): passed over
            self._raw_headers, self._reason = CIMultiDict(), b""
            return
        self.status = status
        self.reason = self._reason.decode("latin-1")
        self.headers = CIMultiDictProxy(self._raw_headers)
        coding = ",".join(self.headers.getall("Transfer-Encoding", ()))
        self._to_close = (
            "Content-Length" not in self.headers
            and coding.rsplit(",", 1)[-1].strip().lower() != "chunked"
            and status not in (204, 304)
        )
        self._state = _BODY

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        if self._state == _BODY:
            self._state = _DONE
            self._reusable = self._parser.should_keep_alive()
