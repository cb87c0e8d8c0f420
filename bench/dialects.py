"""Chat conversations in the other two API shapes, and each shape's sequencing rules, checked
strictly: one converter and one validator for the tests' fake upstream and for bench/replay.py.

- `to_responses(messages, tools)`: a Responses request body. The leading system message becomes
  `instructions`; every assistant turn starts with a `reasoning` item (an opaque, deterministic
  `encrypted_content`), then its text as an `output_text` message, then one `function_call` item
  per call; tool messages become `function_call_output` items.
- `to_anthropic(messages, tools)`: an Anthropic Messages body. The system message becomes
  `system` (a text block with `cache_control`); every assistant turn starts with a `thinking`
  block whose signature is a digest of its text; calls become `tool_use` blocks, tool messages
  `tool_result` blocks of the next user turn; turns of one role in a row are merged.
- `check_responses(body, seen)` / `check_anthropic(body, seen)`: what the real API would refuse
  (calls without outputs, outputs without calls, a reasoning item not followed by the model's
  item; turns out of order, a tool_use not answered in the very next turn), and any reasoning or
  thinking whose opaque part differs from what was seen before under the same id or signature.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from compaction import HeuristicEstimator
from compaction.invariants import check_tool_pairing
from compaction.messages import ANTHROPIC, CHAT, RESPONSES, Shape
from compaction.tokens import estimate_request


def _digest(text: str, size: int = 12) -> str:
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


# ------------------------------------------------------------------ conversion


def to_responses(messages: list[dict[str, Any]], tools: list[Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "replay"}
    items: list[dict[str, Any]] = []
    rest = messages
    if rest and rest[0].get("role") == "system":
        body["instructions"] = _text(rest[0])
        rest = rest[1:]
    for message in rest:
        role = message.get("role")
        if role == "assistant":
            items += _responses_turn(message)
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": _text(message),
                }
            )
        else:
            text = [{"type": "input_text", "text": _text(message)}]
            items.append({"type": "message", "role": role, "content": text})
    body["input"] = items
    if tools:
        body["tools"] = [
            {"type": "function", **{k: v for k, v in t["function"].items()}} for t in tools
        ]
    return body


def _responses_turn(message: dict[str, Any]) -> list[dict[str, Any]]:
    text = _text(message)
    calls = message.get("tool_calls") or []
    seed = text + "".join(c["id"] for c in calls)
    opaque = base64.b64encode(hashlib.sha512(seed.encode()).digest() * 4).decode()
    items: list[dict[str, Any]] = [
        {
            "type": "reasoning",
            "id": f"rs_{_digest(seed)}",
            "summary": [],
            "encrypted_content": opaque,
        }
    ]
    if text:
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{_digest(seed)}",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call in calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{_digest(call['id'])}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
            }
        )
    return items


def to_anthropic(messages: list[dict[str, Any]], tools: list[Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "replay", "max_tokens": 1024}
    rest = messages
    if rest and rest[0].get("role") == "system":
        system = {"type": "text", "text": _text(rest[0]), "cache_control": {"type": "ephemeral"}}
        body["system"] = [system]
        rest = rest[1:]
    turns: list[dict[str, Any]] = []
    for message in rest:
        role = message.get("role")
        if role == "assistant":
            turn_role, blocks = "assistant", _anthropic_turn(message)
        elif role == "tool":
            result = {"type": "tool_result", "tool_use_id": message["tool_call_id"]}
            turn_role, blocks = "user", [{**result, "content": _text(message)}]
        else:
            turn_role, blocks = "user", [{"type": "text", "text": _text(message) or "(empty)"}]
        if turns and turns[-1]["role"] == turn_role:
            turns[-1]["content"] += blocks
        else:
            turns.append({"role": turn_role, "content": blocks})
    if turns and turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": "(conversation starts)"})
    body["messages"] = turns
    if tools:
        body["tools"] = [
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "input_schema": t["function"].get("parameters", {"type": "object"}),
            }
            for t in tools
        ]
    return body


def _anthropic_turn(message: dict[str, Any]) -> list[dict[str, Any]]:
    text = _text(message)
    calls = message.get("tool_calls") or []
    thought = f"Considering the next step: {text[:200]}"
    blocks: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": thought, "signature": signature_of(thought)}
    ]
    if text:
        blocks.append({"type": "text", "text": text})
    for call in calls:
        try:
            arguments = orjson.loads(call["function"]["arguments"])
        except orjson.JSONDecodeError:
            arguments = {"raw": call["function"]["arguments"]}
        if not isinstance(arguments, dict):
            arguments = {"value": arguments}
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["function"]["name"],
                "input": arguments,
            }
        )
    return blocks


def signature_of(thinking: str) -> str:
    """The signature a thinking block carries: the fake upstream refuses any other."""
    return "sig-" + _digest(thinking, 24)


# ------------------------------------------------------------------ validation


def check_responses(body: dict[str, Any], seen: dict[str, Any] | None = None) -> list[str]:
    """What the Responses API would refuse in `body["input"]`; `seen` keeps reasoning items by
    id across the requests of one conversation."""
    items = body.get("input")
    if not isinstance(items, list):
        return []
    problems: list[str] = []
    called: dict[str, int] = {}
    answered: set[str] = set()
    # A model turn that reasoned (reasoning, its message, its calls) must arrive whole: the API
    # refuses a call whose turn's reasoning item is missing.
    reasoning = any(isinstance(i, dict) and i.get("type") == "reasoning" for i in items)
    for index, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "reasoning":
            following = items[index + 1] if index + 1 < len(items) else None
            if not _is_model_item(following):
                problems.append(f"input[{index}]: reasoning without its following item")
            if seen is not None and seen.setdefault(item["id"], item) != item:
                problems.append(f"input[{index}]: reasoning {item['id']} was altered")
        elif isinstance(kind, str) and kind.endswith("_call_output"):
            if item.get("call_id") not in called:
                problems.append(f"input[{index}]: output for unknown call {item.get('call_id')}")
            answered.add(item.get("call_id"))
        elif isinstance(kind, str) and kind.endswith("_call"):
            called[item["call_id"]] = index
            reasoned = _has_reasoning_before(items, index)
            # A call the conversation first showed with its reasoning needs it ever after, even
            # when no reasoning survives anywhere else in the list; without `seen`, any reasoning
            # in the list says the model reasons.
            needed = (
                reasoning if seen is None else seen.setdefault(f"call:{item['call_id']}", reasoned)
            )
            if needed and not reasoned:
                problems.append(f"input[{index}]: call without the reasoning of its turn")
    problems += [
        f"input[{i}]: call {c} has no output" for c, i in called.items() if c not in answered
    ]
    return problems


def _has_reasoning_before(items: list[Any], index: int) -> bool:
    """True when the items before `index`, back over its turn's calls and message, start with a
    reasoning item."""
    while index > 0 and _is_model_item(items[index - 1]):
        index -= 1
    return index > 0 and items[index - 1].get("type") == "reasoning"


def _is_model_item(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    kind = item.get("type", "message")
    return (kind == "message" and item.get("role") == "assistant") or str(kind).endswith("_call")


def check_anthropic(body: dict[str, Any], seen: dict[str, Any] | None = None) -> list[str]:
    """What Anthropic's Messages API would refuse in `body["messages"]`; `seen` keeps thinking
    texts by signature across the requests of one conversation."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return ["messages: empty or missing"]
    problems: list[str] = []
    turns = [m if isinstance(m, dict) else {} for m in messages]
    problems += [
        f"messages[{i}]: not a turn" for i, m in enumerate(messages) if not m or m is not turns[i]
    ]
    if turns[0].get("role") != "user":
        problems.append("messages[0]: the first turn is not the user's")
    previous_calls: set[str] = set()
    for index, message in enumerate(turns):
        role = message.get("role")
        if index and role == turns[index - 1].get("role"):
            problems.append(f"messages[{index}]: two {role} turns in a row")
        content = message.get("content")
        listed = content if isinstance(content, list) else []
        blocks = [b for b in listed if isinstance(b, dict)]
        if len(blocks) != len(listed):
            problems.append(f"messages[{index}]: not a block in its content")
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if role == "user":
            if set(results) != previous_calls:
                problems.append(f"messages[{index}]: tool_result ids {results} != {previous_calls}")
            kinds = [b.get("type") == "tool_result" for b in blocks]
            if kinds != sorted(kinds, reverse=True):
                problems.append(f"messages[{index}]: tool_result blocks after other content")
            previous_calls = set()
        else:
            previous_calls = {b["id"] for b in blocks if b.get("type") == "tool_use"}
            for block in blocks:
                if block.get("type") != "thinking":
                    continue
                signature = block.get("signature")
                if seen is not None and seen.setdefault(signature, block) != block:
                    problems.append(f"messages[{index}]: thinking altered under its signature")
                if signature != signature_of(block.get("thinking", "")):
                    problems.append(f"messages[{index}]: thinking whose signature does not match")
    if previous_calls:
        problems.append("the last assistant turn's tool_use blocks have no tool_result")
    return problems


