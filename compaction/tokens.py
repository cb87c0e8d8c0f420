"""Token estimation without a tokenizer: fast character-class arithmetic, calibrated.

Counts what the upstream counts for a chat request: message contents (strings and part arrays),
tool calls, ids, names, a per-message overhead, and the `tools` definitions. CJK text costs about
two thirds of a token per character for gpt-4o's tokenizer (about one for gpt-4's), ASCII about
a quarter (see `Rates`, fitted with the real vocabularies in bench/token_accuracy.py). Classes
are mixed per character, not per message, using C-speed string operations rather than a Python
loop over characters, so a 128k-token request is estimated in a few milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from compaction.types import TokenEstimator

MESSAGE_OVERHEAD_TOKENS = 4
"""Role and separators the chat template wraps around every message."""

TOOL_CALL_OVERHEAD_TOKENS = 8
"""The call's id, type and the JSON framing around name and arguments."""

REPLY_PRIMING_TOKENS = 3
"""The assistant header the upstream appends before generating."""

IMAGE_LOW_TOKENS = 85
IMAGE_HIGH_TOKENS = 765
"""OpenAI's published costs: `detail: low` is flat; high/auto is typically a 2x2-tile image."""

AUDIO_PART_TOKENS = 200
FILE_PART_TOKENS = 500
"""Rough flat costs: their real cost depends on media we do not decode."""


@dataclass(frozen=True)
class Rates:
    """Tokens per character class for one tokenizer family, fitted with its real vocabulary."""

    ascii_chars_per_token: float
    cjk_tokens_per_char: float  # Han, kana, CJK punctuation, fullwidth forms
    hangul_tokens_per_char: float
    other_tokens_per_char: float  # accented Latin, Cyrillic, Greek, Arabic, emoji...


O200K = Rates(4.0, 0.66, 0.52, 0.25)
"""gpt-4o / gpt-4.1 / o-series (o200k_base): Chinese and Japanese about 1.5 characters a token."""

CL100K = Rates(4.0, 0.9, 1.05, 0.4)
"""gpt-4 / gpt-3.5 (cl100k_base): CJK about one token per character."""

SPARSE_WIDE_RATIO = 64
"""Text with under one non-ASCII character in this many counts them all at the CJK rate."""

_CJK = re.compile(
    "[\u2e80-\u2fdf"  # CJK radicals
    "\u3000-\u303f"  # CJK punctuation
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3100-\u312f"  # Bopomofo
    "\u31a0-\u31ff"  # Bopomofo extended, strokes, Katakana extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff00-\uffef"  # fullwidth and halfwidth forms
    "\U00020000-\U0003134f]"  # CJK extensions B-G
)
_HANGUL = re.compile("[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")


def _count_matches(pattern: re.Pattern[str], text: str) -> int:
    return len(text) - len(pattern.sub("", text))


def _json_text(item: Any) -> str:
    """Any item as the JSON text the upstream would see; never raises."""
    try:
        return orjson.dumps(item, default=str).decode()
    except (TypeError, orjson.JSONEncodeError):
        return repr(item)


class HeuristicEstimator:
    """A TokenEstimator from character classes; `calibration` scales every count.

    The proxy learns `calibration` as upstream `usage.prompt_tokens` / our estimate.
    """

    def __init__(self, calibration: float = 1.0, rates: Rates = O200K) -> None:
        self.calibration = calibration
        self.rates = rates

    def count_text(self, text: str) -> int:
        return round(self._raw_text(text) * self.calibration)

    def count_message(self, message: Any) -> int:
        return round(self._raw_message(message) * self.calibration)

    def count_tools(self, tools: Any) -> int:
        if not tools:
            return 0
        return round(self._raw_text(_json_text(tools)) * self.calibration)

    def _raw_text(self, text: str) -> float:
        rates = self.rates
        if text.isascii():
            return len(text) / rates.ascii_chars_per_token
        ascii_chars = len(text.encode("ascii", "ignore"))
        wide_chars = len(text) - ascii_chars
        if wide_chars * SPARSE_WIDE_RATIO <= len(text):
            # A few quotes, dashes or accents in ASCII text (code, logs): not worth a regex scan,
            # which costs ten times the encode on a megabyte of output.
            return (
                ascii_chars / rates.ascii_chars_per_token + wide_chars * rates.cjk_tokens_per_char
            )
        cjk_chars = _count_matches(_CJK, text)
        hangul_chars = _count_matches(_HANGUL, text)
        other_chars = wide_chars - cjk_chars - hangul_chars
        return (
            ascii_chars / rates.ascii_chars_per_token
            + cjk_chars * rates.cjk_tokens_per_char
            + hangul_chars * rates.hangul_tokens_per_char
            + other_chars * rates.other_tokens_per_char
        )

    def _raw_malformed(self, item: Any) -> float:
        return self._raw_text(_json_text(item))

    def _raw_message(self, message: Any) -> float:
        if not isinstance(message, dict):
            return MESSAGE_OVERHEAD_TOKENS + self._raw_malformed(message)
        total = float(MESSAGE_OVERHEAD_TOKENS)
        total += self._raw_content(message.get("content"))
        for key in ("name", "tool_call_id"):
            value = message.get(key)
            if isinstance(value, str):
                total += self._raw_text(value)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            total += sum(self._raw_call(call) for call in calls)
        elif calls is not None:
            total += self._raw_malformed(calls)
        return total

    def _raw_content(self, content: Any) -> float:
        if content is None:
            return 0.0
        if isinstance(content, str):
            return self._raw_text(content)
        if isinstance(content, list):
            return sum(self._raw_part(part) for part in content)
        return self._raw_malformed(content)

    def _raw_part(self, part: Any) -> float:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            return self._raw_text(part["text"])
        if kind == "image_url":
            image = part.get("image_url")
            detail = image.get("detail") if isinstance(image, dict) else None
            return IMAGE_LOW_TOKENS if detail == "low" else IMAGE_HIGH_TOKENS
        if kind == "input_audio":
            return AUDIO_PART_TOKENS
        if kind == "file":
            return FILE_PART_TOKENS
        return self._raw_malformed(part)

    def _raw_call(self, call: Any) -> float:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return self._raw_malformed(call)
        total = float(TOOL_CALL_OVERHEAD_TOKENS)
        for key in ("name", "arguments"):
            value = function.get(key)
            if isinstance(value, str):
                total += self._raw_text(value)
            elif value is not None:
                total += self._raw_malformed(value)
        return total


def estimate_request(messages: Sequence[Any], tools: Any, estimator: TokenEstimator) -> int:
    """Prompt tokens of a chat request: every message, the tool definitions, reply priming."""
    return (
        sum(estimator.count_message(m) for m in messages)
        + estimator.count_tools(tools)
        + REPLY_PRIMING_TOKENS
    )
