"""What the summarizer is asked, and how a summary comes back into the conversation.

Builds the summary, update and memory-extraction requests from the prompt files shipped in
`compaction/prompts/`, asks the model with a timeout (judging whether the answer is usable), and
wraps a summary body in the fixed framing that marks it
(`summary_message`), byte-identically for the same body.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from string import Template
from typing import Any

from compaction.marker import SUMMARY_MARKER
from compaction.messages import CHAT, Shape, message_text
from compaction.text import CJK_LETTER
from compaction.types import ChatLLM, Message, Purpose

__all__ = [
    "Reply",
    "ask",
    "ask_both",
    "build_memory_request",
    "build_summary_request",
    "is_substantive",
    "load_prompt",
    "message_text",
    "recall_note",
    "summary_message",
    "summary_text",
    "unwrap_summary",
]

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
def _framing(recall: bool = False) -> tuple[str, str]:
    """The framing text before and after the summary body; `recall`: with the line saying that
    the folded turns can be recalled (see recall_note)."""
    note = f"{load_prompt('recall_note')}\n" if recall else ""
    framed = Template(load_prompt("framing")).safe_substitute(marker=SUMMARY_MARKER, recall=note)
    before, after = framed.split("$summary", 1)
    if not before.startswith(SUMMARY_MARKER):
        raise ValueError("framing.md must start with the summary marker")
    return before, after


@cache
def recall_note() -> tuple[str, str]:
    """(anchor, line): in a summary message's framing, the one line telling the model that the
    folded turns can be recalled with the `recall` tool goes right after `anchor` (the end of
    the framing's line before it). The proxy adds it to the summary of a request that carries
    that tool; a summary without it is the framing as without recall, byte for byte."""
    plain, _ = _framing()
    with_note, _ = _framing(recall=True)
    at = next(i for i, (a, b) in enumerate(zip(plain, with_note, strict=False)) if a != b)
    line = with_note[at : at + len(with_note) - len(plain)]
    return plain[max(0, at - 48) : at], line


def summary_message(text: str, shape: Shape = CHAT) -> Any:
    """The message that replaces the folded span; the same text gives a byte-identical message."""
    before, after = _framing()
    return shape.summary_message(f"{before}{text.strip()}{after}")


def summary_text(message: Any, shape: Shape = CHAT) -> str:
    """The body of a summary message (framing and marker removed); "" for anything else.

    Summaries framed differently (an older release, a test) lose only their marker.
    """
    if not shape.is_summary(message):
        return ""
    content = shape.read(message).text
    before, after = _framing()
    content = content.replace(recall_note()[1], "", 1)
    if content.startswith(before) and content.endswith(after):
        return content[len(before) : len(content) - len(after)].strip()
    return content[len(SUMMARY_MARKER) :].strip()


_WRAPPER = re.compile(r"<summary>\s*(.*)\s*</summary>", re.DOTALL | re.IGNORECASE)
_ANALYSIS = re.compile(r"\A\s*<analysis>.*?</analysis>\s*", re.DOTALL | re.IGNORECASE)


def unwrap_summary(text: str) -> str:
    """A model's summary without its own `<summary>…</summary>` wrapper (and an `<analysis>`
    block before it): our framing wraps the body once, never a summary inside a summary."""
    stripped = _ANALYSIS.sub("", text.strip(), count=1)
    found = _WRAPPER.search(stripped)
    return found.group(1).strip() if found else stripped.strip()


# ---------------------------------------------------------------- asking the model

_REFUSAL = re.compile(
    r"^\s*(?:i'?m sorry|i am sorry|sorry,|i can(?:no|')t|i'?m unable|i am unable|as an ai)",
    re.IGNORECASE,
)
_WORDS = re.compile(r"[^\W\d_]{2,}")


def is_substantive(text: str) -> bool:
    """A usable model answer: three words or more (a CJK character counts as one), no refusal."""
    stripped = text.strip()
    if not stripped or _REFUSAL.match(stripped):
        return False
    return len(_WORDS.findall(stripped)) + len(CJK_LETTER.findall(stripped)) >= 3


@dataclass(frozen=True)
class Reply:
    """The model's usable text, or why there is none (None and None: no model was asked)."""

    text: str | None
    error: str | None


async def ask(
    llm: ChatLLM, request: list[Message], *, purpose: Purpose, max_tokens: int, timeout_s: float
) -> Reply:
    """One call to the summarizing model; every failure becomes a Reply with an error."""
    try:
        async with asyncio.timeout(timeout_s):
            text = await llm.complete(request, purpose=purpose, max_tokens=max_tokens)
    except TimeoutError:
        return _failed(purpose, f"timed out after {timeout_s:g} s")
    except Exception as exc:  # any failure of the summarizer means: fall back
        return _failed(purpose, f"{type(exc).__name__}: {exc}")
    if not isinstance(text, str) or (purpose == "summary" and not is_substantive(text)):
        return _failed(purpose, "empty or nonsensical answer")
    return Reply(text, None)


def _failed(purpose: Purpose, why: str) -> Reply:
    return Reply(None, f"{purpose} call failed: {why}")


async def ask_both(
    llm: ChatLLM | None,
    summary_request: list[Message],
    summary_max_tokens: int,
    memory_request: list[Message],
    memory_max_tokens: int,
    *,
    timeout_s: float,
) -> tuple[Reply, Reply]:
    """The summary and the memory extraction, asked concurrently; no model gives two empty
    replies without errors."""
    if llm is None:
        none = Reply(None, None)
        return none, none
    summary, memory = await asyncio.gather(
        ask(
            llm,
            summary_request,
            purpose="summary",
            max_tokens=summary_max_tokens,
            timeout_s=timeout_s,
        ),
        ask(
            llm, memory_request, purpose="memory", max_tokens=memory_max_tokens, timeout_s=timeout_s
        ),
    )
    return summary, memory
