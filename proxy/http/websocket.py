"""WebSocket upgrades on the forwarded routes. Codex opens `GET /v1/responses` with
`Upgrade: websocket` before any HTTP POST. With `upstream.websocket: refuse` (the default) the
proxy answers 426 itself, at once: the client falls back to HTTP POST, where compaction works.
With `relay` the socket is relayed untouched end to end: the upstream's handshake made with the
request's end-to-end headers (Authorization included), then every message pumped both ways and
either side's close passed on. Over a socket a client sends only what is new after its first
turn, so nothing relayed is compacted. A half handshake (the upgrade's hop-by-hop headers
dropped, its `Sec-WebSocket-*` kept) never goes upstream.
"""

from __future__ import annotations

import asyncio

from aiohttp import ClientWebSocketResponse, WSCloseCode, WSMsgType, web

from proxy.errors import WebSocketRefused
from proxy.http import keys
from proxy.http.headers import upstream_request_headers
from proxy.sessions import resolve_session_id

# The client's handshake fields: the upstream's handshake is made anew (aiohttp's client
# writes its own key, version and extensions; the subprotocols are passed on).
_HANDSHAKE = ("Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Extensions",
              "Sec-WebSocket-Protocol", "Content-Length")  # fmt: skip
# Close codes that say what happened to a connection and are never sent in a close frame
# (RFC 6455 §7.4.1): no code given is passed on as a normal close, a lost connection or failed
# TLS as "the other side failed".
_NO_CODE = 1005
_FAILED = frozenset({1006, 1015})


def is_websocket_upgrade(request: web.Request) -> bool:
    upgrade = request.headers.get("Upgrade")
    return upgrade is not None and "websocket" in upgrade.lower()


async def answer_upgrade(
    request: web.Request, raw_tail: str, path_session: str | None
) -> web.StreamResponse:
    """The answer to a WebSocket upgrade for `raw_tail` (the path after /v1/): 426, or the
    socket relayed (`upstream.websocket`)."""
    if request.app[keys.SETTINGS].upstream.websocket == "refuse":
        raise WebSocketRefused(
            "this proxy does not relay WebSockets (upstream.websocket: refuse): "
            "send the request over HTTP"
        )
    upstream = request.app[keys.UPSTREAM]
    request[keys.REQUEST_INFO].session = resolve_session_id(request.headers, path_session)
    url = upstream.url_for(raw_tail, request.rel_url.raw_query_string)
    headers, _ = upstream_request_headers(
        request.headers, upstream.api_key_for(raw_tail, request.headers), keep_length=False
    )
    for name in _HANDSHAKE:
        headers.popall(name, None)
    asked = request.headers.get("Sec-WebSocket-Protocol", "")
    protocols = tuple(p.strip() for p in asked.split(",") if p.strip())
    limit = request.app[keys.SETTINGS].server.max_body_bytes
    far = await upstream.open_websocket(url, headers, protocols, max_msg_size=limit)
    near = web.WebSocketResponse(
        protocols=(far.protocol,) if far.protocol else (), max_msg_size=limit
    )
    try:
        await near.prepare(request)
        await _pump_both(near, far)
    finally:
        # Also when the client's close ended the connection first, which cancels this handler
        # (aiohttp's handler cancellation): its code was read before, and goes upstream.
        await far.close(code=_passed_on(near.close_code))
    return near


async def _pump_both(near: web.WebSocketResponse, far: ClientWebSocketResponse) -> None:
    """Messages both ways until either side closes; its close code then goes to the other.

    The other direction's pump is stopped before its side is closed: aiohttp's client socket
    closed from one task while another waits in its `receive` closes itself a second time, with
    code 1000, ahead of the code passed on."""
    to_far = asyncio.ensure_future(_pump(near, far))
    to_near = asyncio.ensure_future(_pump(far, near))
    try:
        done, _ = await asyncio.wait((to_far, to_near), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in (to_far, to_near):
            pump.cancel()
        await asyncio.gather(to_far, to_near, return_exceptions=True)
    closed, other = (near, far) if to_far in done else (far, near)
    await other.close(code=_passed_on(closed.close_code))


async def _pump(
    source: web.WebSocketResponse | ClientWebSocketResponse,
    sink: web.WebSocketResponse | ClientWebSocketResponse,
) -> None:
    async for message in source:  # ends at the source's close
        if message.type == WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type == WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        elif message.type == WSMsgType.ERROR:
            return


def _passed_on(code: int | None) -> int:
    if code is None or code == _NO_CODE:
        return WSCloseCode.OK
    if code in _FAILED:
        return WSCloseCode.INTERNAL_ERROR
    return code
