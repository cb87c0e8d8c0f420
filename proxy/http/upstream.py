"""The connection to the one configured upstream, and the only place its client errors are
caught (`raise_mapped`, for every call: the agents' requests, the bodies relayed, the proxy's
own summary calls through `upstream_errors`): before the response headers they become
`UpstreamUnreachable` (502) or `UpstreamTimeout` (504); while a body is read they become
`UpstreamStreamCut`. A request whose body was read whole goes by the wire client
(proxy.http.wire); a streamed one, and the proxy's own calls, by aiohttp's.

URLs come from proxy.http.targets: `/v1/messages` and everything under it (Anthropic's Messages
API) go to `upstream.anthropic_base_url`, every other path to `upstream.base_url`.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Callable, Mapping
from typing import NoReturn

import aiohttp
import orjson
from multidict import CIMultiDict
from yarl import URL

from proxy.errors import (
    ProxyError,
    UpstreamRefusedWebSocket,
    UpstreamStreamCut,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from proxy.http.bodies import RequestBody
from proxy.http.egress import open_clients
from proxy.http.encodings import decode_body
from proxy.http.targets import build_url, is_anthropic_tail
from proxy.http.wire import WireError, WirePool

# The response protocols live beside the hook's (a followup reads upstream responses too).
from proxy.interception import Body as Body
from proxy.interception import Response as Response
from proxy.metrics import Metrics
from proxy.settings import UpstreamSettings


class Upstream:
    """The one configured upstream: its URLs, its pooled ClientSession (opened by `open()` once
    the loop runs, see app.create_app), and every call made to it, the proxy's own included."""

    def __init__(
        self, settings: UpstreamSettings, metrics: Metrics, *, tls: ssl.SSLContext | None = None
    ) -> None:
        """`tls`: how https origins are verified (default: the system's CAs)."""
        self._settings = settings
        self._base_text = str(URL(settings.base_url.rstrip("/")))
        self._anthropic_text = str(URL(settings.anthropic_base_url.rstrip("/")))
        self._metrics = metrics
        self._tls = tls
        self._session: aiohttp.ClientSession | None = None
        self._wire: WirePool | None = None
        self._proxied: frozenset[str] = frozenset()

    async def open(self) -> None:
        bases = (self._base_text, self._anthropic_text)
        self._session, self._wire, self._proxied = open_clients(self._settings, bases, self._tls)

    async def close(self) -> None:
        if self._wire is not None:
            await self._wire.close()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> Upstream:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the upstream is used before the app started")
        return self._session

    def url_for(self, raw_tail: str, raw_query: str = "") -> URL:
        """`{base}/{raw_tail}?{raw_query}`, or InvalidPath if the tail tries to leave it; the
        base is `anthropic_base_url` for Anthropic's paths, else `base_url`."""
        base = self._anthropic_text if is_anthropic_tail(raw_tail) else self._base_text
        return build_url(base, raw_tail, raw_query)

    def api_key_for(self, raw_tail: str, headers: Mapping[str, str]) -> str | None:
        """`upstream.api_key` is a key of `base_url`: never sent to Anthropic, nor added to a
        request that speaks Anthropic's API (`x-api-key`, `anthropic-version`: an Anthropic SDK
        calling /v1/models or /v1/files, which go to `base_url`), whose own key is its own."""
        if is_anthropic_tail(raw_tail) or "x-api-key" in headers or "anthropic-version" in headers:
            return None
        return self._settings.api_key

    async def send(
        self,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        data: RequestBody,
        *,
        route: str,
    ) -> Response:
        """Send one request; return the response once its headers arrived (body unread). A
        body read whole goes by the wire client (proxy.http.wire), a streamed one by aiohttp."""
        started = time.perf_counter()
        try:
            response: Response
            # The wire client tunnels to https origins (CONNECT); a plain http origin behind
            # the environment's proxy (upstream.trust_env) goes by aiohttp, which forwards it.
            if isinstance(data, bytes) and url.host not in self._proxied:
                if self._wire is None:
                    raise RuntimeError("the upstream is used before the app started")
                response = await self._wire.request(method, url, headers, data)
            else:
                response = await self.session.request(
                    method, url, headers=headers, data=data, allow_redirects=False
                )
        except _CLIENT_ERRORS as exc:
            raise_mapped(exc, reading_body=False, count=self._count)
        self._metrics.requests.observe_upstream_latency(route, time.perf_counter() - started)
        return response

    async def open_websocket(
        self, url: URL, headers: CIMultiDict[str], protocols: tuple[str, ...], max_msg_size: int
    ) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket to `url` (proxy.http.websocket relays one), its handshake carrying
        `headers` and offering `protocols`; UpstreamRefusedWebSocket when the upstream answers
        without upgrading."""
        try:
            return await self.session.ws_connect(
                url, headers=headers, protocols=protocols, max_msg_size=max_msg_size
            )
        except aiohttp.WSServerHandshakeError as exc:
            raise UpstreamRefusedWebSocket(exc.status) from exc
        except _CLIENT_ERRORS as exc:
            raise_mapped(exc, reading_body=False, count=self._count)

    def chunks(self, response: Response) -> BodyChunks:
        """`response`'s body as it arrives (see BodyChunks)."""
        return BodyChunks(response, self._count)

    async def read_bounded(self, response: Response, limit: int) -> tuple[bytes, bool]:
        """Up to about `limit` bytes of the body, and whether that was all of it.
        UpstreamStreamCut carries the bytes read before the body broke off (`partial`)."""
        parts: list[bytes] = []
        size = 0
        try:
            async for chunk in self.chunks(response):
                parts.append(chunk)
                size += len(chunk)
                if size > limit:
                    return b"".join(parts), False
        except UpstreamStreamCut as cut:
            raise UpstreamStreamCut(cut.kind, partial=b"".join(parts)) from cut
        return b"".join(parts), True

    async def post_json(
        self, url: URL, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, object]:
        """One request the proxy makes on its own behalf (a summary): POST `body`, wait at most
        `timeout_s` in total, return the status and the parsed JSON answer (None if it is not
        JSON). Raises what `upstream_errors` maps to; the caller decides what a failure means.
        Not counted in the upstream error metric, which describes the agents' requests."""
        async with contextlib.AsyncExitStack() as stack:
            with upstream_errors(reading_body=False):
                response = await stack.enter_async_context(
                    self.session.post(
                        url,
                        data=body,
                        headers=headers,
                        allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=timeout_s),
                    )
                )
            with upstream_errors(reading_body=True):
                raw = await response.read()
        decoded = decode_body(raw, response.headers.get("Content-Encoding", ""))
        try:
            return response.status, orjson.loads(decoded) if decoded else None
        except orjson.JSONDecodeError:
            return response.status, None

    def _count(self, kind: str) -> None:
        self._metrics.upstream_errors.labels(kind).inc()


