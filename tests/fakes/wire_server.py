"""A loopback HTTP server whose answers are bytes a test writes (`writes`), for the wire client's
tests: framing, keep-alive and failures exactly as scripted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from yarl import URL

from proxy.http.wire import WireError, WirePool, WireResponse

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
"""Answers the request just read (its index counted over all connections)."""


class Server:
    """Reads each request (head and Content-Length body), lets `answer` write the response;
    counts connections and requests, and keeps each request's bytes."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.closed = 0  # connections the client closed (or this server did)
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> URL:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return URL(f"http://127.0.0.1:{port}/v1/chat/completions?x=1")

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                await self.answer(reader, writer, len(self.requests) - 1)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()


def writes(*parts: bytes, close: bool = False) -> Answer:
    """An answer written in `parts`, each its own write (and read), then kept open or closed."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.001)
        if close:
            writer.close()

    return answer


async def body_of(response: WireResponse) -> bytes:
    parts = []
    while chunk := await response.content.readany():
        parts.append(chunk)
    return b"".join(parts)


async def failure_of(step: Awaitable[object]) -> str:
    """The kind of the WireError that awaiting `step` raises (the test fails if none is)."""
    with pytest.raises(WireError) as failed:
        await step
    return failed.value.kind


async def send(pool: WirePool, server: Server, body: bytes = b"{}") -> WireResponse:
    return await pool.request("POST", server.url, {"Authorization": "Bearer k"}, body)


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
