"""Each dialect's `own_compaction`, asked directly: what is a compaction its client or provider
runs itself (the request then goes as sent), and what merely looks like one. The requests are
shaped as the docs and the clients send them (see tests/proxy/compacting/test_stepping_aside.py
for the pages, and proxy/dialects/clients.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.dialects.anthropic import ANTHROPIC_MESSAGES
from proxy.dialects.chat import CHAT_COMPLETIONS
from proxy.dialects.responses import RESPONSES_API

CODEX_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary."
CLAUDE_CODE_PROMPT = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nYour task is to create a "
    "detailed summary of the conversation so far, paying close attention to the user's requests."
)


def user_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def metadata(kind: str) -> str:
    return orjson.dumps({"turn_id": "t-1", "request_kind": kind}).decode()


@pytest.mark.parametrize(
    ("payload", "last", "headers", "reason"),
    [
        ({}, {"type": "compaction_trigger"}, {}, "codex-compaction"),
        (
            {},
            user_item("Go on."),
            {"x-codex-turn-metadata": metadata("compaction")},
            "codex-compaction",
        ),
        (
            {"client_metadata": {"x-codex-turn-metadata": metadata("compaction")}},
            user_item("Go on."),
            {},
            "codex-compaction",
        ),
        ({"tools": []}, user_item(CODEX_PROMPT), {}, "codex-handoff"),
        (
            {"context_management": [{"type": "compaction", "compact_threshold": 200000}]},
            user_item("Go on."),
            {},
            "responses-context-management",
        ),
        ({}, user_item("Go on."), {"x-codex-turn-metadata": metadata("subagent_turn")}, None),
        ({}, user_item("Go on."), {"x-codex-turn-metadata": "compaction, not JSON"}, None),
        ({}, {"type": "compaction", "encrypted_content": "gAAAA"}, {}, None),
        ({}, user_item(f"Please explain: {CODEX_PROMPT}"), {}, None),
        ({}, None, {}, None),
    ],
)
def test_responses(
    payload: dict[str, Any], last: Any, headers: dict[str, str], reason: str | None
) -> None:
    assert RESPONSES_API.own_compaction(payload, last, headers) == reason


@pytest.mark.parametrize(
    ("payload", "last", "reason"),
    [
        (
            {"compaction": {"type": "summarize"}},
            {"role": "user", "content": "Go."},
            "anthropic-compaction",
        ),
        (
            {"context_management": {"edits": [{"type": "compact_20260112"}]}},
            {"role": "user", "content": "Go."},
            "anthropic-compact-edit",
        ),
        (
            {"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}},
            {"role": "user", "content": "Go."},
            None,
        ),
        (
            {},
            {"role": "user", "content": [{"type": "text", "text": CLAUDE_CODE_PROMPT}]},
            "claude-code-summary",
        ),
        ({}, {"role": "assistant", "content": CLAUDE_CODE_PROMPT}, None),
        ({}, {"role": "user", "content": "x" * 5000 + CLAUDE_CODE_PROMPT}, None),
    ],
)
def test_anthropic(payload: dict[str, Any], last: Any, reason: str | None) -> None:
    assert ANTHROPIC_MESSAGES.own_compaction(payload, last, {}) == reason


def test_chat_knows_the_clients_own_compaction_only() -> None:
    assert CHAT_COMPLETIONS.own_compaction({}, {"role": "user", "content": CODEX_PROMPT}, {}) == (
        "codex-handoff"
    )
    # Chat completions has no compaction of its own: these fields mean nothing here.
    compaction_fields = {
        "compaction": {"type": "summarize"},
        "context_management": [{"type": "compaction"}],
    }
    assert (
        CHAT_COMPLETIONS.own_compaction(compaction_fields, {"role": "user", "content": "Go."}, {})
        is None
    )
