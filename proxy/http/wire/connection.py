"""One keep-alive connection of the wire client (an asyncio protocol): it writes a request and
feeds what arrives to the response being read, and `WireError`, every way the exchange over it
can fail. It knows of the response only what it feeds (`Reader`), so it imports nothing else
of the client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

_SMALL_BODY = 64 * 1024


class WireError(Exception):
    """What went wrong: "connect" (no connection), "connect_timeout", "timeout" (no bytes in
    time), "closed" (the connection broke or closed early), "protocol" (not HTTP/1.1)."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"upstream connection: {kind}")
        self.kind = kind


class Reader(Protocol):
    """The response being read off a connection (proxy.http.wire.response.WireResponse)."""

    def feed(self, data: bytes) -> None: ...

    def end(self) -> None: ...


class Connection(asyncio.Protocol):
    def __init__(self, key: tuple[str, str, int], forget: Callable[[Connection], None]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.response: Reader | None = None
        self.closed = False
        self.idle_since = 0.0
        self._forget = forget

    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def sending(self) -> bool:
        return self.transport is not None and self.transport.get_write_buffer_size() > 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, head: bytes, body: bytes) -> None:
        transport = self.transport
        if transport is None or not self.usable():
            raise WireError("closed")
        if len(body) <= _SMALL_BODY:  # one write; a large body is not copied to join it
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
        """Read from the socket or not (a slow client: the upstream waits, not our buffers)."""
        if self.transport is not None and not self.closed:
            if on:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()
