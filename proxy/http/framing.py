"""One HTTP/1.1 response as the wire client (proxy.http.wire) reads it off its connection: the
head parsed, the body framed by Content-Length, the chunked coding (decoded) or the end of the
connection, never decompressed, and handed out as it arrives (`content.readany()`, as aiohttp's
ClientResponse does). Reading pauses while more than `_HIGH_WATER` bytes wait for a slow client.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from typing import TYPE_CHECKING

from multidict import CIMultiDict, CIMultiDictProxy

if TYPE_CHECKING:
    from proxy.http.wire import WirePool, _Connection

_MAX_HEAD = 64 * 1024
_HIGH_WATER = 512 * 1024
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) (\d{3})(?: ([^\r\n]*))?")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?")
_NO_BODY = frozenset({204, 304})
_HEAD, _LENGTH, _CHUNK_LINE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _TO_CLOSE, _DONE = range(8)


class WireError(Exception):
    """What went wrong: "connect" (no connection), "connect_timeout", "timeout" (no bytes in
    time), "closed" (the connection broke or closed early), "protocol" (not HTTP/1.1)."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"upstream connection: {kind}")
        self.kind = kind


class WireResponse:
    """One response: `status`, `reason`, `headers` once the head arrived, then the body through
    `content.readany()` (b"" at its end), as aiohttp's ClientResponse offers them."""

    status: int
    reason: str | None
    headers: CIMultiDictProxy[str]

    def __init__(self, connection: _Connection, pool: WirePool, *, head_only: bool) -> None:
        self._connection = connection
        self._pool = pool
        self._head_only = head_only
        self._state = _HEAD
        self._pending = bytearray()  # bytes of the head, a chunk-size line or trailers
        self._remaining = 0  # of the Content-Length body, or of the current chunk
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
            self._pool._release(self._connection)
        else:
            self.close()

    def close(self) -> None:
        """Drop the connection (what tells the upstream to stop generating)."""
        if self._settled:
            return
        self._settled = True
        self._connection.response = None
        self._connection.close()
        self._pool._forget(self._connection)
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
        try:
            self._feed(data)
        except WireError as exc:
            self._fail(exc.kind)
            self._connection.close()
            return
        if self._chunks or self._state != _HEAD:
            self._wake()
        if self._buffered > _HIGH_WATER and not self._paused:
            self._paused = True
            self._connection.reading(False)

    def end(self) -> None:
        """The connection ended: the end of a body read to the close, else a failure."""
        if self._state == _TO_CLOSE:
            self._state = _DONE
            self._wake()
        else:
            self._fail("closed")

    def _feed(self, data: bytes) -> None:
        state = self._state
        if state == _LENGTH:
            self._take_length(data)
        elif state == _TO_CLOSE:
            self._add(data)
        elif state == _HEAD:
            self._pending += data
            self._read_head()
        elif state == _DONE:
            self._reusable = False  # bytes past the end: this connection is not reused
        else:
            self._read_chunked(data)

    def _add(self, data: bytes) -> None:
        if data:
            self._chunks.append(data)
            self._buffered += len(data)

    def _take_length(self, data: bytes) -> None:
        if len(data) >= self._remaining:
            if len(data) > self._remaining:
                self._reusable = False
            self._add(data[: self._remaining] if len(data) > self._remaining else data)
            self._remaining = 0
            self._state = _DONE
        else:
            self._add(data)
            self._remaining -= len(data)

    def _read_head(self) -> None:
        while self._state == _HEAD:
            end = self._pending.find(b"\r\n\r\n")
            if end < 0:
                if len(self._pending) > _MAX_HEAD:
                    raise WireError("protocol")
                return
            head = bytes(self._pending[:end])
            rest = bytes(self._pending[end + 4 :])
            self._pending.clear()
            lines = head.split(b"\r\n")
            status_line = _STATUS_LINE.fullmatch(lines[0])
            if status_line is None:
                raise WireError("protocol")
            status = int(status_line.group(2))
            if 100 <= status < 200:  # informational (100 Continue, 103 Early Hints): skipped
                self._pending += rest
                continue
            self.status = status
            self.reason = (status_line.group(3) or b"").decode("latin-1")
            self.headers = CIMultiDictProxy(_parse_headers(lines[1:]))
            self._frame(status, keep_alive=status_line.group(1) == b"1")
            if rest:
                self._feed(rest)

    def _frame(self, status: int, *, keep_alive: bool) -> None:
        headers = self.headers
        connection = headers.get("Connection", "").lower()
        self._reusable = keep_alive and "close" not in connection
        if self._head_only or status in _NO_BODY:
            self._state = _DONE
            return
        coding = headers.get("Transfer-Encoding")
        if coding is not None:
            if coding.rsplit(",", 1)[-1].strip().lower() == "chunked":
                self._state = _CHUNK_LINE
            else:
                self._state, self._reusable = _TO_CLOSE, False
            return
        lengths = set(headers.getall("Content-Length", ()))
        if not lengths:
            self._state, self._reusable = _TO_CLOSE, False
            return
        if len(lengths) != 1 or not (length := lengths.pop().strip()).isdigit():
            raise WireError("protocol")
        self._remaining = int(length)
        self._state = _LENGTH if self._remaining else _DONE

    def _read_chunked(self, data: bytes) -> None:
        """The chunked coding, decoded: size line, data, CRLF, ... a zero size, trailers."""
        at = 0
        while at < len(data):
            state = self._state
            if state == _CHUNK_DATA:
                size = min(self._remaining, len(data) - at)
                self._add(data[at : at + size])
                at += size
                self._remaining -= size
                if not self._remaining:
                    self._state = _CHUNK_END
                continue
            if state == _DONE:
                self._reusable = False  # bytes past the end
                return
            # A line: a chunk size, the CRLF after a chunk's data, or a trailer.
            if self._pending:  # a line split between reads (rare): joined first
                self._pending += data[at:]
                end = self._pending.find(b"\r\n")
                if end < 0:
                    break
                line = bytes(self._pending[:end])
                data, at = bytes(self._pending[end + 2 :]), 0
                self._pending.clear()
            else:
                end = data.find(b"\r\n", at)
                if end < 0:
                    self._pending += data[at:]
                    break
                line, at = data[at:end], end + 2
            if state == _CHUNK_END:
                if line:
                    raise WireError("protocol")
                self._state = _CHUNK_LINE
            elif state == _CHUNK_LINE:
                found = _CHUNK_SIZE.fullmatch(line)
                if found is None:
                    raise WireError("protocol")
                self._remaining = int(found.group(1), 16)
                self._state = _CHUNK_DATA if self._remaining else _TRAILER
            elif not line:  # the empty line that ends the trailers
                self._state = _DONE
                if at < len(data):
                    self._reusable = False
                return
        if len(self._pending) > _MAX_HEAD:
            raise WireError("protocol")


def _parse_headers(lines: list[bytes]) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise WireError("protocol")  # no name, or an obsolete folded line
        headers.add(name.decode("latin-1"), value.strip(b" \t").decode("utf-8", "surrogateescape"))
    return headers
