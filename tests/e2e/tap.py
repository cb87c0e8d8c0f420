"""A loopback tap between a real client and the proxy: every request passed on as it came (method,
target, headers, body bytes), every answer streamed back, and each exchange kept, so a test can
compare what the client sent with what reached the upstream, and count WebSocket upgrades."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.http.serving import serve_on_loopback

# Set by aiohttp for each hop; the client's own Upgrade and Connection go on as sent.
_HOP = ("host", "content-length", "transfer-encoding")


@dataclass
class Exchange:
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    status: int = 0

    @property
    def is_upgrade(self) -> bool:
        return "websocket" in self.headers.get("Upgrade", "").lower()

    @property
    def body(self) -> dict[str, Any]:
        parsed = orjson.loads(self.raw) if self.raw else {}
        return parsed if isinstance(parsed, dict) else {}


@dataclass
class Tap:
    target: str
    """The proxy's root URL."""
    exchanges: list[Exchange] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None
    _http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Tap:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._pass)
        self._http = aiohttp.ClientSession(auto_decompress=False)
        self._runner, self.url = await serve_on_loopback(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _pass(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        raw = await request.read()
        exchange = Exchange(
            request.method, request.path, {str(k): v for k, v in request.headers.items()}, raw
        )
        self.exchanges.append(exchange)
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in _HOP)
        async with self._http.request(
            request.method,
            f"{self.target}{request.rel_url}",
            headers=headers,
            data=raw or None,
            allow_redirects=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
        ) as answer:
            exchange.status = answer.status
            passed = CIMultiDict(
                (k, v) for k, v in answer.headers.items() if k.lower() not in (*_HOP, "connection")
            )
            response = web.StreamResponse(status=answer.status, headers=passed)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
