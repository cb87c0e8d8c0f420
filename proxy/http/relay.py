"""Relay an upstream response to the client as it arrives: status and headers first, then each
chunk the moment it is read, SSE or not, compressed or not. Nothing is buffered.

The status is fixed before `prepare()`; after that a failure can only end the stream:
- the client went away: stop, and close the upstream response so its connection is dropped;
- the upstream died mid-body: close the client's connection too (without the final chunk), so
  the client sees an incomplete response rather than a truncated one that looks complete.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable

from aiohttp import web

from proxy.errors import UpstreamStreamCut
from proxy.http.headers import client_response_headers
from proxy.http.upstream import Response
from proxy.http.usage import UsageProbe
from proxy.logs import RequestInfo
from proxy.metrics import Metrics
from proxy.outcome import Outcome, RecallFigures, add_headers

log = logging.getLogger(__name__)


async def relay(
    request: web.Request,
    upstream: Response,
    chunks: AsyncIterable[bytes],
    *,
    info: RequestInfo,
    metrics: Metrics,
    outcome: Outcome | None = None,
    recall: RecallFigures | None = None,
    already_read: bytes = b"",
    probe: UsageProbe | None = None,
) -> web.StreamResponse:
    """Send `upstream` to the client, its body read from `chunks` (Upstream.chunks, where the
    upstream's failures are mapped); `already_read` is body the caller read first (it is sent
    before the rest). The client is also told the hook's `outcome`, the `recall` rounds and the
    proxy's own time (proxy.outcome). Closes `upstream` unless it was read to the end."""
    # A body of known length follows its headers at once: send both in one write.
    kind = _HeadersWithBody if "Content-Length" in upstream.headers else web.StreamResponse
    response = kind(status=upstream.status, reason=upstream.reason)
    response.headers.extend(client_response_headers(upstream.headers))
    add_headers(response.headers, outcome, recall, info.overhead_ms())
    sent = 0
    info.outcome = "incomplete"
    try:
        await response.prepare(request)
        if already_read:
            await response.write(already_read)
            sent += len(already_read)
            if probe is not None:
                probe.feed(already_read)
        async for chunk in chunks:
            await response.write(chunk)
            sent += len(chunk)
            if probe is not None:
                probe.feed(chunk)
        await response.write_eof()
        info.outcome = "complete"
    except UpstreamStreamCut as cut:
        info.outcome = f"upstream_{cut.kind}"
        log.warning(
            "upstream failed mid-response; ending the client's stream",
            extra={"kind": cut.kind, "path": request.path, "bytes_relayed": sent},
        )
        _drop_client_connection(request, response)
    except (
        ConnectionResetError
    ):  # a write found the client gone (a cancelled handler: the middleware)
        info.outcome = "client_gone"
        metrics.client_disconnects.labels(info.route).inc()
    except Exception:
        # The status line may be out already, so no error response is possible any more.
        info.outcome = "proxy_error"
        log.exception("relay failed", extra={"path": request.path})
        _drop_client_connection(request, response)
    finally:
        # release() returns a fully read connection to the pool; close() drops one whose body
        # was not read to the end, which is what tells the upstream to stop generating.
        if info.outcome == "complete":
            upstream.release()
        else:
            upstream.close()
        metrics.requests.add_response_bytes(info.route, sent)
    return response


class _HeadersWithBody(web.StreamResponse):
    """The headers wait for the first body bytes and go out with them (one write, not two, per
    small response: aiohttp's own web.Response does the same). Only for a body of known
    length: a stream's headers must not wait for its first event."""

    _send_headers_immediately = False


def _drop_client_connection(request: web.Request, response: web.StreamResponse) -> None:
    response.force_close()
    transport = request.transport
    if transport is not None:
        transport.close()
