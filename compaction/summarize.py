"""What the summarizer is asked, and how a summary comes back into the conversation.

Builds the summary, update and memory-extraction requests from the prompt files shipped in
`compaction/prompts/`, and wraps a summary body in the fixed framing that marks it
(`summary_message`), byte-identically for the same body.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from string import Template
from typing import Any

from compaction.marker import SUMMARY_MARKER, is_summary_message
from compaction.messages import is_message, is_user_request, message_text
from compaction.types import Message

__all__ = [
    "build_memory_request",
    "build_summary_request",
    "is_cjk_dominant",
    "load_prompt",
    "message_text",
    "prose_texts",
    "summary_message",
    "summary_text",
]

CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
"""Kana, CJK ideographs and Hangul: the characters that count as words on their own."""
_CJK = re.compile(f"[{CJK_CHARS}]")


# ---------------------------------------------------------------- prompts


@cache
def load_prompt(name: str) -> str:
    """The text of `compaction/prompts/{name}.md`, read once as package data."""
    source = resources.files("compaction").joinpath("prompts", f"{name}.md")
    return source.read_text(encoding="utf-8").rstrip("\n")


def language_note(cjk: bool) -> str:
    return load_prompt("language_cjk" if cjk else "language_other")


def build_summary_request(
    transcript: str, *, previous_summary: str | None, max_tokens: int, cjk: bool
) -> list[Message]:
    """The chat request for a fresh summary, or for an update when there is a previous one."""
    fields = {"language": language_note(cjk), "max_tokens": str(max_tokens)}
    if previous_summary is None:
        system = Template(load_prompt("summary")).substitute(fields)
        user = f"<transcript>\n{transcript}\n</transcript>"
    else:
        system = Template(load_prompt("update")).substitute(fields)
        user = (
            f"<current_summary>\n{previous_summary}\n</current_summary>\n\n"
            f"<new_messages>\n{transcript}\n</new_messages>"
        )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def build_memory_request(transcript: str, *, cjk: bool) -> list[Message]:
    system = Template(load_prompt("memory")).substitute(language=language_note(cjk))
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"<transcript>\n{transcript}\n</transcript>"},
    ]


# ---------------------------------------------------------------- the summary message


@cache
def _framing() -> tuple[str, str]:
    """The framing text before and after the summary body."""
    framed = Template(load_prompt("framing")).safe_substitute(marker=SUMMARY_MARKER)
    before, after = framed.split("$summary", 1)
    if not before.startswith(SUMMARY_MARKER):
        raise ValueError("framing.md must start with the summary marker")
    return before, after


def summary_message(text: str) -> Message:
    """The message that replaces the folded span; the same text gives a byte-identical message."""
    before, after = _framing()
    return {"role": "user", "content": f"{before}{text.strip()}{after}"}


def summary_text(message: Any) -> str:
    """The body of a summary message (framing and marker removed); "" for anything else.

    Summaries framed differently (an older release, a test) lose only their marker.
    """
    if not is_summary_message(message):
        return ""
    content: str = message["content"]
    before, after = _framing()
    if content.startswith(before) and content.endswith(after):
        return content[len(before) : len(content) - len(after)].strip()
    return content[len(SUMMARY_MARKER) :].strip()


# ---------------------------------------------------------------- language


def is_cjk_dominant(texts: Iterable[str]) -> bool:
    """True when at least a quarter of the letters are CJK (they carry more per character)."""
    cjk = letters = 0
    for text in texts:
        cjk += len(_CJK.findall(text))
        letters += sum(1 for ch in text if ch.isalpha())
    return letters > 0 and cjk * 4 >= letters


def prose_texts(messages: Sequence[Any], indices: Iterable[int]) -> list[str]:
    """What the user and assistant wrote (no tool output), for language detection."""
    return [
        message_text(messages[i])
        for i in indices
        if is_user_request(messages[i])
        or (is_message(messages[i]) and messages[i]["role"] == "assistant")
    ]
