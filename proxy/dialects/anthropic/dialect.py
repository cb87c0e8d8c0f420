"""Anthropic Messages (`POST /v1/messages`, to `upstream.anthropic_base_url`): `messages` turns,
`system` and `tools` outside the list; usage `input_tokens` plus the cache's read and creation
tokens (in a stream's `message_start`, under `message`); summaries asked of `messages` with the
caller's `x-api-key` or `Authorization` and `anthropic-version`; the proxy's tool declared with
its `input_schema`, its calls `tool_use` blocks (proxy.dialects.anthropic.recall), its streams
typed events (proxy.dialects.anthropic.streams); its errors in Anthropic's shape and its models
not in the OpenAI-shaped upstream's listing (proxy.dialects.anthropic.rules). On the wire a summary followed by a user turn joins it
(compaction.messages.join_summary), so turns still alternate.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import orjson

from compaction import ANTHROPIC, Message, Shape, blocks_text, join_summary
from proxy.dialects import naming
from proxy.dialects.anthropic import native, rules
from proxy.dialects.anthropic.native import ON_DEMAND
from proxy.dialects.anthropic.recall import AnthropicTurns, declared_tool, is_thinking
from proxy.dialects.anthropic.rules import anthropic_error_body
from proxy.dialects.anthropic.streams import AnthropicStream
from proxy.dialects.base import JsonObject, NativeCompaction, Turns
from proxy.dialects.payload import (
    ItemsDialect,
    first_user_words,
    int_field,
    positive_int,
    replace_field,
    tool_names,
    without_markers,
)
from proxy.dialects.usage import counted

_BOUND_REFUSAL = re.compile(rb"bound to a different conversation")
# The least thinking budget Anthropic accepts: what a summary request thinks at most.
_SUMMARY_THINKING_TOKENS = 1024
_CACHE_FIELDS = ("cache_creation_input_tokens", "cache_read_input_tokens")
# Where an Anthropic request names its conversation: the gateways' field, Claude Code's.
_SESSION_NAMES: tuple[naming.NameReader, ...] = (
    naming.gateway_session,
    naming.claude_code_session,
)


class AnthropicMessages(ItemsDialect):
    name = "anthropic"
    shape: Shape = ANTHROPIC
    summary_path = "messages"
    call_headers: tuple[str, ...] = ("anthropic-version", "anthropic-beta")
    items_key = "messages"
    joins_summary = True
    lists_models = False
    usage_holder = "message"

    has_thinking = True
    native: NativeCompaction | None = ON_DEMAND

    def wire(self, messages: list[Message]) -> list[Message]:
        # A native summary is its block, and nothing joins it (proxy.dialects.anthropic.native).
        blocked = native.wire(messages)
        return blocked if blocked is not None else join_summary(messages)

    def refuses_bound_thinking(self, status: int, body: bytes) -> bool:
        # A thinking block whose prefix changed (docs `build-with-claude/preserved-thinking/
        # fix-bound-to-a-different-conversation`): "... Invalid `signature` in `thinking`
        # block. The block is bound to a different conversation. ..."
        return status == 400 and _BOUND_REFUSAL.search(body) is not None

    def without_thinking(self, message: Message) -> Message | None:
        # Removing thinking blocks is allowed by the prefix check; editing anything is not
        # (platform docs `build-with-claude/preserved-thinking/prefix-checks`).
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or not any(map(is_thinking, content)):
            return None
        return {**message, "content": [b for b in content if not is_thinking(b)]}

    def extras(self, payload: Mapping[str, object]) -> object:
        parts = [payload.get(key) for key in ("system", "tools")]
        return [part for part in parts if part is not None] or None

    def max_output(self, payload: Mapping[str, object]) -> int | None:
        return positive_int(payload, "max_tokens")

    def opening(self, payload: Mapping[str, object], messages: list[Message]) -> JsonObject:
        return {
            "head": without_markers(payload.get("system")),
            "tools": tool_names(payload),
            "user": first_user_words(messages),
        }

    def serialize(
        self, body: bytes, payload: Mapping[str, object], messages: list[Message]
    ) -> bytes:
        return replace_field(body, payload, "messages", self.wire(messages))

    def prompt_tokens(self, usage: Mapping[str, object]) -> int | None:
        # Anthropic's input_tokens leaves out what the prompt cache read or wrote.
        counted = int_field(usage, "input_tokens")
        if counted is None:
            return None
        return counted + sum(int_field(usage, key) or 0 for key in _CACHE_FIELDS)

    def summary_body(
        self, model: str, messages: list[Message], max_tokens: int, refused: set[str]
    ) -> bytes:
        payload: JsonObject = {
            "model": model,
            "max_tokens": max_tokens,
            "system": "\n\n".join(m["content"] for m in messages if m["role"] == "system"),
            "messages": [m for m in messages if m["role"] != "system"],
        }
        if "temperature" not in refused:
            payload["temperature"] = 0.2
        return orjson.dumps(payload)

    def cached_summary_body(
        self,
        payload: Mapping[str, object],
        listed: list[Message],
        instruction: str,
        max_tokens: int,
        refused: set[str],
    ) -> JsonObject:
        # Every breakpoint stays where the client placed it: the prefix up to the last one is
        # read from the cache; the question carries none (nothing after it is asked again).
        body = {key: value for key, value in payload.items() if key not in ("stream", "max_tokens")}
        question = {"role": "user", "content": [{"type": "text", "text": instruction}]}
        body["messages"] = [*listed, question]
        choice = payload.get("tool_choice")
        if isinstance(choice, Mapping) and choice.get("type") in ("any", "tool"):
            body["tool_choice"] = {"type": "auto"}  # a forced call would answer with a call
        # Thinking stays on (turned off, the thinking blocks in the prefix would have to go), at
        # the least budget the API takes: a summary needs little of it, and the client's own
        # budget (Claude Code: 31,999) on top of a prompt near the window's end is refused as
        # over the window. `max_tokens` must exceed the budget (docs `build-with-claude/
        # extended-thinking`); the room is counted where the question is sized.
        thinking = payload.get("thinking")
        room = self.reasoning_room(payload)
        if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
            body["thinking"] = {**thinking, "budget_tokens": _SUMMARY_THINKING_TOKENS}
        body["max_tokens"] = max_tokens + room
        return body

    def own_compaction(
        self, payload: Mapping[str, object], last: object, headers: Mapping[str, str]
    ) -> str | None:
        return rules.own_compaction(payload, last, headers)

    def session_name(self, payload: Mapping[str, object]) -> str | None:
        return naming.first_name(payload, _SESSION_NAMES)

    def spent_tokens(self, usage: object) -> tuple[int, int]:
        return counted(usage, "input_tokens"), counted(usage, "output_tokens")

    def tool(self, name: str, description: str, parameters: Mapping[str, object]) -> JsonObject:
        return declared_tool(name, description, parameters)

    def turns(self, tool: str) -> Turns:
        return AnthropicTurns(tool)

    def stream(self, tool: str) -> AnthropicStream:
        return AnthropicStream(tool)

    def error_body(self, status: int, message: str, type_: str, code: str | None) -> bytes:
        return anthropic_error_body(status, message, type_)

    def reasoning_room(self, payload: Mapping[str, object]) -> int:
        thinking = payload.get("thinking")
        thinks = isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")
        return _SUMMARY_THINKING_TOKENS if thinks else 0

    def summary_text(self, answer: object) -> str | None:
        content = answer.get("content") if isinstance(answer, dict) else None
        if not isinstance(content, list):
            return None
        return blocks_text([b for b in content if isinstance(b, dict) and b.get("type") == "text"])


ANTHROPIC_MESSAGES = AnthropicMessages()
