"""The Responses API's own rules the proxy keeps, each with the page that documents it.

- A conversation kept upstream is not ours to compact: with `previous_response_id` (or a
  `conversation`), the upstream holds the history and `input` carries only what is new
  (https://platform.openai.com/docs/guides/conversation-state).
"""

from __future__ import annotations

from collections.abc import Mapping

_KEPT_UPSTREAM = ("previous_response_id", "conversation")


def kept_upstream(payload: Mapping[str, object]) -> bool:
    """True when the request continues a conversation the upstream keeps."""
    return any(payload.get(key) is not None for key in _KEPT_UPSTREAM)
