"""How aiohttp's server serves the proxy (`SERVER_ARGS`, given to every app by create_app, so the
CLI, the tests and the benchmarks all serve it the same way), and serving an aiohttp app on a free
loopback port: the demo, the benchmarks and tests use it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from aiohttp import web

SERVER_ARGS: Mapping[str, Any] = MappingProxyType(
    {
        # Request bodies reach the handlers as sent: the hooked routes decode theirs in bounded
        # steps against server.max_body_mb (proxy.http.bodies), the others relay them untouched.
        # aiohttp's own decoding would go on after a 413, in its drain of the unread body.
        "auto_decompress": False,
    }
)


async def serve_on_loopback(app: web.Application) -> tuple[web.AppRunner, str]:
    """Serve `app` on a free 127.0.0.1 port, as the CLI would; return its runner and base URL."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"
