"""Anthropic's own rules the proxy keeps, each with the page that documents it.

- The proxy's own errors take Anthropic's shape, `{"type": "error", "error": {"type",
  "message"}}`, with Anthropic's error type for the status
  (https://docs.anthropic.com/en/api/errors).
- Anthropic's models are not in the OpenAI-shaped upstream's model listing: a window the
  configuration does not name is not looked up there (`lists_models` of the dialect).
- A request that asks Anthropic to compact is Anthropic's to compact, and goes as sent
  (`own_compaction`): on demand, the top-level `"compaction": {"type": "summarize"}` with the
  beta `compact-2026-09-04` (https://platform.claude.com/docs/en/build-with-claude/
  compaction-on-demand); at a threshold, a `context_management.edits` entry of type
  `compact_20260112` (https://platform.claude.com/docs/en/build-with-claude/
  compaction-threshold). The signed `compaction` block it answers with "goes first in
  `messages`", byte-exact, on every later request: it stays there (compaction.messages.anthropic:
  the head ends after it), and the client's `anthropic-beta` header goes with every request.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from compaction import blocks_text
from proxy.dialects import clients

ON_DEMAND = "anthropic-compaction"
AT_THRESHOLD = "anthropic-compact-edit"
_THRESHOLD_EDIT = "compact_20260112"

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


def own_compaction(
    payload: Mapping[str, object], last: object, headers: Mapping[str, str]
) -> str | None:
    """Why the request is a compaction Anthropic or the client runs (see the module and
    proxy.dialects.clients), None when it is not; `last` is its last message."""
    if payload.get("compaction") is not None:
        return ON_DEMAND
    management = payload.get("context_management")
    edits = management.get("edits") if isinstance(management, Mapping) else None
    if isinstance(edits, list) and any(
        isinstance(edit, Mapping) and edit.get("type") == _THRESHOLD_EDIT for edit in edits
    ):
        return AT_THRESHOLD
    said = None
    if isinstance(last, Mapping) and last.get("role") == "user":
        said = blocks_text(last.get("content"))
    return clients.own_compaction(headers, payload, said)
