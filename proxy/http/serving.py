"""How aiohttp's server serves the proxy (`SERVER_ARGS`, given to every app by create_app, so the
CLI, the tests and the benchmarks all serve it the same way), and serving an aiohttp app on a free
loopback port: the demo, the benchmarks and tests use it.

Header fields: aiohttp's parser refuses one past 8190 bytes with a plain-text 400 and logs an
ERROR whose traceback quotes the field's start (an API key, an admin token). The parser's bound
is raised to `PARSED_FIELD_BYTES`, so that a field past `MAX_FIELD_BYTES` (aiohttp's 8190, the
limit clients meet) reaches the middleware, which answers 431 in the API's error shape; a
request the parser still refuses (a field past the raised bound, a request line past 8190, a
malformed message) is logged by `ServerLog` as one line that quotes nothing of it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

MAX_FIELD_BYTES = 8190
"""The largest header field name or value a request may carry: 431 beyond."""

PARSED_FIELD_BYTES = 64 * 1024
"""How far aiohttp's parser reads a header field (128 fields at most: 8 MiB of headers)."""


class ServerLog:
    """aiohttp's server logger (`aiohttp.server`) as its request handler uses it (`debug`,
    `exception`), except that a request its parser refused is one warning naming the error's
    kind and status: the error's text, and its traceback's, quote the request's bytes."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def debug(self, msg: str, *args: object, **kwargs: Any) -> None:
        # aiohttp says at debug level what is noise on a public port (TLS or garbage sent to
        # plain HTTP): it stays at that level.
        if not self._said_refusal(logging.DEBUG, kwargs):
            self._logger.debug(msg, *args, **kwargs)

    def exception(self, msg: str, *args: object, **kwargs: Any) -> None:
        if not self._said_refusal(logging.WARNING, kwargs):
            self._logger.exception(msg, *args, **kwargs)

    def _said_refusal(self, level: int, kwargs: Mapping[str, Any]) -> bool:
        error = kwargs.get("exc_info")
        if not isinstance(error, HttpProcessingError):
            return False
        self._logger.log(
            level,
            "refused a request the HTTP parser could not read",
            extra={"error": type(error).__name__, "status": error.code},
        )
        return True


SERVER_ARGS: Mapping[str, Any] = MappingProxyType(
    {
        # Request bodies reach the handlers as sent: the hooked routes decode theirs in bounded
        # steps against server.max_body_mb (proxy.http.bodies), the others relay them untouched.
        # aiohttp's own decoding would go on after a 413, in its drain of the unread body.
        "auto_decompress": False,
        "max_field_size": PARSED_FIELD_BYTES,
        "logger": ServerLog(logging.getLogger("aiohttp.server")),
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
