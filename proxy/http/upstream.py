"""The connection to the one configured upstream, and the only place aiohttp client errors are
caught: before the response headers they become `UpstreamUnreachable` (502) or
`UpstreamTimeout` (504); while a body is read they become `UpstreamStreamCut`.

URLs are built from `upstream.base_url` and a validated path tail only, so nothing a client
sends can point the proxy at another host.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any
from urllib.parse import unquote

import aiohttp
import orjson
from multidict import CIMultiDict
from yarl import URL

from proxy.errors import (
    InvalidPath,
    UpstreamStreamCut,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from proxy.http.encodings import decode_body
from proxy.metrics import Metrics
from proxy.settings import UpstreamSettings

_SCHEME_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_FORBIDDEN_CHARS = re.compile(r"[\\@#\s\x00-\x1f\x7f]")


def open_session(settings: UpstreamSettings) -> aiohttp.ClientSession:
    """The app's one ClientSession: pooled, no total timeout (streams may run long), a connect
    timeout and a per-read timeout, bodies left compressed, no cookies kept across clients, no
    redirects followed (a redirect is the upstream's answer and goes back to the client)."""
    return aiohttp.ClientSession(
        # limit=0: no cap of our own on concurrent upstream connections; a cap here would queue
        # long-running streams of unrelated clients behind each other.
        connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=False),
        timeout=aiohttp.ClientTimeout(
            total=None, connect=settings.connect_timeout_s, sock_read=settings.timeout_s
        ),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        # Transparency: send exactly the client's headers (no added User-Agent/Accept-Encoding).
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
    )


class Upstream:
    def __init__(self, session: aiohttp.ClientSession, base_url: str, metrics: Metrics) -> None:
        self.session = session
        self._base = URL(base_url.rstrip("/"))
        self._base_text = str(self._base)
        self._metrics = metrics

    def url_for(self, raw_tail: str, raw_query: str) -> URL:
        """`{base_url}/{raw_tail}?{raw_query}`, or InvalidPath if the tail tries to leave it."""
        return _build_url(self._base_text, raw_tail, raw_query)

    async def send(
        self,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        data: Any,
        *,
        route: str,
    ) -> aiohttp.ClientResponse:
        """Send one request; return the response once its headers arrived (body unread)."""
        started = time.perf_counter()
        try:
            response = await self.session.request(
                method, url, headers=headers, data=data, allow_redirects=False
            )
        except aiohttp.ConnectionTimeoutError as exc:
            self._metrics.upstream_errors.labels("connect").inc()
            raise UpstreamUnreachable("timed out connecting to the upstream") from exc
        except aiohttp.ClientConnectorError as exc:
            self._metrics.upstream_errors.labels("connect").inc()
            raise UpstreamUnreachable("cannot connect to the upstream") from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            self._metrics.upstream_errors.labels("timeout").inc()
            raise UpstreamTimeout("the upstream did not answer within the read timeout") from exc
        except aiohttp.ClientError as exc:
            self._metrics.upstream_errors.labels("connect").inc()
            raise UpstreamUnreachable("the upstream failed before answering") from exc
        self._metrics.labelled(self._metrics.upstream_latency, route).observe(
            time.perf_counter() - started
        )
        return response


@functools.lru_cache(maxsize=1024)  # the same few paths come again and again
def _build_url(base_text: str, raw_tail: str, raw_query: str) -> URL:
    check_tail(raw_tail)
    text = f"{base_text}/{raw_tail}"
    if raw_query:
        text = f"{text}?{raw_query}"
    url = URL(text, encoded=True)
    base = URL(base_text, encoded=True)
    if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
        raise InvalidPath("the path does not stay on the upstream")
    return url


def check_tail(raw_tail: str) -> None:
    """Refuse a path tail that could resolve outside `upstream.base_url` once forwarded: dot
    segments, empty segments, a scheme, an authority (`@`), backslashes, control characters,
    also when percent-encoded."""
    for text in (raw_tail, unquote(raw_tail)) if "%" in raw_tail else (raw_tail,):
        if _FORBIDDEN_CHARS.search(text) or "//" in f"/{text}" or _SCHEME_LIKE.match(text):
            raise InvalidPath("invalid path: it must be a plain relative path under /v1/")
        if any(segment in (".", "..") for segment in text.split("/")):
            raise InvalidPath("invalid path: dot segments are not allowed")


class BodyChunks:
    """The response body as it arrives, chunk by chunk (`readany`, no re-chunking);
    UpstreamStreamCut if the upstream fails before the body is complete.

    A plain async iterator, not a generator, so a consumer that stops early leaves nothing
    suspended behind it."""

    def __init__(self, response: aiohttp.ClientResponse, metrics: Metrics) -> None:
        self._content = response.content
        self._metrics = metrics

    def __aiter__(self) -> BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._content.readany()
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            self._metrics.upstream_errors.labels("stream_timeout").inc()
            raise UpstreamStreamCut("stream_timeout") from exc
        except (aiohttp.ClientError, ConnectionError) as exc:
            self._metrics.upstream_errors.labels("stream_cut").inc()
            raise UpstreamStreamCut("stream_cut") from exc
        if not chunk:
            raise StopAsyncIteration
        return chunk


async def read_bounded(
    response: aiohttp.ClientResponse, limit: int, metrics: Metrics
) -> tuple[bytes, bool]:
    """Up to about `limit` bytes of the body, and whether that was all of it."""
    parts: list[bytes] = []
    size = 0
    async for chunk in BodyChunks(response, metrics):
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(parts), False
    return b"".join(parts), True


async def post_json(
    session: aiohttp.ClientSession,
    url: str | URL,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
) -> tuple[int, Any]:
    """One request the proxy makes on its own behalf (a summary): POST `body`, wait at most
    `timeout_s` in total, return the status and the parsed JSON answer (None if it is not JSON).

    Raises UpstreamUnreachable or UpstreamTimeout; the caller decides what a failure means."""
    try:
        async with session.post(
            url,
            data=body,
            headers=headers,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            raw = await response.read()
            encoding = response.headers.get("Content-Encoding", "")
            status = response.status
    except aiohttp.ClientConnectorError as exc:
        raise UpstreamUnreachable("cannot connect to the upstream") from exc
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise UpstreamTimeout(f"no complete answer within {timeout_s} s") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamUnreachable("the upstream failed before answering") from exc
    decoded = decode_body(raw, encoding)
    try:
        return status, orjson.loads(decoded) if decoded else None
    except orjson.JSONDecodeError:
        return status, None
