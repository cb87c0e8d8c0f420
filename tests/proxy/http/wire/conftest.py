"""Fixtures of the wire client's tests: scripted loopback servers and a pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy.http.wire import WirePool
from tests.fakes.wire_server import Answer, Server


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Answer) -> Server:
        server = Server(answer)
        server.server = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        servers.append(server.server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
async def pool() -> AsyncIterator[WirePool]:
    wire = WirePool(connect_timeout_s=2, read_timeout_s=0.5)
    yield wire
    await wire.close()
