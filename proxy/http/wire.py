"""The HTTP/1.1 client for requests whose body is already in memory (the hooked routes').

aiohttp's client executes some 360k instructions per small request (callgrind: its request and
response objects, a task per body write, a timer per read, tracing hooks), more than half of
what a whole pass-through costs; this one executes about a fifth of that. It does one thing:
send a request with a known body to the one upstream and hand back its response as it arrives.
Streamed request bodies and the proxy's own summary calls keep using aiohttp (upstream.py).

- Connections are kept alive and pooled per origin; an idle one is dropped after `keepalive_s`,
  or as soon as the upstream closes it. A request is never sent twice.
- The head and a small body go out in one write. What the socket has not taken yet stays with
  the transport, and the response is read meanwhile: an upstream may answer (413) before it
  read the whole body.
- The response head is parsed here; the body is framed by Content-Length, the chunked coding
  (decoded, as aiohttp does) or the end of the connection, and is never decompressed. Reading
  pauses while more than `_HIGH_WATER` bytes wait for a slow client.
- Timeouts as aiohttp's `connect` and `sock_read`: connecting, and each wait for bytes.
- Failures are `WireError`s, which upstream.py maps as it maps aiohttp's.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from typing import cast

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

_MAX_HEAD = 64 * 1024
_HIGH_WATER = 512 * 1024
_LOW_WATER = 128 * 1024
_SMALL_BODY = 64 * 1024
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


class WirePool:
    """Keep-alive connections to the upstream's origins, and the requests sent over them."""

    def __init__(
        self, *, connect_timeout_s: float, read_timeout_s: float, keepalive_s: float = 15.0
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._closed = False
        self._tls: ssl.SSLContext | None = None

    async def request(
        self, method: str, url: URL, headers: Mapping[str, str], body: bytes
    ) -> WireResponse:
        """Send the request; return its response once the head arrived (body unread)."""
        if self._closed:
            raise WireError("closed")
        key = (url.scheme, url.raw_host or "", url.port or 0)
        connection = self._take_idle(key) or await self._connect(key)
        response = WireResponse(connection, self, head_only=method == "HEAD")
        connection.response = response
        try:
            connection.send(_head(method, url, headers, len(body)), body)
            await response.wait_head()
        except BaseException:
            response.close()
            raise
        return response

    async def close(self) -> None:
        self._closed = True
        for connection in list(self._open):
            connection.close()
        self._idle.clear()

    def _take_idle(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        too_old = asyncio.get_running_loop().time() - self.keepalive_s
        while idle:
            connection = idle.pop()
            if not connection.closed and connection.idle_since >= too_old:
                return connection
            connection.close()
        return None

    async def _connect(self, key: tuple[str, str, int]) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls = None
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        connection = _Connection(key, self._forget)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await loop.create_connection(lambda: connection, host.strip("[]"), port, ssl=tls)
        except TimeoutError:
            connection.close()
            raise WireError("connect_timeout") from None
        except OSError as exc:
            connection.close()
            raise WireError("connect") from exc
        self._open.add(connection)
        return connection

    def _release(self, connection: _Connection) -> None:
        """A connection whose response was read whole, for the next request."""
        connection.response = None
        if self._closed or connection.closed:
            connection.close()
            return
        connection.idle_since = asyncio.get_running_loop().time()
        self._idle.setdefault(connection.key, []).append(connection)

    def _forget(self, connection: _Connection) -> None:
        self._open.discard(connection)


def _head(method: str, url: URL, headers: Mapping[str, str], length: int) -> bytes:
    lines = [f"{method} {url.raw_path_qs} HTTP/1.1\r\nHost: {url.host_port_subcomponent}\r\n"]
    for name, value in headers.items():
        lines.append(f"{name}: {value}\r\n")
    if "Accept" not in headers:
        lines.append("Accept: */*\r\n")  # what aiohttp adds
    lines.append(f"Content-Length: {length}\r\n\r\n")
    text = "".join(lines)
    # A CR or LF inside a name or value would end the header early (aiohttp refuses it too).
    if text.count("\n") != len(lines) + 2 or text.count("\r") != len(lines) + 2:
        raise ValueError("newline or carriage return in a header sent upstream")
    return text.encode("utf-8", "surrogateescape")


class _Connection(asyncio.Protocol):
    def __init__(self, key: tuple[str, str, int], forget: Callable[[_Connection], None]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.response: WireResponse | None = None
        self.closed = False
        self.idle_since = 0.0
        self._forget = forget

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, head: bytes, body: bytes) -> None:
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            raise WireError("closed")
        if len(body) <= _SMALL_BODY:
            transport.write(head + body)
        else:
            transport.write(head)
            transport.write(body)

    def data_received(self, data: bytes) -> None:
        if self.response is None:
            self.close()  # bytes nobody asked for: the connection cannot be trusted
            return
        self.response.feed(data)

    def eof_received(self) -> bool:
        if self.response is not None:
            self.response.end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._forget(self)
        if self.response is not None:
            self.response.end()

    def reading(self, on: bool) -> None:
        """Read from the socket or not (a slow client: the upstream waits, not our memory)."""
        if self.transport is not None and not self.closed:
            if on:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


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
