"""Recognise an upstream's "your prompt is too long" answer, and what it says about the limit.

OpenAI answers 400 with code `context_length_exceeded`; other OpenAI-compatible servers (vLLM,
llama.cpp, gateways in front of Anthropic or Gemini) say it in words. The body is the upstream's
data: it is read here only to decide whether to retry, then relayed unchanged if we do not.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import orjson
from cachetools import LRUCache

log = logging.getLogger(__name__)

_CODES = {"context_length_exceeded", "string_above_max_length", "context_window_exceeded"}
_WORDINGS = re.compile(
    r"maximum context length|context length|context window|prompt is too long"
    r"|too many tokens|reduce the length of the messages|exceeds? the (?:model's )?(?:maximum|limit)"
    r"|exceed context limit",
    re.IGNORECASE,
)
_N = r"(\d[\d,]*)"
# "maximum context length is 8192 tokens", "context window of 128000", "limit is 4096"
_LIMIT = re.compile(rf"(?:length|window|limit)(?: is| of)? {_N}", re.IGNORECASE)
# "prompt is too long: 210000 tokens > 200000 maximum"
_OVER = re.compile(rf"{_N} tokens? > {_N}", re.IGNORECASE)
# Anthropic, when prompt + max_tokens is over: "input length and `max_tokens` exceed context
# limit: 188240 + 21333 > 200000" (prompt, max_tokens, limit).
_SUM_OVER = re.compile(rf"{_N} \+ {_N} > {_N}")
# The prompt's own count, best first: "8000 tokens in the messages", "resulted in 9500 tokens",
# "requested 9000 tokens" (that one includes the completion).
_PROMPT = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        rf"{_N} tokens in the messages",
        rf"resulted in {_N} tokens",
        rf"requested {_N} tokens",
    )
)


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
    over = _OVER.search(message)
    if over:
        return Overflow(_int(over.group(2)), _int(over.group(1)))
    summed = _SUM_OVER.search(message)
    if summed:
        return Overflow(_int(summed.group(3)), _int(summed.group(1)))
    limit = _LIMIT.search(message)
    prompt = next((found for pattern in _PROMPT if (found := pattern.search(message))), None)
    return Overflow(
        _int(limit.group(1)) if limit else None,
        _int(prompt.group(1)) if prompt else None,
    )


# A stated limit below this is a misread message, not a model's window: never learned.
_MIN_WINDOW = 512


class LearnedWindows:
    """Context windows the upstream stated in its overflow errors, per model (a bounded number
    of models). From then on they cap the configured window: a proxy configured for 128k in
    front of a 4k model learns it from the first error, and says once how to configure it."""

    def __init__(self, max_models: int = 1024) -> None:
        self._windows: LRUCache[str, int] = LRUCache(max_models)
        # Asked by every request (the byte bound), changed only by `learn`: worked out there.
        self._smallest: int | None = None

    def window(self, model: str, configured: int) -> int:
        learned = self._windows.get(model)
        return configured if learned is None else min(configured, learned)

    def smallest(self) -> int | None:
        return self._smallest

    def learn(self, model: str, limit: int, configured: int) -> None:
        """`limit` is what the upstream said `model` takes; kept when below what we assumed."""
        if limit < _MIN_WINDOW or limit >= self.window(model, configured):
            return
        first = model not in self._windows
        self._windows[model] = limit
        self._smallest = min(self._windows.values())
        if first:
            log.warning(
                "the upstream says model %r takes at most %d tokens, below the %d assumed; "
                "using %d from now on (set models.context_windows to make it permanent)",
                model,
                limit,
                configured,
                limit,
                extra={"model": model, "learned_window": limit},
            )


def _int(text: str) -> int:
    return int(text.replace(",", ""))


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