# ------------------------------------------------------------------ one API's wire, for replays


@dataclass(frozen=True)
class Wire:
    """One API as a replay drives it: where requests go, how a chat prefix becomes a body, what
    the upstream counts and refuses, and how it answers."""

    name: str
    path: str
    shape: Shape
    listed: str
    extras: tuple[str, ...]

    def body(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> dict[str, Any]:
        if self.name == "responses":
            return to_responses(messages, tools)
        if self.name == "anthropic":
            return to_anthropic(messages, tools)
        return {"model": "replay", "messages": messages, **({"tools": tools} if tools else {})}

    def items(self, body: dict[str, Any]) -> list[Any]:
        return list(body[self.listed])

    def tokens(self, body: dict[str, Any]) -> int:
        # The proxy's own reading (proxy.dialects): chat's `tools` as they are, the
        # other APIs' fields besides the list as one list.
        found = [body[key] for key in self.extras if body.get(key) is not None]
        extras: Any = found[0] if self.name == "chat" and found else (found or None)
        return estimate_request(body[self.listed], extras, self.estimator())

    def estimator(self) -> HeuristicEstimator:
        return HeuristicEstimator(shape=self.shape)

    def check(self, body: dict[str, Any], seen: dict[str, Any]) -> list[str]:
        if self.name == "responses":
            return check_responses(body, seen)
        if self.name == "anthropic":
            return check_anthropic(body, seen)
        return check_tool_pairing(body["messages"])

    def answer(self, text: str, prompt_tokens: int) -> dict[str, Any]:
        if self.name == "responses":
            message = {"type": "message", "role": "assistant", "content": [_output(text)]}
            return {
                "object": "response",
                "output": [message],
                "usage": {"input_tokens": prompt_tokens},
            }
        if self.name == "anthropic":
            usage = {"input_tokens": prompt_tokens, "output_tokens": 1}
            content = [{"type": "text", "text": text}]
            return {"type": "message", "role": "assistant", "content": content, "usage": usage}
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }
        return {
            "object": "chat.completion",
            "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens},
        }


def _output(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


WIRES = {
    "chat": Wire("chat", "chat/completions", CHAT, "messages", ("tools",)),
    "responses": Wire("responses", "responses", RESPONSES, "input", ("instructions", "tools")),
    "anthropic": Wire("anthropic", "messages", ANTHROPIC, "messages", ("system", "tools")),
}
