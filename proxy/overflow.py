"""Recognise an upstream's "your prompt is too long" answer, and what it says about the limit.

OpenAI answers 400 with code `context_length_exceeded`; other OpenAI-compatible servers (vLLM,
llama.cpp, gateways in front of Anthropic or Gemini) say it in words. The body is the upstream's
data: it is read here only to decide whether to retry, then relayed unchanged if we do not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

_CODES = {"context_length_exceeded", "string_above_max_length", "context_window_exceeded"}
_WORDINGS = re.compile(
    r"maximum context length|context length|context window|prompt is too long"
    r"|too many tokens|reduce the length of the messages|exceeds? the (?:model's )?(?:maximum|limit)",
    re.IGNORECASE,
)
_NUMBERS = re.compile(r"(\d[\d,]*)\s*(?:tokens|maximum)", re.IGNORECASE)
_LIMIT = re.compile(r"(?:length|window|limit) (?:is|of) (\d[\d,]*)", re.IGNORECASE)


@dataclass(frozen=True)
class Overflow:
    limit: int | None
    requested: int | None


def parse_overflow(status: int, body: bytes) -> Overflow | None:
    """An Overflow when `body` is a context-length error, else None."""
    if status not in (400, 413, 422):
        return None
    message, code = _error_fields(body)
    if code not in _CODES and not _WORDINGS.search(message):
        return None
    numbers = sorted({int(n.replace(",", "")) for n in _NUMBERS.findall(message)})
    if len(numbers) >= 2:
        # Vendors order the two differently; the request is the one over the limit.
        return Overflow(numbers[0], numbers[-1])
    stated = _LIMIT.search(message)
    return Overflow(int(stated.group(1).replace(",", "")) if stated else None, None)


def _error_fields(body: bytes) -> tuple[str, str]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:4096].decode("utf-8", "replace"), ""
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or ""), str(error.get("code") or "")
    if isinstance(error, str):
        return error, ""
    if isinstance(payload, dict):
        return str(payload.get("message") or payload.get("detail") or ""), ""
    return "", ""
