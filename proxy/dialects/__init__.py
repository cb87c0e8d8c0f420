"""One package per API shape: chat completions (`chat`), the Responses API (`responses`),
Anthropic Messages (`anthropic`); `base` is what they share (the `Dialect` protocol, the payload
types), `payload` how they read and write a body alike.

A `Dialect` is everything the rest of the proxy needs to know about one API: how a request reads
into (payload, list, what else it costs) and serializes back with only the list changed, how its
summary request and answer look, which fields carry its usage. The rest of the proxy works on
any dialect; `for_route` maps the route kind (proxy.interception.RequestContext.route) to one.
"""

from __future__ import annotations

from proxy.dialects.anthropic import ANTHROPIC_MESSAGES
from proxy.dialects.base import Dialect, JsonObject, NotCompactable
from proxy.dialects.chat import CHAT_COMPLETIONS
from proxy.dialects.responses import RESPONSES_API

__all__ = ["Dialect", "JsonObject", "NotCompactable", "for_route"]


_BY_ROUTE: dict[str, Dialect] = {
    "chat": CHAT_COMPLETIONS,
    "responses": RESPONSES_API,
    "messages": ANTHROPIC_MESSAGES,
}


def for_route(route: str) -> Dialect | None:
    """The dialect of a hooked route kind; None for a route no dialect compacts."""
    return _BY_ROUTE.get(route)
