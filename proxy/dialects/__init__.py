"""One package per API shape: chat completions (`chat`), the Responses API (`responses`),
Anthropic Messages (`anthropic`), each owning everything that knows its wire: parsing and
rendering a request, its summary request and answer, its identity and usage fields, the shape of
a tool the proxy answers itself and how a response calls it (whole or streamed), its error
shape, and its provider's rules. What they share: `base` (the `Dialect` protocol and the types
it speaks in), `payload` (reading and writing a body alike), `splice` (one field replaced in a
body's bytes), `naming` (the clients' names for their conversations), `events` (server-sent
events), `usage`.

The rest of the proxy works on any dialect, obtained once per request through `for_route` (the
route kind, proxy.interception.RequestContext.route), and never names a wire field of one API.
"""

from __future__ import annotations

from proxy.dialects.anthropic import ANTHROPIC_MESSAGES
from proxy.dialects.base import (
    Call,
    Calls,
    Dialect,
    JsonObject,
    NotCompactable,
    StreamedTurn,
    Turns,
)
from proxy.dialects.chat import CHAT_COMPLETIONS
from proxy.dialects.events import read_events
from proxy.dialects.payload import declared_names, is_injected, tool_names
from proxy.dialects.responses import RESPONSES_API
from proxy.dialects.usage import add_usage, find_usage

__all__ = [
    "Call",
    "Calls",
    "Dialect",
    "JsonObject",
    "NotCompactable",
    "StreamedTurn",
    "Turns",
    "add_usage",
    "declared_names",
    "for_route",
    "is_injected",
    "read_events",
    "tool_names",
    "usage_of",
]


_BY_ROUTE: dict[str, Dialect] = {
    "chat": CHAT_COMPLETIONS,
    "responses": RESPONSES_API,
    "messages": ANTHROPIC_MESSAGES,
}
_USAGE_HOLDERS = tuple(
    dialect.usage_holder for dialect in _BY_ROUTE.values() if dialect.usage_holder is not None
)


def for_route(route: str) -> Dialect | None:
    """The dialect of a hooked route kind; None for a route no dialect compacts."""
    return _BY_ROUTE.get(route)


def usage_of(document: object) -> dict[str, object] | None:
    """The `usage` of a response document or of one of its stream's events, in any dialect
    (a probe that watches the bytes of any route does not know which)."""
    return find_usage(document, _USAGE_HOLDERS)
