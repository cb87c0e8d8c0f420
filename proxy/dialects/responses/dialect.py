"""The Responses API (`POST /v1/responses`): `input` items, `instructions` and `tools` outside the
list; usage `input_tokens` (in a stream's events, under `response`); summaries asked of
`responses`, never stored upstream; the proxy's tool a `function` tool, its calls `function_call`
items (proxy.dialects.responses.recall), its streams typed events (proxy.dialects.responses.streams).

A request that continues a conversation kept upstream (`previous_response_id`, `conversation`)
or whose `input` is a plain string has no history here to compact: it passes through.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from compaction import RESPONSES, Message, Shape, content_text, is_message_item
from proxy.dialects import naming
from proxy.dialects.base import JsonObject, NotCompactable, Turns
from proxy.dialects.payload import (
    ItemsDialect,
    first_user_words,
    int_field,
    list_field,
    positive_int,
    replace_field,
    tool_names,
    without_markers,
)
from proxy.dialects.responses import rules
from proxy.dialects.responses.recall import ResponsesTurns, function_tool
from proxy.dialects.responses.rules import kept_upstream
from proxy.dialects.responses.streams import ResponsesStream
from proxy.dialects.usage import counted

_HEAD_ROLES = ("system", "developer")


# Fields of the agent's request that shape its answer, not its prompt: a cached summary request
# leaves them out (a structured-output format would hold the summary to the agent's format).
_ANSWER_FIELDS = ("stream", "stream_options", "max_output_tokens", "background", "text")

# Output tokens a reasoning model may spend thinking on top of the summary (billed only if used).
_REASONING_ROOM = 4096


class ResponsesAPI(ItemsDialect):
    name = "responses"
    shape: Shape = RESPONSES
    summary_path = "responses"
    call_headers: tuple[str, ...] = ()
    items_key = "input"
    joins_summary = False
    usage_holder = "response"

    def items(self, payload: Mapping[str, object]) -> list[Message]:
        if kept_upstream(payload):
            raise NotCompactable("the history lives upstream")
        return list_field(payload, "input")

    def extras(self, payload: Mapping[str, object]) -> object:
        parts = [payload.get(key) for key in ("instructions", "tools")]
        return [part for part in parts if part is not None] or None

    def max_output(self, payload: Mapping[str, object]) -> int | None:
        return positive_int(payload, "max_output_tokens")

    def opening(self, payload: Mapping[str, object], messages: list[Message]) -> JsonObject:
        head: list[object] = [payload.get("instructions")]
        for item in messages:
            if not is_message_item(item) or item.get("role") not in _HEAD_ROLES:
                break
            head.append(without_markers(item.get("content")))
        user = first_user_words(m for m in messages if is_message_item(m))
        return {"head": head, "tools": tool_names(payload), "user": user}

    def serialize(
        self, body: bytes, payload: Mapping[str, object], messages: list[Message]
    ) -> bytes:
        return replace_field(body, payload, "input", self.wire(messages))

    def prompt_tokens(self, usage: Mapping[str, object]) -> int | None:
        return int_field(usage, "input_tokens")

    def summary_body(
        self, model: str, messages: list[Message], max_tokens: int, refused: set[str]
    ) -> bytes:
        instructions = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        payload: JsonObject = {
            "model": model,
            "instructions": instructions,
            "input": [m for m in messages if m["role"] != "system"],
            "max_output_tokens": max_tokens,
            "store": False,
            "stream": False,
        }
        if "temperature" not in refused:
            payload["temperature"] = 0.2
        if "reasoning.effort" not in refused:
            # Reasoning models (gpt-5, codex, o-series) count their reasoning in
            # max_output_tokens: at the summary's own bound they can spend it all thinking and
            # answer `incomplete` with no text. Ask for little reasoning and leave room for it;
            # the prompt still states the summary's length. Other models refuse the field once.
            payload["reasoning"] = {"effort": "low"}
            payload["max_output_tokens"] = max_tokens + _REASONING_ROOM
        return orjson.dumps(payload)

    def reasoning_room(self, payload: Mapping[str, object]) -> int:
        return _REASONING_ROOM if isinstance(payload.get("reasoning"), Mapping) else 0

    def cached_summary_body(
        self,
        payload: Mapping[str, object],
        listed: list[Message],
        instruction: str,
        max_tokens: int,
        refused: set[str],
    ) -> JsonObject:
        body = {key: value for key, value in payload.items() if key not in _ANSWER_FIELDS}
        question = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": instruction}],
        }
        body["input"] = [*listed, question]
        body["stream"] = False
        choice = payload.get("tool_choice")
        if choice not in (None, "auto", "none"):
            body["tool_choice"] = "none"  # a forced call would answer with a call, not text
        body["max_output_tokens"] = max_tokens + self.reasoning_room(payload)
        return body

    def own_compaction(
        self, payload: Mapping[str, object], last: object, headers: Mapping[str, str]
    ) -> str | None:
        return rules.own_compaction(payload, last, headers)

    def session_name(self, payload: Mapping[str, object]) -> str | None:
        return naming.first_name(payload, naming.OPENAI_NAMES)

    def spent_tokens(self, usage: object) -> tuple[int, int]:
        return counted(usage, "input_tokens"), counted(usage, "output_tokens")

    def tool(self, name: str, description: str, parameters: Mapping[str, object]) -> JsonObject:
        return function_tool(name, description, parameters)

    def turns(self, tool: str) -> Turns:
        return ResponsesTurns(tool)

    def stream(self, tool: str) -> ResponsesStream:
        return ResponsesStream(tool)

    def summary_text(self, answer: object) -> str | None:
        output = answer.get("output") if isinstance(answer, dict) else None
        if not isinstance(output, list):
            return None
        texts = [
            content_text(item.get("content"))
            for item in output
            if is_message_item(item) and item.get("role") == "assistant"
        ]
        return "\n".join(texts) if texts else None


RESPONSES_API = ResponsesAPI()
