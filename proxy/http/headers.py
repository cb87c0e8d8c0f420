"""Header forwarding policy, both directions, in one place.

Hop-by-hop headers (RFC 9110 §7.6.1, plus any header the `Connection` header names) describe one
connection and never cross the proxy. `Host` is rewritten by the client library for the upstream.
End-to-end headers pass through, `Authorization` included; `upstream.api_key` is injected only
when the client sent no `Authorization`. `Content-Encoding` always travels with the bytes it
describes, both ways: responses are relayed as the upstream's bytes (compressed or not, header
kept), and request bodies go upstream in the client's coding (its own bytes, or a compacted body
encoded again: proxy.http.bodies).
"""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        # aiohttp's server answers `Expect: 100-continue` itself; forwarding it would make the
        # upstream wait for a second go-ahead that never comes.
        "expect",
    }
)


def _connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> set[str]:
    tokens: set[str] = set()
    for value in headers.getall("Connection", ()):
        tokens.update(token.strip().lower() for token in value.split(",") if token.strip())
    return tokens


def _end_to_end(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], drop: frozenset[str]
) -> CIMultiDict[str]:
    """`headers` without the hop-by-hop ones and `drop`, in their order. Copied whole and the
    few names looked up and deleted (in C), not rebuilt header by header: a client such as the
    OpenAI SDK sends some fifteen headers, and this runs twice per request."""
    kept = CIMultiDict(headers)
    named = _connection_tokens(headers) if "Connection" in headers else ()
    for names in (HOP_BY_HOP, drop, named):
        for name in names:
            if name in kept:
                del kept[name]
    return kept


_REQUEST_DROP = frozenset({"host"})
_REQUEST_DROP_WITH_LENGTH = frozenset({"host", "content-length"})


def upstream_request_headers(
    incoming: CIMultiDictProxy[str], api_key: str | None, *, keep_length: bool
) -> tuple[CIMultiDict[str], str | None]:
    """Headers to send upstream, and the credential they carry (never log it).

    `keep_length=False` drops `Content-Length` so the client library states the length of the
    body actually sent (the chat route may change it)."""
    outgoing = _end_to_end(incoming, _REQUEST_DROP if keep_length else _REQUEST_DROP_WITH_LENGTH)
    credential = outgoing.get("Authorization")
    if credential is None and api_key:
        credential = f"Bearer {api_key}"
        outgoing["Authorization"] = credential
    return outgoing, credential


def client_response_headers(upstream: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The upstream's response headers as the client should see them.

    `Content-Length` stays: the body is relayed byte for byte (compressed bytes included)."""
    return _end_to_end(upstream, frozenset())
