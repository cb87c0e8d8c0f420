"""Conversation builders and hypothesis strategies shared by the test packages.

Every builder returns fresh dicts (tests check identity with `is`), and call ids are unique
within one conversation. Other test packages import this module read-only: keep the signatures.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from hypothesis import strategies as st

from compaction.marker import SUMMARY_MARKER
from compaction.types import Message

CJK_SAMPLE = (
    "我们需要在周五之前完成数据库迁移。ファイルを確認してください。한국어 문장도 있습니다。"
)
ENGLISH_SAMPLE = "The quick brown fox jumps over the lazy dog while the build keeps failing. "
CODE_SAMPLE = 'def handler(request):\n    return {"status": 200, "path": request.path}\n'

_call_ids = itertools.count()


# ---------------------------------------------------------------- single messages


def system(text: str = "You are a careful coding assistant.") -> Message:
    return {"role": "system", "content": text}


def developer(text: str = "Answer in the user's language.") -> Message:
    return {"role": "developer", "content": text}


def user(text: str = "Please fix the failing test.") -> Message:
    return {"role": "user", "content": text}


def assistant(text: str | None = "Done.") -> Message:
    return {"role": "assistant", "content": text}


def summary(text: str = "Goals: fix the build. Files: src/app.py.") -> Message:
    """An earlier summary this library inserted (recognised by is_summary_message)."""
    return {"role": "user", "content": f"{SUMMARY_MARKER}\n{text}"}


def new_call_id() -> str:
    """A call id unique across the whole test session."""
    return f"call_{next(_call_ids):06d}"


def tool_call(
    call_id: str | None = None, name: str = "bash", arguments: dict[str, Any] | None = None
) -> dict[str, Any]:
    args = arguments if arguments is not None else {"command": "ls -la src/"}
    return {
        "id": call_id or new_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(args).decode()},
    }


def assistant_calls(*calls: dict[str, Any], content: str | None = None) -> Message:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def tool_result(call_id: str, content: str = "ok") -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def tool_block(
    n_calls: int = 1, *, output: str = "total 0\n-rw-r--r-- app.py", thought: str | None = None
) -> list[Message]:
    """An assistant message with `n_calls` parallel calls followed by one result per call."""
    calls = [tool_call() for _ in range(n_calls)]
    return [assistant_calls(*calls, content=thought)] + [
        tool_result(c["id"], output) for c in calls
    ]


def content_parts(text: str = "What is in this picture?", detail: str = "high") -> Message:
    """A user message whose content is a part array (text + image)."""
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": "https://x.test/a.png", "detail": detail}},
        ],
    }


def malformed_items() -> list[Any]:
    """Items a real client might send that the library must keep in place without crashing."""
    return [
        tool_result("call_orphan", "result of a call nobody made"),
        assistant_calls(tool_call("call_unanswered")),
        {"role": "narrator", "content": "an unknown role"},
        {"role": "assistant", "content": None},
        {"content": "no role at all"},
        "not a dict",
        None,
        {"role": "user", "content": [1, {"weird": True}, {"type": "text"}]},
    ]


# ---------------------------------------------------------------- whole conversations


def simple_round(i: int, *, words: int = 20) -> list[Message]:
    """One user/assistant exchange of roughly `words` words each."""
    body = " ".join(f"w{i}x{j}" for j in range(words))
    return [user(f"Request {i}: {body}"), assistant(f"Answer {i}: {body}")]


def simple_conversation(
    rounds: int, *, words: int = 20, system_prompt: str | None = "You are helpful."
) -> list[Message]:
    """A system head (unless None) followed by `rounds` user/assistant rounds."""
    head = [system(system_prompt)] if system_prompt is not None else []
    return head + [m for i in range(rounds) for m in simple_round(i, words=words)]


def tool_round(
    i: int, *, blocks: int = 3, calls_per_block: int = 1, output_chars: int = 200
) -> list[Message]:
    """A user request followed by `blocks` tool blocks and a final assistant answer."""
    output = ("line of output " * (output_chars // 15 + 1))[:output_chars]
    msgs = [user(f"Task {i}: edit src/module_{i}.py and run the tests")]
    for _ in range(blocks):
        msgs += tool_block(calls_per_block, output=output)
    msgs.append(assistant(f"Finished task {i}."))
    return msgs


def agent_conversation(
    rounds: int = 3, *, blocks: int = 5, calls_per_block: int = 1, output_chars: int = 200
) -> list[Message]:
    """A coding-agent history: system head, then rounds that are mostly tool blocks."""
    msgs = [system()]
    for i in range(rounds):
        msgs += tool_round(
            i, blocks=blocks, calls_per_block=calls_per_block, output_chars=output_chars
        )
    return msgs


def single_task_conversation(blocks: int = 300, *, output_chars: int = 400) -> list[Message]:
    """One user task followed by hundreds of tool blocks: the round that must be cut inside."""
    return agent_conversation(1, blocks=blocks, output_chars=output_chars)


# ---------------------------------------------------------------- hypothesis strategies

_TEXT_ALPHABETS = st.sampled_from(
    [ENGLISH_SAMPLE, CODE_SAMPLE, CJK_SAMPLE, ENGLISH_SAMPLE + CJK_SAMPLE]
)


@st.composite
def texts(draw: st.DrawFn, max_repeat: int = 30) -> str:
    """English, code, CJK or mixed text of varying length."""
    base = draw(_TEXT_ALPHABETS)
    start = draw(st.integers(0, len(base) - 1))
    return base[start:] + base * draw(st.integers(0, max_repeat))


@st.composite
def blocks(draw: st.DrawFn, malformed: bool = False) -> list[Any]:
    """One block's messages: a plain message, a tool block (parallel calls), or a malformed item."""
    kinds = ["assistant", "tool", "parts"] + (["malformed"] if malformed else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "assistant":
        return [assistant(draw(texts()))]
    if kind == "tool":
        return tool_block(
            draw(st.integers(1, 4)), output=draw(texts()), thought=draw(st.none() | texts(3))
        )
    if kind == "parts":
        return [content_parts(draw(texts(5)), draw(st.sampled_from(["low", "high", "auto"])))]
    items = malformed_items()
    return [items[draw(st.integers(0, len(items) - 1))]]


@st.composite
def rounds(draw: st.DrawFn, malformed: bool = False, max_blocks: int = 6) -> list[Any]:
    """A user message and up to `max_blocks` blocks."""
    msgs: list[Any] = [user(draw(texts(10)))]
    for _ in range(draw(st.integers(0, max_blocks))):
        msgs += draw(blocks(malformed))
    return msgs


@st.composite
def conversations(
    draw: st.DrawFn, *, malformed: bool = False, max_rounds: int = 12, max_blocks: int = 6
) -> list[Any]:
    """A whole history: optional system/developer head, optional earlier summary or preamble,
    then rounds (tool blocks, parallel calls, part arrays, CJK; malformed items if asked)."""
    msgs: list[Any] = []
    if draw(st.booleans()):
        msgs.append(system(draw(texts(5))))
        if draw(st.booleans()):
            msgs.append(developer())
    if draw(st.booleans()):
        msgs.append(summary(draw(texts(10))))
    if draw(st.booleans()):
        msgs.append(assistant("Hello, how can I help?"))
    for _ in range(draw(st.integers(0, max_rounds))):
        msgs += draw(rounds(malformed, max_blocks))
    return msgs


# ---------------------------------------------------------------- applying a plan


def apply_plan(
    messages: list[Any], plan: Any, text: str = "Earlier: the user asked for fixes."
) -> list[Any]:
    """The compacted list a plan describes, with a stand-in summary (same objects elsewhere)."""
    if plan.keep_from == plan.head_end and not plan.pinned:
        return list(messages)
    return (
        messages[: plan.head_end]
        + [summary(text)]
        + [messages[i] for i in plan.pinned]
        + messages[plan.keep_from :]
    )
