"""Long conversations of a chosen size for benchmarks: real prose or coding turns, made unique.

`history(tokens, source=...)` returns a chat message list (a system message, then alternating
user/assistant turns, ending on a user message) whose estimated size is at least `tokens`. The
texts come from the shared corpus (locomo's dialogue for prose, mini-swe-agent's runs for coding
work), cycled as often as needed; every message is tagged with its turn number so no two messages
are equal (a content-digest cache must not get repeats for free). The tag's digits are written
as capital letters: a tag of digits gave every message a number and an identifier of its own
(`[c4-1234]`), which the fold's scanners found, kept and verified, 30% of the fold's CPU on prose
spent on the benchmark's own markers rather than on the corpus's text. Without the corpus, a seeded
synthetic prose stands in, and `source_label()` says so.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

from bench.corpus import corpus_dir, has_corpus, read_corpus
from compaction import HeuristicEstimator

_FILES = {"prose": "locomo10.jsonl", "coding": "swe_mini_gemini3pro.jsonl"}
_DIGITS_AS_LETTERS = str.maketrans("0123456789", "ABCDEFGHIJ")
"""Tags are lowercase, so a marker stays as unique as its tag and turn number are."""
_SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer precisely."}


def source_label(source: str) -> str:
    return f"corpus {_FILES[source]}" if has_corpus() else "synthetic prose (no corpus found)"


def history(tokens: int, *, source: str = "prose", tag: str = "") -> list[dict[str, Any]]:
    """A conversation of at least `tokens` estimated tokens; `tag` makes it unique among others
    of the same size (different sessions must not share message bytes)."""
    estimator = HeuristicEstimator()
    messages: list[dict[str, Any]] = [dict(_SYSTEM)]
    total = estimator.count_message(_SYSTEM)
    texts = _texts(source)
    for turn in itertools.count():
        role = "user" if turn % 2 == 0 else "assistant"
        marker = f"{tag}{turn}".translate(_DIGITS_AS_LETTERS)
        message = {"role": role, "content": f"[{marker}] {next(texts)}"}
        messages.append(message)
        total += estimator.count_message(message)
        if total >= tokens and role == "user":
            return messages
    raise AssertionError("unreachable")


def _texts(source: str) -> Iterator[str]:
    if not has_corpus():
        return _synthetic()
    path = corpus_dir() / _FILES[source]
    texts = [
        message["content"]
        for conversation in read_corpus(path)
        for message in conversation["messages"]
        if message["role"] != "system" and isinstance(message.get("content"), str)
    ]
    return itertools.cycle(texts)


def _synthetic() -> Iterator[str]:
    words = [
        *("the", "a", "we", "it", "plan", "test", "file", "server", "check", "value"),
        *("because", "after", "before", "then", "report", "release", "memory", "window"),
        *("summary", "decision", "budget", "cost", "user", "agent", "tool", "result", "error"),
    ]
    rng = random.Random(7)
    while True:
        yield " ".join(rng.choice(words) for _ in range(rng.randint(20, 120))) + "."
