"""What the summarizer sees and what the conversation gets back.

Renders the folded messages as a bounded transcript (tool outputs clipped first, then assistant
text; user requests last and never dropped), builds the summary, update and memory-extraction
requests from the prompt files shipped in `compaction/prompts/`, and wraps a summary body in the
fixed framing that marks it (`summary_message`), byte-identically for the same body.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from string import Template
from typing import Any

import orjson

from compaction.marker import SUMMARY_MARKER, is_summary_message
from compaction.types import Message, TokenEstimator, is_message

OBSERVATION_PREFIX = "<returncode>"
"""mini-swe-agent returns shell output as a user message that starts with this tag."""

CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
"""Kana, CJK ideographs and Hangul: the characters that count as words on their own."""
_CJK = re.compile(f"[{CJK_CHARS}]")

# Successive clipping limits in characters: (tool output, assistant text, user request).
# Tool outputs give way first, then assistant prose; user requests only at the end, and only
# down to a readable head and tail, never away.
_STAGES: tuple[tuple[int, int | None, int | None], ...] = (
    (2000, None, None),
    (800, 4000, None),
    (300, 1500, None),
    (120, 500, 4000),
    (60, 200, 1500),
    (0, 100, 600),
)


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


# ---------------------------------------------------------------- reading messages


def message_text(message: Any) -> str:
    """The readable text of a message's content: strings, text parts, placeholders for media."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif isinstance(part.get("type"), str):
            pieces.append(f"[{part['type']}]")
    return "\n".join(pieces)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """The raw JSON text the model produced (may be invalid JSON)."""

    def parsed(self) -> dict[str, Any]:
        """The arguments as a dict; {} when they are not a JSON object."""
        try:
            value = orjson.loads(self.arguments)
        except orjson.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}


def tool_calls(message: Any) -> list[ToolCall]:
    """The well-formed function calls an assistant message makes."""
    if not is_message(message) or message["role"] != "assistant":
        return []
    calls = message.get("tool_calls")
    found: list[ToolCall] = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            arguments = function.get("arguments")
            found.append(
                ToolCall(function["name"], arguments if isinstance(arguments, str) else "")
            )
    return found


def is_observation(message: Any) -> bool:
    """A user message that is really a tool's output (mini-swe-agent's text protocol)."""
    return (
        is_message(message)
        and message["role"] == "user"
        and isinstance(message.get("content"), str)
        and message["content"].lstrip().startswith(OBSERVATION_PREFIX)
    )


def is_user_request(message: Any) -> bool:
    """A message the user wrote: not a summary, not a tool observation."""
    return (
        is_message(message)
        and message["role"] == "user"
        and not is_summary_message(message)
        and not is_observation(message)
    )


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


# ---------------------------------------------------------------- the transcript


def clip_middle(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, keeping its head and tail and saying how much went."""
    if len(text) <= limit:
        return text
    if limit <= 0:
        return f"[… {len(text)} chars omitted …]"
    head = limit * 2 // 3
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[… {omitted} chars omitted …]\n{text[len(text) - tail :]}"


@dataclass(frozen=True)
class _Entry:
    kind: str  # "user" | "assistant" | "tool" | "other"
    label: str
    text: str
    calls: str = ""

    def render(self, limits: tuple[int, int | None, int | None]) -> str:
        tool_limit, assistant_limit, user_limit = limits
        limit = {"tool": tool_limit, "assistant": assistant_limit, "user": user_limit}.get(
            self.kind, assistant_limit
        )
        body = self.text if limit is None else clip_middle(self.text, limit)
        if self.calls:
            calls = (
                self.calls if assistant_limit is None else clip_middle(self.calls, assistant_limit)
            )
            body = f"{body}\n{calls}" if body else calls
        return f"[{self.label}]\n{body}".rstrip()


def _entry(message: Any) -> _Entry:
    if not is_message(message):
        return _Entry("other", "malformed item", clip_middle(repr(message), 200))
    role = message["role"]
    text = message_text(message)
    if role == "tool":
        return _Entry("tool", "tool result", text)
    if is_observation(message):
        return _Entry("tool", "command output", text)
    if role == "user":
        return _Entry("user", "user", text)
    if role == "assistant":
        calls = "\n".join(f"→ {c.name}({c.arguments})" for c in tool_calls(message))
        return _Entry("assistant", "assistant", text, calls)
    return _Entry("other", role, text)


def render_transcript(
    messages: Sequence[Any],
    indices: Iterable[int],
    *,
    estimator: TokenEstimator,
    max_tokens: int,
    tool_output_clip_chars: int = 2000,
) -> str:
    """The messages at `indices` as a labelled transcript of at most about `max_tokens` tokens.

    Each stage clips harder until the transcript fits; if even the last stage does not, only the
    user requests (clipped) remain, and then the whole text is cut in the middle.
    """
    entries = [_entry(messages[i]) for i in indices if not is_summary_message(messages[i])]
    stages = [(tool_output_clip_chars, None, None), *_STAGES[1:]]
    text = ""
    for limits in stages:
        text = "\n\n".join(e.render(limits) for e in entries)
        if estimator.count_text(text) <= max_tokens:
            return text
    users = [e.render(_STAGES[-1]) for e in entries if e.kind == "user"]
    omitted = len(entries) - len(users)
    text = f"[… {omitted} non-user messages omitted …]\n\n" + "\n\n".join(users)
    tokens = estimator.count_text(text)
    if tokens > max_tokens:
        text = clip_middle(text, int(len(text) * max_tokens / tokens * 0.95))
    return text
