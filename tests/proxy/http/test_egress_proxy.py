"""Egress as companies run it: with `upstream.trust_env` on, both upstream clients (the wire
client for in-memory bodies, aiohttp for streamed bodies and the proxy's own calls) reach an
https upstream through the HTTP CONNECT proxy that HTTPS_PROXY names, and NO_PROXY still wins."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import trustme
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.http.upstream import Upstream
from proxy.metrics import Metrics
from proxy.settings import UpstreamSettings


@dataclass
class ConnectProxy:
    """An HTTP proxy that only tunnels (CONNECT), as egress proxies do for https."""

    tunnels: list[str] = field(default_factory=list)
    server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        self.tunnels.append(target)
        host, port = target.rsplit(":", 1)
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(
            _pipe(reader, upstream_writer), _pipe(upstream_reader, writer), return_exceptions=True
        )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    finally:
        writer.close()


@dataclass
class Egress:
    proxy: ConnectProxy
    upstream_url: URL
    trusting: ssl.SSLContext


@pytest.fixture
async def egress(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Egress]:
    authority = trustme.CA()
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server_side)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"path": request.path, "body": (await request.read()).decode()})

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "localhost", 0, ssl_context=server_side)
    await site.start()
    port = runner.addresses[0][1]
    proxy = ConnectProxy()
    proxy.server = await asyncio.start_server(proxy.serve, "127.0.0.1", 0)
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    try:
        yield Egress(proxy, URL(f"https://localhost:{port}/v1"), trusting)
    finally:
        proxy.server.close()
        await runner.cleanup()


async def _send_both_ways(upstream: Upstream, base: URL) -> list[bytes]:
    """A request by the wire client (body in memory), one by aiohttp (streamed body) and one
    of the proxy's own calls: what each answered."""

    async def streamed() -> AsyncIterator[bytes]:
        yield b'{"streamed":'
        yield b"true}"

    answers = []
    for data in (b'{"in_memory":true}', streamed()):
        response = await upstream.send(
            "POST", base / "chat/completions", CIMultiDict(), data, route="chat"
        )
        assert response.status == 200
        answers.append((await upstream.read_bounded(response, 1 << 20))[0])
        response.close()
    status, answer = await upstream.post_json(base / "responses", b"{}", {}, timeout_s=5)
    assert status == 200 and answer["path"] == "/v1/responses"
    return answers


async def test_both_clients_reach_an_https_upstream_through_the_environments_proxy(
    egress: Egress,
) -> None:
    settings = UpstreamSettings(base_url=str(egress.upstream_url), trust_env=True)
    async with Upstream(settings, Metrics(), tls=egress.trusting) as upstream:
        answers = await _send_both_ways(upstream, egress.upstream_url)
    assert b"in_memory" in answers[0] and b"streamed" in answers[1]
    origin = f"localhost:{egress.upstream_url.port}"
    # One tunnel for the wire client, one for aiohttp's pooled connection at least.
    assert len(egress.proxy.tunnels) >= 2 and set(egress.proxy.tunnels) == {origin}


async def test_without_trust_env_the_proxy_is_not_used(egress: Egress) -> None:
    settings = UpstreamSettings(base_url=str(egress.upstream_url))
    async with Upstream(settings, Metrics(), tls=egress.trusting) as upstream:
        await _send_both_ways(upstream, egress.upstream_url)
    assert egress.proxy.tunnels == []


async def test_no_proxy_names_an_upstream_that_is_reached_directly(
    egress: Egress, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_PROXY", "localhost")
    settings = UpstreamSettings(base_url=str(egress.upstream_url), trust_env=True)
    async with Upstream(settings, Metrics(), tls=egress.trusting) as upstream:
        await _send_both_ways(upstream, egress.upstream_url)
    assert egress.proxy.tunnels == []
