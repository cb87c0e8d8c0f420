"""What the summarizer is asked, and how a summary comes back into the conversation.

Builds the summary, update and memory-extraction requests from the prompt files shipped in
`compaction/prompts/`, asks the model with a timeout (judging whether the answer is usable), and
wraps a summary body in the fixed framing that marks it
(`summary_message`), byte-identically for the same body.

Two kinds of request (`ask_summarizer`): standalone, a summary request and a memory request
that each carry the folded transcript; or, when the summarizer can repeat the conversation's
own last request (a `PrefixLLM`) and the window has room, one question asked as a final user
turn after it (`cached.md`), whose answer carries the summary and the memory items: the
provider's prompt cache covers the conversation, and only the question and the answer are new.
A PrefixLLM never pays a second transcript for the memory items: with too little room after the
conversation for them, or for the question at all, the summary is asked alone (after the
conversation, else standalone) and code mines the items from the folded turns.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from string import Template
from typing import Any

from compaction.marker import SUMMARY_MARKER
from compaction.messages import CHAT, Shape, message_text
from compaction.text import CJK_LETTER
from compaction.types import ChatLLM, Message, PrefixLLM, Purpose

logger = logging.getLogger(__name__)

__all__ = [
    "MIN_CACHED_MEMORY_TOKENS",
    "Question",
    "Reply",
    "ask",
    "ask_both",
    "ask_summarizer",
    "build_cached_question",
    "build_memory_request",
    "build_summary_request",
    "describe_kept",
    "is_substantive",
    "load_prompt",
    "message_text",
    "recall_note",
    "split_answer",
    "summary_message",
    "summary_text",
    "unwrap_summary",
]

MIN_CACHED_MEMORY_TOKENS = 256
"""The least room for memory items that a cached question asks with; with less room left in
the window after the conversation, the question asks for the summary alone (the memory items
mined by code), and with no room for that, the summary is asked standalone (ask_summarizer)."""

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


def describe_kept(messages: Sequence[Message], keep_from: int, shape: Shape = CHAT) -> str:
    """How the cached question names the messages that stay verbatim: how many, and the
    opening words of the first one (a model counts messages badly)."""
    count = len(messages) - keep_from
    if count <= 0:
        return "none of the messages"
    opening = " ".join(shape.read(messages[keep_from]).text.split())[:80]
    named = f"the last {count} messages" if count > 1 else "the last message"
    return f'{named}, from the one that begins "{opening}",' if opening else named


def build_cached_question(
    *, kept: str, previous_summary: bool, max_tokens: int, cjk: bool, memory: bool = True
) -> str:
    """The final user turn of a cached summary request (`cached.md`); with `memory` it asks for
    the memory items too (`cached_memory.md`)."""
    previous = (
        "\nThe conversation opens with a summary of even earlier turns: produce ONE updated "
        "summary that covers both, as if written fresh (newer information wins; keep every fact "
        "of it that is still true).\n"
        if previous_summary
        else ""
    )
    return Template(load_prompt("cached")).substitute(
        kept=kept,
        previous=previous,
        language=language_note(cjk),
        max_tokens=str(max_tokens),
        parts="in the two parts below" if memory else "in the part below",
        memory=load_prompt("cached_memory") if memory else "",
        memory_limit="; at most 30 memory items" if memory else "",
    )


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
    return await _asked(
        lambda: llm.complete(request, purpose=purpose, max_tokens=max_tokens), purpose, timeout_s
    )


async def _asked(call: Callable[[], Awaitable[str]], purpose: Purpose, timeout_s: float) -> Reply:
    try:
        async with asyncio.timeout(timeout_s):
            text = await call()
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


@dataclass(frozen=True)
class Question:
    """What one compaction asks its summarizer, in either kind of request."""

    transcript: str
    """The folded messages as text (what a standalone request carries)."""
    previous_summary: str | None
    """The model's part of the earlier summary being updated, if any."""
    summary_max_tokens: int
    memory_max_tokens: int
    cjk: bool
    kept: str
    """The messages that stay verbatim, as the cached question names them (describe_kept)."""


