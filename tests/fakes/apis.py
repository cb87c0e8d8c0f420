"""Answers in the shapes of the Responses API and Anthropic Messages, for FakeUpstream replies:
plain JSON bodies and the SSE events each API streams (as its SDK parses them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson


def responses_object(
    text: str = "",
    *,
    calls: Sequence[tuple[str, str, str]] = (),
    reasoning: str | None = None,
    input_tokens: int = 10,
) -> dict[str, Any]:
    """A completed `response`: a reasoning item (its encrypted content, if any), a message with
    `text` (if any) and function calls (call_id, name, arguments)."""
    output: list[dict[str, Any]] = []
    if reasoning is not None:
        output.append(
            {"type": "reasoning", "id": "rs_fake", "summary": [], "encrypted_content": reasoning}
        )
    if text:
        output.append(
            {
                "type": "message",
                "id": "msg_fake",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call_id, name, arguments in calls:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call_id}",
                "call_id": call_id,
                "name": name,
                "arguments": arguments,
                "status": "completed",
            }
        )
    return {
        "id": "resp_fake",
        "object": "response",
        "created_at": 1700000000,
        "status": "completed",
        "model": "fake-model",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + 2,
        },
    }


def responses_events(text: str, *, input_tokens: int = 10) -> list[bytes]:
    """The SSE events of a streamed response that says `text` in two deltas."""
    done = responses_object(text, input_tokens=input_tokens)
    started = {**done, "status": "in_progress", "output": [], "usage": None}
    item = done["output"][0]
    half = len(text) // 2
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started, "sequence_number": 0},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
            "sequence_number": 1,
        },
    ]
    for number, piece in enumerate((text[:half], text[half:]), start=2):
        events.append(
            {
                "type": "response.output_text.delta",
                "item_id": item["id"],
                "output_index": 0,
                "content_index": 0,
                "delta": piece,
                "logprobs": [],
                "sequence_number": number,
            }
        )
    events += [
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": item,
            "sequence_number": 4,
        },
        {"type": "response.completed", "response": done, "sequence_number": 5},
    ]
    return [_sse(event["type"], event) for event in events]


def anthropic_message(
    text: str = "",
    *,
    tool_uses: Sequence[tuple[str, str, dict[str, Any]]] = (),
    thinking: tuple[str, str] | None = None,
    input_tokens: int = 10,
) -> dict[str, Any]:
    """An Anthropic `message`: a thinking block (text, signature), text, tool_use blocks
    (id, name, input)."""
    content: list[dict[str, Any]] = []
    if thinking is not None:
        content.append({"type": "thinking", "thinking": thinking[0], "signature": thinking[1]})
    if text:
        content.append({"type": "text", "text": text})
    for use_id, name, arguments in tool_uses:
        content.append({"type": "tool_use", "id": use_id, "name": name, "input": arguments})
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "fake-model",
        "content": content,
        "stop_reason": "tool_use" if tool_uses else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 2,
        },
    }


def anthropic_events(text: str, *, input_tokens: int = 10) -> list[bytes]:
    """The SSE events of a streamed Anthropic message that says `text` in two deltas."""
    start = {**anthropic_message(input_tokens=input_tokens), "stop_reason": None}
    half = len(text) // 2
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ]
    for piece in (text[:half], text[half:]):
        events.append(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            }
        )
    events += [
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 2},
        },
        {"type": "message_stop"},
    ]
    return [_sse(event["type"], event) for event in events]


def _sse(name: str, payload: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
