"""The clients' own compaction requests, as they send them over whichever API they speak: the
proxy forwards such a request as sent (proxy.compacting.decision.conversations steps aside), since
folding it would leave the client summarizing the proxy's summary, and a tool added to it would
be called instead of the summary being written.

- Codex, remote compaction (`x-codex-beta-features: remote_compaction_v2`): the turn metadata
  it sends with every request (the `x-codex-turn-metadata` header, a JSON object; the same text
  under `client_metadata` in a body) says `"request_kind": "compaction"`. The request also ends
  its input with a `compaction_trigger` item, a Responses rule (proxy.dialects.responses.rules).
- Codex, local compaction (providers without remote compaction): the history, then a user turn
  holding its prompt, `codex-rs/core/templates/compact/prompt.md`, which opens "You are
  performing a CONTEXT CHECKPOINT COMPACTION", with `tools: []`.
- Claude Code's /compact and auto-compact: the history, then a user turn holding its prompt,
  which asks "Your task is to create a detailed summary of the conversation so far" (after a
  "CRITICAL: Respond with TEXT ONLY" preamble in recent versions).

Each returns the reason a request is stepped aside for (a short, fixed word: a metric label).
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

CODEX_COMPACTION = "codex-compaction"
CODEX_HANDOFF = "codex-handoff"
CLAUDE_CODE_SUMMARY = "claude-code-summary"

_TURN_METADATA = "x-codex-turn-metadata"
_CODEX_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION"
_CLAUDE_CODE_PROMPT = "Your task is to create a detailed summary of the conversation so far"
# Where Claude Code's ask may start: after its preamble of a few hundred characters. A user turn
# is read no further than this, however long it is.
_PROMPT_REACH = 2048


def codex_compaction(headers: Mapping[str, str], payload: Mapping[str, object]) -> str | None:
    """Codex's remote compaction, told by its turn metadata (a header, or in the body)."""
    metadata = headers.get(_TURN_METADATA)
    if metadata is None:
        carried = payload.get("client_metadata")
        metadata = carried.get(_TURN_METADATA) if isinstance(carried, Mapping) else None
    if not isinstance(metadata, str) or "compaction" not in metadata:
        return None
    try:
        parsed = orjson.loads(metadata)
    except orjson.JSONDecodeError:
        return None
    if isinstance(parsed, dict) and parsed.get("request_kind") == "compaction":
        return CODEX_COMPACTION
    return None


def summary_prompt(last_user_text: str | None) -> str | None:
    """Codex's handoff or Claude Code's summary, told by the prompt in the request's last user
    turn (`last_user_text`: None when the request does not end with one)."""
    if last_user_text is None:
        return None
    if last_user_text.lstrip().startswith(_CODEX_PROMPT):
        return CODEX_HANDOFF
    if last_user_text.find(_CLAUDE_CODE_PROMPT, 0, _PROMPT_REACH) >= 0:
        return CLAUDE_CODE_SUMMARY
    return None


def own_compaction(
    headers: Mapping[str, str], payload: Mapping[str, object], last_user_text: str | None
) -> str | None:
    """Why a request is a client's own compaction (see the module), None when it is not."""
    return codex_compaction(headers, payload) or summary_prompt(last_user_text)
