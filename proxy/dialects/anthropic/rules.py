"""Anthropic's own rules the proxy keeps, each with the page that documents it.

- The proxy's own errors take Anthropic's shape, `{"type": "error", "error": {"type",
  "message"}}`, with Anthropic's error type for the status
  (https://docs.anthropic.com/en/api/errors).
- Anthropic's models are not in the OpenAI-shaped upstream's model listing: a window the
  configuration does not name is not looked up there (`lists_models` of the dialect).
"""

from __future__ import annotations

import orjson

# Anthropic's error types by status, for the proxy's own errors on Anthropic's paths.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
}


def anthropic_error_body(status: int, message: str, type_: str) -> bytes:
    """An error of the proxy's in Anthropic's shape (`type_` is OpenAI's, kept for a status
    Anthropic names no type for)."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else type_)
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
