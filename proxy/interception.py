"""How a request on a hooked route is intercepted: the protocol between proxy.http (moving
bytes) and what may change a request (proxy.compacting).

For a route that admits a hook ("chat", "responses", "messages": one per API shape), the handler
reads the whole body, builds a `RequestContext`, and asks the app's `Hook` for an `Exchange`: the
one object that carries what this request needs from then on.

1. `hook.prepare(ctx, body)` before anything goes upstream; `exchange.body` is what is sent,
   `exchange.outcome` is what the hook did (proxy.outcome: the handler renders it into the
   client's response headers and keeps it in the session records), `exchange.session_id` is
   the session the request belongs to (possibly derived from the body), `exchange.wants_usage`
   asks the handler to find the response's `usage` (a cheap probe, skipped when no one wants
   it).
2. `exchange.retry_after_error(status, body)` only when the upstream answers 400, 413 or 422 and
   its error body is at most 1 MiB (decompressed when it came gzip/deflate encoded); new bytes
   make the handler retry once with them, None relays the upstream's error unchanged.
3. `exchange.followup`, when not None, takes the upstream's 200 response before the client
   sees it: it may call the upstream again (proxy.recall answers the model's calls to the tool
   the hook added) and gives what the client receives (`Followed`).
4. `exchange.observe(status, usage)` after the response was relayed to the client.
`exchange.upstream_headers` are set on the request sent upstream (and on a retry and the
follow-up's calls): what the body the hook made needs besides the client's headers.

The handler fails open around every call: an exception other than a `ProxyError` is logged and
treated as "pass through" (the original body, no retry). The default hook is
proxy.compacting.hook.CompactingHook; tests pass in their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple, Protocol

from multidict import CIMultiDictProxy

from proxy.outcome import Outcome, RecallFigures

_NO_HEADERS: Mapping[str, str] = MappingProxyType({})

Usage = dict[str, object]
"""A response's `usage` object as the upstream sent it (its fields differ by API)."""


class RequestContext(NamedTuple):
    """What a hook may know about one request besides its body (a NamedTuple: built for every
    request, and a frozen dataclass takes four times as long to build).

    `route` is the kind of route ("chat", "responses", "messages"): the request's API shape.
    `explicit_session` is the session the client named (header or path), None if it named none.
    `credential` is the Authorization value sent upstream (the client's, or the injected
    `upstream.api_key`); key caches by a hash of it and never log it. `query` is the raw query
    string sent upstream (Azure OpenAI's `api-version`): the proxy's own calls carry it too."""

    route: str
    explicit_session: str | None
    credential: str | None
    path: str
    headers: CIMultiDictProxy[str]
    query: str = ""


class Exchange(Protocol):
    """One request's dealings with its hook, from the body to send to the response seen."""

    @property
    def body(self) -> bytes: ...

    @property
    def outcome(self) -> Outcome | None:
        """What the hook did with the request (None: nothing to tell)."""
        ...

    @property
    def session_id(self) -> str | None: ...

    @property
    def wants_usage(self) -> bool: ...

    @property
    def upstream_headers(self) -> Mapping[str, str]:
        """Headers the body sent upstream needs besides the client's (a beta the proxy's own
        compaction block needs); read again after a retry."""
        ...

    @property
    def followup(self) -> Followup | None:
        """What takes the upstream's 200 response before the client (None: it is relayed)."""
        ...

    async def retry_after_error(self, status: int, body: bytes) -> bytes | None:
        """A new request body to retry once with after the upstream's error `body`, or None."""
        ...

    def observe(self, status: int, usage: Usage | None) -> None:
        """`usage` is the response's `usage` object when it was cheap to find, else None."""
        ...


class Body(Protocol):
    async def readany(self) -> bytes: ...


class Response(Protocol):
    """An upstream response as the relay and a followup read it: aiohttp's ClientResponse or
    the wire client's (proxy.http.upstream)."""

    @property
    def status(self) -> int: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def headers(self) -> CIMultiDictProxy[str]: ...
    @property
    def content(self) -> Body: ...
    def release(self) -> object: ...
    def close(self) -> None: ...


class Resend(Protocol):
    """The upstream as a followup reaches it: the request's URL and headers, another body."""

    async def send(self, body: bytes) -> Response: ...

    def chunks(self, response: Response) -> AsyncIterable[bytes]: ...

    async def read(self, response: Response) -> bytes:
        """The whole body, decoded (UpstreamStreamCut or ProxyError when it fails)."""
        ...


@dataclass
class Followed:
    """What the client receives after a followup: `response`'s status and headers (those it
    says are stale, Content-Length and Content-Encoding, are left out when `rewritten`), the
    body from `chunks`, and the `recall` rounds it answered (told in the headers when known
    before the body; a stream's are set once it is over, for the session records). `usage` is
    the first response's (calibration reads what the upstream counted of the request the hook
    sent). `length`: a rewritten body's length when the followup has it whole (the client gets
    it as Content-Length; None: sent chunked)."""

    response: Response
    chunks: AsyncIterable[bytes]
    rewritten: bool
    recall: RecallFigures | None = None
    usage: Usage | None = None
    length: int | None = None


class Followup(Protocol):
    async def follow(self, first: Response, upstream: Resend) -> Followed: ...


class Hook(Protocol):
    async def prepare(self, ctx: RequestContext, body: bytes) -> Exchange: ...


@dataclass(slots=True)
class Passthrough:
    """An exchange that changes nothing: `body` goes upstream as received, errors are relayed.
    (Not frozen: one is built for every request, and a frozen dataclass takes three times as
    long to build.)"""

    body: bytes
    session_id: str | None = None
    outcome: Outcome | None = None
    wants_usage: bool = False
    followup: Followup | None = None

    @property
    def upstream_headers(self) -> Mapping[str, str]:
        return _NO_HEADERS

    async def retry_after_error(self, status: int, body: bytes) -> bytes | None:
        return None

    def observe(self, status: int, usage: Usage | None) -> None:
        return None
