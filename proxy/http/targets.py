"""Where a request goes upstream: a URL built from a configured base and a validated path tail
only, so nothing a client sends can point the proxy at another host; `/v1/messages` and all
under it (Anthropic's Messages API) are told apart from the rest."""

from __future__ import annotations

import functools
import re
from urllib.parse import unquote

from yarl import URL

from proxy.errors import InvalidPath

_SCHEME_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_FORBIDDEN_CHARS = re.compile(r"[\\@#\s\x00-\x1f\x7f]")


def is_anthropic_tail(raw_tail: str) -> bool:
    """True for the path tails of Anthropic's Messages API: `messages` and all under it, also
    when percent-encoded (`%6Dessages`): the server routes by the decoded path, so the upstream
    and its credential must be chosen by it too, or an Anthropic request would go to `base_url`
    and be handed `upstream.api_key`."""
    tail = unquote(raw_tail) if "%" in raw_tail else raw_tail
    return tail == "messages" or tail.startswith(("messages/", "messages?"))


@functools.lru_cache(maxsize=1024)  # the same few paths come again and again
def build_url(base_text: str, raw_tail: str, raw_query: str) -> URL:
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
