"""The Responses API's own rules the proxy keeps, each with the page that documents it.

- A conversation kept upstream is not ours to compact: with `previous_response_id` (or a
  `conversation`), the upstream holds the history and `input` carries only what is new
  (https://platform.openai.com/docs/guides/conversation-state).
- A request that asks the upstream to compact is the upstream's to compact: server-side
  compaction, `context_management: [{"type": "compaction", "compact_threshold": N}]`
  (https://developers.openai.com/api/docs/guides/compaction), and Codex's remote compaction,
  whose last input item is `{"type": "compaction_trigger"}` (the upstream answers it with a
  `compaction` item). Such a request goes as sent (`own_compaction`). The `compaction` item
  itself is opaque and stays where the client put it (compaction.messages.responses: the head
  ends after it).
"""

from __future__ import annotations

from collections.abc import Mapping

from compaction import content_text, is_message_item
from proxy.dialects import clients

_KEPT_UPSTREAM = ("previous_response_id", "conversation")

SERVER_COMPACTION = "responses-context-management"


def kept_upstream(payload: Mapping[str, object]) -> bool:
    """True when the request continues a conversation the upstream keeps."""
    return any(payload.get(key) is not None for key in _KEPT_UPSTREAM)


def own_compaction(
    payload: Mapping[str, object], last: object, headers: Mapping[str, str]
) -> str | None:
    """Why the request is a compaction the upstream or the client runs (see the module and
    proxy.dialects.clients), None when it is not; `last` is its last input item."""
    if _asks_server_compaction(payload.get("context_management")):
        return SERVER_COMPACTION
    if isinstance(last, Mapping) and last.get("type") == "compaction_trigger":
        return clients.CODEX_COMPACTION
    said = None
    if is_message_item(last) and isinstance(last, Mapping) and last.get("role") == "user":
        said = content_text(last.get("content"))
    return clients.own_compaction(headers, payload, said)


def _asks_server_compaction(entries: object) -> bool:
    return isinstance(entries, list) and any(
        isinstance(entry, Mapping) and entry.get("type") == "compaction" for entry in entries
    )
