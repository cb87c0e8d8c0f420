"""The errors the proxy originates, and the OpenAI error shape they become (on an API's paths,
that API's shape: its dialect's `error_body`, Anthropic's `{"type": "error", "error": {...}}`).

    ProxyError                       every error we answer ourselves ({"error": {...}})
    ├── BadRequest            400    invalid_request_error
    │   ├── SessionIdRefused  400    code invalid_session_id
    │   ├── InvalidPath       400    code invalid_path
    │   └── UnreadableBody    400    code invalid_content_encoding (a body not in its stated
    │                                Content-Encoding), invalid_request_body (a malformed body)
    ├── Unauthorized          401    code invalid_admin_token
    ├── NotFound              404    code not_found
    ├── RequestTimeout        408    code request_timeout (the client stopped sending its body)
    ├── BodyTooLarge          413    code request_too_large
    ├── EncodedBodyRefused    415    code unsupported_content_encoding (an encoded body sent to
    │                                a route that takes no body)
    ├── ExpectationFailed     417    code expectation_failed (an `Expect` but 100-continue)
    ├── WebSocketRefused      426    code websocket_not_relayed (upstream.websocket: refuse)
    ├── HeaderTooLarge        431    code request_header_too_large
    ├── UpstreamUnreachable   502    code upstream_unreachable (connect failed, connection lost
    │                                before the response headers)
    ├── UpstreamTimeout       504    code upstream_timeout (no response within the read timeout)
    └── UpstreamRefusedWebSocket     the upstream's error status, else 502: code
                                     websocket_refused_upstream (it answered a relayed
                                     WebSocket handshake without upgrading)

    UpstreamStreamCut                not a ProxyError: the upstream failed after the response
                                     started; the relay can only end the client's stream.

Upstream answers, errors included, are data and are relayed unchanged; they never become one of
these. `http.middleware` is the one place that turns these into responses.
"""

from __future__ import annotations

from typing import Protocol

import orjson


class ErrorShape(Protocol):
    """How an API writes an error (proxy.dialects.Dialect.error_body)."""

    def error_body(self, status: int, message: str, type_: str, code: str | None) -> bytes: ...


class ProxyError(Exception):
    status = 500
    type = "server_error"
    code = "internal_error"
    closes = False
    """True when the client's connection cannot serve another request after this answer."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self, api: ErrorShape | None = None) -> bytes:
        return error_body(self.message, self.type, self.code, status=self.status, api=api)


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class SessionIdRefused(BadRequest):
    """The 400 for a session id the library's rule (compaction.memory.is_valid_session_id)
    refuses. Not compaction.InvalidSessionId: that is the library's ValueError, raised by its
    memory writer; this is our HTTP answer, decided before the library is ever called."""

    code = "invalid_session_id"


class InvalidPath(BadRequest):
    code = "invalid_path"


class UnreadableBody(BadRequest):
    code = "invalid_request_body"
    closes = True  # the server's parser stopped where the body broke: it cannot read on


class BadContentEncoding(UnreadableBody):
    code = "invalid_content_encoding"


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"
    code = "invalid_admin_token"


class NotFound(ProxyError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class RequestTimeout(ProxyError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"
    closes = True  # the rest of the body may still come: it would read as the next request


class BodyTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"
    # The rest of the body is not read: draining it for the next request would cost what the
    # limit refused (all of a decompression bomb, for one).
    closes = True


class EncodedBodyRefused(ProxyError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_encoding"
    closes = True  # its body is never read, nor drained


class ExpectationFailed(ProxyError):
    status = 417
    type = "invalid_request_error"
    code = "expectation_failed"
    closes = True  # the client may send its body after all: it would read as the next request


class WebSocketRefused(ProxyError):
    """The answer to a WebSocket upgrade while `upstream.websocket: refuse`: a client such as
    Codex falls back to HTTP POST at once on a 426 (it retries on a 404 and gives up on a
    400)."""

    status = 426
    type = "invalid_request_error"
    code = "websocket_not_relayed"


class HeaderTooLarge(ProxyError):
    status = 431
    type = "invalid_request_error"
    code = "request_header_too_large"


class ArchiveUnavailable(ProxyError):
    """The archive's backend failed a search (the state file or Redis is down)."""

    status = 503
    code = "archive_unavailable"


class UpstreamUnreachable(ProxyError):
    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamTimeout(ProxyError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


class UpstreamRefusedWebSocket(ProxyError):
    """The upstream answered a relayed WebSocket handshake without upgrading: its error status
    is passed on (aiohttp's client keeps no body of such an answer to relay), any other answer
    is a 502."""

    type = "upstream_error"
    code = "websocket_refused_upstream"

    def __init__(self, status: int) -> None:
        super().__init__(f"the upstream answered the WebSocket handshake with {status}")
        self.status = status if status >= 400 else 502


class UpstreamStreamCut(Exception):
    """The upstream connection failed while its response body was being relayed."""

    def __init__(self, kind: str, *, partial: bytes = b"") -> None:
        super().__init__(kind)
        self.kind = kind
        self.partial = partial
        """The body bytes read before the failure, when the reader kept them."""


def error_body(
    message: str, type_: str, code: str | None, *, status: int = 400, api: ErrorShape | None = None
) -> bytes:
    """The error in `api`'s shape; OpenAI's `{"error": {message, type, code}}` without one."""
    if api is not None:
        return api.error_body(status, message, type_, code)
    return openai_error_body(message, type_, code)


def openai_error_body(message: str, type_: str, code: str | None) -> bytes:
    payload: dict[str, object] = {"error": {"message": message, "type": type_, "code": code}}
    return orjson.dumps(payload)