class upstream_errors:
    """The one exception map for every upstream call: aiohttp client errors (and timeouts,
    and connection errors) raised inside become ours, `raise ... from` the original.

    Before the response headers: a failed or timed-out connect is UpstreamUnreachable (502), no
    answer in time is UpstreamTimeout (504), anything else UpstreamUnreachable. While a body is
    read: UpstreamStreamCut, "stream_timeout" or "stream_cut". `count` gets the kind. A ProxyError
    that caused the client error (our refusal of a body we were streaming) is raised as is.

    For the proxy's own calls; the agents' requests and relayed chunks catch the same errors
    in a plain `except` and call `raise_mapped`."""

    __slots__ = ("_count", "_reading_body")

    def __init__(self, *, reading_body: bool, count: Callable[[str], None] | None = None) -> None:
        self._reading_body = reading_body
        self._count = count

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, _CLIENT_ERRORS):
            raise_mapped(exc, reading_body=self._reading_body, count=self._count)


_CLIENT_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError, WireError)


def raise_mapped(
    exc: BaseException, *, reading_body: bool, count: Callable[[str], None] | None
) -> NoReturn:
    """Raise what `exc`, one of the client errors, is for us (see `upstream_errors`). The hot
    calls (one request sent, each chunk relayed) use it in a plain `except`: a `with` costs
    three calls each time, error or not."""
    if isinstance(exc.__cause__, ProxyError):
        # Our own refusal of the request body being streamed (too large, undecodable),
        # wrapped by the client library's body writer: the client's error, not the upstream's.
        raise exc.__cause__ from None
    name, error = _translate(exc, reading_body=reading_body)
    if count is not None:
        count(name)
    raise error from exc


def _translate(exc: BaseException, *, reading_body: bool) -> tuple[str, Exception]:
    kind = exc.kind if isinstance(exc, WireError) else _kind_of(exc)
    if reading_body:
        cut = "stream_timeout" if kind == "timeout" else "stream_cut"
        return cut, UpstreamStreamCut(cut)
    if kind == "timeout":
        return "timeout", UpstreamTimeout("the upstream did not answer in time")
    return "connect", UpstreamUnreachable(_BEFORE_ANSWER.get(kind, _FAILED))


_BEFORE_ANSWER = {
    "connect_timeout": "timed out connecting to the upstream",
    "connect": "cannot connect to the upstream",
}
_FAILED = "the upstream failed before answering"


def _kind_of(exc: BaseException) -> str:
    """An aiohttp client error as one of the wire client's kinds (proxy.http.wire.WireError)."""
    # ConnectionTimeoutError is also a TimeoutError: the connect failed, nothing was asked yet.
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect_timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    return "timeout" if isinstance(exc, TimeoutError) else "closed"


class BodyChunks:
    """The response body as it arrives, chunk by chunk (`readany`, no re-chunking);
    UpstreamStreamCut if the upstream fails before the body is complete.

    A plain async iterator, not a generator, so a consumer that stops early leaves nothing
    suspended behind it."""

    def __init__(self, response: Response, count: Callable[[str], None] | None = None) -> None:
        self._content = response.content
        self._count = count

    def __aiter__(self) -> BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._content.readany()
        except _CLIENT_ERRORS as exc:
            raise_mapped(exc, reading_body=True, count=self._count)
        if not chunk:
            raise StopAsyncIteration
        return chunk
