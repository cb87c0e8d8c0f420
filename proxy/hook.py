"""The seam between forwarding and compaction: what a chat request goes through.

The chat handler reads the whole body, builds a `ChatContext`, and calls the app's
`ChatPipeline`:

1. `prepare(ctx, body)` before anything goes upstream; its `Prepared.body` is what is sent.
2. `on_upstream_error(ctx, prepared, status, body)` only when the upstream answers 400, 413 or 422
   and its error body is at most 1 MiB; returning new bytes makes the handler retry once with
   them, returning None relays the original error unchanged.
3. `on_response(ctx, prepared, status, usage)` after the response was relayed to the client.

The handler fails open around every call: an exception other than a `ProxyError` is logged and
treated as "pass through" (the original body, no retry). The default is the compacting pipeline
(proxy.compacting.hook); tests pass in their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from multidict import CIMultiDictProxy


@dataclass(frozen=True)
class ChatContext:
    """What the pipeline may know about one chat request.

    `credential` is the Authorization value sent upstream (the client's, or the injected
    `upstream.api_key`); key caches by a hash of it and never log it."""

    session_id: str | None
    credential: str | None
    path: str
    headers: CIMultiDictProxy[str]


@dataclass(frozen=True)
class Prepared:
    """The request to send: `body` goes upstream; `headers` are informational headers added to
    the client's response; `session_id` is the resolved session (possibly a fingerprint);
    `wants_usage` asks the handler to find the response's `usage` for `on_response` (a cheap
    probe, skipped when no one wants it)."""

    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    session_id: str | None = None
    wants_usage: bool = False


class ChatPipeline(Protocol):
    async def prepare(self, ctx: ChatContext, body: bytes) -> Prepared: ...

    async def on_upstream_error(
        self, ctx: ChatContext, prepared: Prepared, status: int, body: bytes
    ) -> bytes | None:
        """`body` is the upstream's error body (decompressed if it came gzip/deflate encoded).
        Return a new request body to retry once with, or None to relay the error."""
        ...

    def on_response(
        self, ctx: ChatContext, prepared: Prepared, status: int, usage: dict[str, Any] | None
    ) -> None:
        """`usage` is the response's `usage` object when it was cheap to find, else None."""
        ...
