"""A chat request as the compacting hook sees it: parsed once, with its budget.

Parsing is the expensive part of the decision, so `may_need_parsing` first bounds the prompt from
the byte length alone (the estimate never exceeds one token per byte; images and audio are the
exception and are looked for), and only bodies that could reach the lowest ratio are parsed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import orjson

from compaction import HeuristicEstimator
from proxy.compacting.splice import FieldSpan, load_json, locate_field

_HEAD_ROLES = ("system", "developer")
_FIXED_COST_PARTS = (b'"image_url"', b'"input_audio"', b'"file"')
_MAX_OUTPUT = re.compile(rb'"max(?:_completion)?_tokens"\s*:\s*(\d{1,9})')


class NotAChat(ValueError):
    """The body is not a JSON object with a `messages` list: forward it untouched."""


def may_need_parsing(
    body: bytes, *, smallest_window: int, lowest_ratio: float, factor: float
) -> bool:
    """False only when no estimate of `body` can reach `lowest_ratio` of the smallest window."""
    bound = len(body) * max(1.0, factor)
    if bound >= lowest_ratio * smallest_window:
        return True
    found = _MAX_OUTPUT.search(body)
    if found and bound + int(found.group(1)) > smallest_window:
        return True
    return any(part in body for part in _FIXED_COST_PARTS)


@dataclass(frozen=True)
class ChatRequest:
    body: bytes
    """The bytes as received: a compacted request is these with `messages` replaced."""
    payload: dict[str, Any]
    messages: list[Any]
    tools: Any
    model: str
    window: int
    max_output_tokens: int | None
    session_id: str
    opening: str
    """Fingerprint of the conversation's opening (head, tool names, first user message)."""
    credential: str | None
    auth_headers: dict[str, str]
    tenant: bytes
    """Digest of the caller's credentials: scopes the summarizer's cooldown."""
    seed: bytes
    """Digest of tenant and session: scopes checkpoints, so conversations never share them."""
    factor: float
    estimator: HeuristicEstimator

    @classmethod
    def parse(cls, body: bytes) -> tuple[dict[str, Any], list[Any]]:
        try:
            payload = load_json(body)
        except ValueError as exc:
            raise NotAChat("body is not JSON") from exc
        if not isinstance(payload, dict):
            raise NotAChat("body is not a JSON object")
        messages = payload.get("messages")
        if not isinstance(messages, list):
            raise NotAChat("body has no messages list")
        return payload, messages

    def with_budget(self, *, window: int, factor: float) -> ChatRequest:
        return replace(self, window=window, factor=factor, estimator=HeuristicEstimator(factor))

    def serialize(self, messages: list[Any]) -> bytes:
        """The request with `messages` replaced; every other byte as sent (see splice)."""
        value = orjson.dumps(messages)
        if self._messages_span is not None:
            return self._messages_span.replace(self.body, value)
        return orjson.dumps({**self.payload, "messages": messages})

    @cached_property
    def _messages_span(self) -> FieldSpan | None:
        return locate_field(self.body, self.payload, "messages")


def model_of(payload: dict[str, Any]) -> str:
    model = payload.get("model")
    return model if isinstance(model, str) else ""


def max_output_of(payload: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def fingerprint(payload: Mapping[str, Any], tenant: bytes = b"") -> str:
    """A stable session id for a chat request that names none: a digest of the conversation's
    opening (the head system/developer messages, the tool names and the first user message)
    and of the caller's credentials (`tenant`, a digest already).

    The first user message is part of it because the system prompt alone is the same for every
    conversation of one agent; the credentials, because two tenants whose conversations open
    the same way must never share a session, its records or its memory file."""
    messages = payload.get("messages")
    messages = messages if isinstance(messages, list) else []
    first_user = next(
        (m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") == "user"),
        None,
    )
    opening = {
        "head": _head_contents(messages),
        "tools": _tool_names(payload),
        "user": first_user,
        "tenant": tenant.hex(),
    }
    try:
        canonical = orjson.dumps(opening, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits from a lenient parser
        canonical = repr(opening).encode()
    return f"fp-{hashlib.sha256(canonical).hexdigest()[:32]}"


def _head_contents(messages: list[Any]) -> list[Any]:
    head = []
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") in _HEAD_ROLES:
            head.append(message.get("content"))
        else:
            break
    return head


def _tool_names(payload: Mapping[str, Any]) -> list[str]:
    tools = payload.get("tools")
    names = []
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str):
            names.append(name)
    return sorted(names)
