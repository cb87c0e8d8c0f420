"""Chat Completions (`POST /v1/chat/completions`): `messages`, head system/developer messages,
`tools`; usage `prompt_tokens`; summaries asked of `chat/completions`; an assistant message's
calls in its `tool_calls`; the proxy's tool a `function` tool (proxy.dialects.chat.recall), its
streams `chat.completion.chunk`s (proxy.dialects.chat.streams)."""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from compaction import CHAT, Message, Shape, message_text
from proxy.dialects import clients, naming
from proxy.dialects.base import JsonObject, Turns
from proxy.dialects.chat.recall import ChatTurns, function_tool
from proxy.dialects.chat.streams import ChatStream
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

_HEAD_ROLES = ("system", "developer")
# Fields of the agent's request that shape its answer, not its prompt: a cached summary request
# leaves them out (a structured-output schema would hold the summary to the agent's format).
_ANSWER_FIELDS = (
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "response_format",
    "prediction",
)


class ChatCompletions(ItemsDialect):
    name = "chat"
    shape: Shape = CHAT
    summary_path = "chat/completions"
    call_headers: tuple[str, ...] = ()
    items_key = "messages"
    joins_summary = False

    def extras(self, payload: Mapping[str, object]) -> object:
        return payload.get("tools")

    def max_output(self, payload: Mapping[str, object]) -> int | None:
        return positive_int(payload, "max_completion_tokens", "max_tokens")

    def opening(self, payload: Mapping[str, object], messages: list[Message]) -> JsonObject:
        return {
            "head": _head_contents(messages),
            "tools": tool_names(payload),
            "user": first_user_words(messages),
        }

    def serialize(
        self, body: bytes, payload: Mapping[str, object], messages: list[Message]
    ) -> bytes:
        return replace_field(body, payload, "messages", self.wire(messages))

    def prompt_tokens(self, usage: Mapping[str, object]) -> int | None:
        return int_field(usage, "prompt_tokens")

    def summary_body(
        self, model: str, messages: list[Message], max_tokens: int, refused: set[str]
    ) -> bytes:
        # Reasoning models refuse `max_tokens` (for `max_completion_tokens`) and any temperature.
        payload: JsonObject = {"model": model, "messages": messages, "stream": False}
        if "temperature" not in refused:
            payload["temperature"] = 0.2
        payload["max_completion_tokens" if "max_tokens" in refused else "max_tokens"] = max_tokens
        return orjson.dumps(payload)

    def cached_summary_body(
        self,
        payload: Mapping[str, object],
        listed: list[Message],
        instruction: str,
        max_tokens: int,
        refused: set[str],
    ) -> JsonObject:
        body = {key: value for key, value in payload.items() if key not in _ANSWER_FIELDS}
        body["messages"] = [*listed, {"role": "user", "content": instruction}]
        body["stream"] = False
        if payload.get("tool_choice") not in (None, "auto", "none"):
            body["tool_choice"] = "none"  # a forced call would answer with a call, not text
        newer = "max_completion_tokens" in payload or "max_tokens" in refused
        body["max_completion_tokens" if newer else "max_tokens"] = max_tokens
        return body

    def own_compaction(
        self, payload: Mapping[str, object], last: object, headers: Mapping[str, str]
    ) -> str | None:
        # Chat completions has no compaction of its own; its clients may (Codex over chat).
        said = None
        if isinstance(last, dict) and last.get("role") == "user":
            said = message_text(last)
        return clients.own_compaction(headers, payload, said)

    def session_name(self, payload: Mapping[str, object]) -> str | None:
        return naming.first_name(payload, naming.OPENAI_NAMES)

    def spent_tokens(self, usage: object) -> tuple[int, int]:
        return counted(usage, "prompt_tokens"), counted(usage, "completion_tokens")

    def calls_outside_content(self, message: Mapping[str, object]) -> object:
        return message.get("tool_calls")

    def tool(self, name: str, description: str, parameters: Mapping[str, object]) -> JsonObject:
        return function_tool(name, description, parameters)

    def turns(self, tool: str) -> Turns:
        return ChatTurns(tool)

    def stream(self, tool: str) -> ChatStream:
        return ChatStream(tool)

    def summary_text(self, answer: object) -> str | None:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        first = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(first, dict) or "message" not in first:
            return None
        return message_text(first["message"])


CHAT_COMPLETIONS = ChatCompletions()


def _head_contents(messages: list[Message]) -> list[object]:
    head = []
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") in _HEAD_ROLES:
            head.append(without_markers(message.get("content")))
        else:
            break
    return head