async def ask_summarizer(
    llm: ChatLLM | None, question: Question, *, timeout_s: float
) -> tuple[Reply, Reply, int]:
    """The summary and the memory items, and how many model calls brought them: one cached
    question when `llm` can ask after the conversation's own request and the window has room
    for it, else two standalone requests asked concurrently (none without a model).

    A summarizer that asks cached but finds no room (a request at a small window's end) asks
    the summary alone standalone: the memory items are mined by code, as when a cached answer
    has no memory part, rather than paid for with a second transcript at the full input price."""
    if llm is None:
        none = Reply(None, None)
        return none, none, 0
    if isinstance(llm, PrefixLLM):
        cached = await _ask_cached(llm, question, timeout_s)
        if cached is not None:
            return *cached, 1
        summary = await ask(
            llm,
            _summary_request(question),
            purpose="summary",
            max_tokens=question.summary_max_tokens,
            timeout_s=timeout_s,
        )
        return summary, Reply(None, None), 1
    summary, memory = await ask_both(
        llm,
        _summary_request(question),
        question.summary_max_tokens,
        build_memory_request(question.transcript, cjk=question.cjk),
        question.memory_max_tokens,
        timeout_s=timeout_s,
    )
    return summary, memory, 2


def _summary_request(question: Question) -> list[Message]:
    """The standalone summary request: built only when asked (it copies the whole transcript,
    which a cached question does not carry)."""
    return build_summary_request(
        question.transcript,
        previous_summary=question.previous_summary,
        max_tokens=question.summary_max_tokens,
        cjk=question.cjk,
    )


def _cached_question(question: Question, *, memory: bool) -> str:
    return build_cached_question(
        kept=question.kept,
        previous_summary=question.previous_summary is not None,
        max_tokens=question.summary_max_tokens,
        cjk=question.cjk,
        memory=memory,
    )


def _room_after(llm: PrefixLLM, instruction: str, question: Question) -> int:
    """The tokens the window leaves after the conversation, the question and the summary.

    A bound of the question's tokens that needs no estimator: no tokenizer counts fewer than
    one token for three characters of this prompt's prose."""
    return llm.room_after_prefix - len(instruction) // 3 - question.summary_max_tokens


async def _ask_cached(
    llm: PrefixLLM, question: Question, timeout_s: float
) -> tuple[Reply, Reply] | None:
    """The cached question's two replies; None when the window has too little room after the
    conversation even for the summary (a request near the window's end: standalone instead).
    With room for the summary but not for the memory items, the question asks for the summary
    alone and code mines the memory items from the folded turns (as when a model answers
    without them): one call at the cached price rather than two at the full one."""
    instruction = _cached_question(question, memory=True)
    memory_max_tokens = min(question.memory_max_tokens, _room_after(llm, instruction, question))
    if memory_max_tokens < MIN_CACHED_MEMORY_TOKENS:
        instruction = _cached_question(question, memory=False)
        if _room_after(llm, instruction, question) < 0:
            return None
        memory_max_tokens = 0
    max_tokens = question.summary_max_tokens + memory_max_tokens
    reply = await _asked(
        lambda: llm.complete_after_prefix(instruction, purpose="summary", max_tokens=max_tokens),
        "summary",
        timeout_s,
    )
    if reply.text is None:
        return reply, Reply(None, None)
    summary, memory = split_answer(reply.text)
    summary_reply = (
        Reply(summary, None)
        if is_substantive(summary)
        else _failed("summary", "empty or nonsensical answer")
    )
    if memory is None and memory_max_tokens:
        # The summary stands; the memory items are mined from the folded turns by code.
        logger.info("the cached summary answer has no <memory> part: memory items mined by code")
    return summary_reply, Reply(memory, None)


_MEMORY_PART = re.compile(r"<memory>(.*?)(?:</memory>|\Z)", re.DOTALL | re.IGNORECASE)


def split_answer(text: str) -> tuple[str, str | None]:
    """A cached question's answer as its summary (the `<summary>` part, or everything but the
    memory part) and its memory part (None when it has none)."""
    found = _MEMORY_PART.search(text)
    if found is None:
        return unwrap_summary(text), None
    rest = text[: found.start()] + text[found.end() :]
    return unwrap_summary(rest), found.group(1).strip()
