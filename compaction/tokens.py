"""Token estimation without a tokenizer: fast character-class arithmetic, calibrated.

Counts what the upstream counts for a request: each message as its shape measures it (for chat:
contents, tool calls, ids, names and a per-message overhead, see messages.ChatShape.measure),
and the `tools` definitions. CJK text costs about
two thirds of a token per character for gpt-4o's tokenizer (about one for gpt-4's), ASCII about
a quarter (see `Rates`, fitted with the real vocabularies in bench/token_accuracy.py). Classes
are mixed per character, not per message, using C-speed string operations rather than a Python
loop over characters, so a 128k-token request is estimated in a few milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from compaction.messages import CHAT, Shape, json_text
from compaction.types import Message, TokenEstimator, Tools

REPLY_PRIMING_TOKENS = 3
"""The assistant header the upstream appends before generating."""


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


class HeuristicEstimator:
    """A TokenEstimator from character classes; `calibration` scales every count.

    The proxy learns `calibration` as upstream `usage.prompt_tokens` / our estimate.
    """

    def __init__(self, calibration: float = 1.0, rates: Rates = O200K, shape: Shape = CHAT) -> None:
        self.calibration = calibration
        self.rates = rates
        self.shape = shape

    def count_text(self, text: str) -> int:
        return round(self._raw_text(text) * self.calibration)

    def count_message(self, message: object) -> int:
        return round(self.shape.measure(message, self._raw_text) * self.calibration)

    def count_messages(self, messages: Sequence[Message]) -> list[int]:
        """`count_message` of each message, its lookups made once for the whole list."""
        measure, text_cost, calibration = self.shape.measure, self._raw_text, self.calibration
        return [round(measure(message, text_cost) * calibration) for message in messages]

    def count_tools(self, tools: Tools) -> int:
        if not tools:
            return 0
        return round(self._raw_text(json_text(tools)) * self.calibration)

    def least_tokens(self, chars: int) -> float:
        """A lower bound of `count_text` for any text of `chars` characters (before rounding):
        every character at the cheapest of the rates. Lets a caller skip counting a text it
        only wants if it fits a budget."""
        rates = self.rates
        cheapest = min(
            1 / rates.ascii_chars_per_token,
            rates.cjk_tokens_per_char,
            rates.hangul_tokens_per_char,
            rates.other_tokens_per_char,
        )
        return chars * cheapest * self.calibration * (1 - 1e-9)

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


def count_messages(messages: Sequence[Message], estimator: TokenEstimator) -> list[int]:
    """The tokens of each message (a list parallel to `messages`): a plan counts every message
    of the history."""
    if type(estimator) is HeuristicEstimator:  # a subclass may count one message its own way
        return estimator.count_messages(messages)
    return list(map(estimator.count_message, messages))


def estimate_request(messages: Sequence[Message], tools: Tools, estimator: TokenEstimator) -> int:
    """Prompt tokens of a chat request: every message, the tool definitions, reply priming."""
    return (
        sum(count_messages(messages, estimator))
        + estimator.count_tools(tools)
        + REPLY_PRIMING_TOKENS
    )
