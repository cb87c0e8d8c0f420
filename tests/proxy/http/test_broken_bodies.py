"""Bodies that break: an upstream error body cut short, a request body whose Content-Encoding
lies. Neither may become a 500, and neither is the upstream's connect error."""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import brotli
import orjson
import pytest
from backports import zstd

from tests.fakes.rawhttp import raw_request
from tests.fakes.upstream import FakeUpstream
from tests.proxy.conftest import StartProxy
from tests.proxy.http.test_errors import assert_openai_error

CHAT_BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
PARTIAL = b'{"error": {"message": "context '  # 30 of the 5000 bytes announced


Ending = Callable[[asyncio.StreamWriter], Awaitable[None]]


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()


async def _reset(writer: asyncio.StreamWriter) -> None:
    writer.transport.abort()


async def _silence(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)  # the proxy's read timeout (0.3 s) fires first


class BrokenUpstream:
    """Answers every request `400` with `Content-Length: 5000`, sends 30 bytes, then `ending`."""

    def __init__(self, ending: Ending) -> None:
        self._ending = ending
        self.requests = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        self.requests += 1
        writer.write(
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000\r\n\r\n" + PARTIAL
        )
        await writer.drain()
        await self._ending(writer)


@pytest.fixture
async def broken() -> AsyncIterator[Callable[[Ending], Awaitable[tuple[BrokenUpstream, str]]]]:
    servers: list[asyncio.Server] = []
    fakes: list[BrokenUpstream] = []

    async def start(ending: Ending) -> tuple[BrokenUpstream, str]:
        fake = BrokenUpstream(ending)
        server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
        servers.append(server)
        fakes.append(fake)
        port = server.sockets[0].getsockname()[1]
        return fake, f"http://127.0.0.1:{port}/v1"

    yield start
    for server in servers:
        server.close()
    for fake in fakes:
        for writer in fake.writers:
            writer.transport.abort()


@pytest.mark.parametrize("ending", [_close, _reset, _silence], ids=["close", "reset", "silence"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
async def test_an_upstream_400_whose_body_breaks_is_relayed_as_far_as_it_came(
    start_proxy: StartProxy,
    broken: Callable[..., Awaitable[tuple[BrokenUpstream, str]]],
    ending: Ending,
    path: str,
) -> None:
    fake, base_url = await broken(ending)
    proxy = await start_proxy(upstream={"base_url": base_url, "timeout_s": 0.3})
    status, payload = await raw_request(
        proxy.port, "POST", path, {"Content-Type": "application/json"}, CHAT_BODY
    )
    # The upstream's status and the bytes that arrived; the connection then ends, short of the
    # announced length, so the client knows the body is incomplete. Never our own 500.
    assert status == 400
    assert payload == PARTIAL
    assert fake.requests == 1


def _upstream_connect_errors(metrics_text: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith('compaction_proxy_upstream_errors_total{kind="connect"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


NOT_COMPRESSED = b'{"model": "m", "messages": []} and not compressed at all'


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/s/a/v1/responses", "/v1/messages"])
async def test_a_body_not_in_its_stated_encoding_is_a_400_naming_the_encoding(
    start_proxy: StartProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    encoding: str,
    path: str,
) -> None:
    # The routes that read their body decode it themselves.
    caplog.set_level(logging.WARNING)
    proxy = await start_proxy()
    async with client.post(
        f"{proxy.url}{path}",
        data=NOT_COMPRESSED,
        headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
    ) as response:
        assert response.status == 400
        # The rest of the body is not read: the connection cannot serve on.
        assert response.headers["Connection"] == "close"
        body = await response.read()
    api = "anthropic" if path.endswith("messages") else "openai"
    if api == "openai":
        assert_openai_error(body, "invalid_content_encoding")
        assert encoding in orjson.loads(body)["error"]["message"]
    else:
        assert orjson.loads(body)["error"]["type"] == "invalid_request_error"
    assert upstream.requests == []
    async with client.get(f"{proxy.url}/metrics") as response:
        assert _upstream_connect_errors(await response.text()) == 0
    # The client's error, answered: not a traceback in the server's log.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd", "compress"])
@pytest.mark.parametrize("path", ["/v1/embeddings", "/s/a/v1/files"])
async def test_bodies_the_proxy_only_relays_go_upstream_as_sent_coding_and_all(
    start_proxy: StartProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    encoding: str,
    path: str,
) -> None:
    # One body policy (Content-Encoding travels with the bytes it describes): the proxy never
    # decodes what it does not read, so whether the bytes are in their coding is the
    # upstream's business.
    proxy = await start_proxy()
    async with client.post(
        f"{proxy.url}{path}",
        data=NOT_COMPRESSED,
        headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
    ) as response:
        assert response.status == 200
    sent = upstream.requests[-1]
    assert sent.body == NOT_COMPRESSED
    assert sent.headers["Content-Encoding"] == encoding
    assert sent.headers["Content-Length"] == str(len(NOT_COMPRESSED))


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("br", brotli.compress),
        ("zstd", zstd.compress),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
async def test_bodies_in_every_encoding_go_upstream_byte_for_byte_with_their_coding(
    start_proxy: StartProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    encoding: str,
    compress: Callable[[bytes], bytes],
    path: str,
) -> None:
    # Below the trigger a hooked request is read (decoded) and forwarded unchanged: the
    # client's own bytes, in their coding.
    proxy = await start_proxy()
    sent_body = compress(CHAT_BODY)
    async with client.post(
        f"{proxy.url}{path}",
        data=sent_body,
        headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
    ) as response:
        assert response.status == 200
    assert upstream.requests[-1].body == sent_body
    assert upstream.requests[-1].headers["Content-Encoding"] == encoding


@pytest.mark.parametrize(
    ("path", "route"), [("/v1/chat/completions", "chat"), ("/v1/files", "forward")]
)
async def test_a_client_gone_mid_body_is_a_499_and_the_proxy_serves_on(
    start_proxy: StartProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    path: str,
    route: str,
) -> None:
    proxy = await start_proxy()
    _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n"
    writer.write(head.encode() + b'{"model": "m", "messages": [')  # 28 of 100000 bytes
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.transport.abort()
    expected = f'compaction_proxy_requests_total{{method="POST",route="{route}",status="499"}} 1.0'
    for _ in range(100):  # the proxy learns of the reset a moment later
        async with client.get(f"{proxy.url}/metrics") as response:
            text = await response.text()
        if expected in text:
            break
        await asyncio.sleep(0.02)
    assert expected in text
    assert "compaction_proxy_in_flight_requests 1.0" in text  # only the /metrics request
    # A hooked body is read whole before anything goes upstream: nothing partial was sent.
    assert [r.body for r in upstream.requests if r.path.endswith("chat/completions")] == []
    async with client.post(f"{proxy.url}/v1/chat/completions", data=CHAT_BODY) as response:
        assert response.status == 200
    assert upstream.requests[-1].body == CHAT_BODY
