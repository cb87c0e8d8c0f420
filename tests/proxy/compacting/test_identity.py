"""Sessions of real clients through the proxy: the session a client names in its body (Codex,
Claude Code, the Responses API), scoped by credential, and a fingerprint that ignores what a
client injects or marks per request. Asserted on the `x-compaction-session` the proxy answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from compaction import is_valid_session_id
from proxy.dialects import is_injected
from tests.fakes.upstream import FakeUpstream
from tests.proxy.conftest import RunningProxy, StartProxy

# Small enough that these bodies are parsed (they could reach the precompute ratio), large
# enough that none of them is compacted.
_WINDOW = 3000
_CODEX_INSTRUCTIONS = "You are Codex, a coding agent. " * 80
_ENVIRONMENT = (
    "<environment_context>\n  <cwd>/home/dev/project</cwd>\n  <shell>bash</shell>\n"
    "  <current_date>2026-11-27</current_date>\n  <timezone>Etc/UTC</timezone>\n"
    "</environment_context>"
)
_AGENTS = (
    "# AGENTS.md instructions for /home/dev/project\n\n<INSTRUCTIONS>\nRun make test before "
    "committing.\n</INSTRUCTIONS>"
)
_CLAUDE_SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332;"},
    {
        "type": "text",
        "text": "You are Claude Code, an interactive CLI tool. " * 60,
        "cache_control": {"type": "ephemeral"},
    },
]
_REMINDER = (
    "<system-reminder>\nAs you answer, use this context: today is 2026-11-27.\n</system-reminder>"
)


@pytest.fixture
async def running(start_proxy: StartProxy, upstream: FakeUpstream, tmp_path: Path) -> RunningProxy:
    return await start_proxy(
        upstream={"anthropic_base_url": upstream.base_url},
        models={"default_context_window": _WINDOW},
        memory={"dir": str(tmp_path / "memory")},
    )


def _input_text(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def codex_body(prompt: str, *, thread: str | None, turns: int = 0) -> dict[str, Any]:
    """A Codex CLI request: its AGENTS.md and environment context as user items before the
    prompt, then `turns` tool calls and their outputs."""
    items = [
        _input_text("developer", "<permissions instructions>sandbox: none</permissions>"),
        _input_text("user", _AGENTS),
        _input_text("user", _ENVIRONMENT),
        _input_text("user", prompt),
    ]
    for n in range(turns):
        items.append(
            {"type": "function_call", "call_id": f"c{n}", "name": "shell", "arguments": "{}"}
        )
        items.append({"type": "function_call_output", "call_id": f"c{n}", "output": f"ok {n}"})
    body: dict[str, Any] = {
        "model": "gpt-test",
        "instructions": _CODEX_INSTRUCTIONS,
        "input": items,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
        "stream": False,
    }
    if thread is not None:
        body["prompt_cache_key"] = thread
        body["client_metadata"] = {"session_id": thread}
    return body


def claude_code_body(prompt: str, *, session: str | None, later: int = 0) -> dict[str, Any]:
    """A Claude Code request: reminders before the prompt in the first user turn, and the
    cache_control mark on the newest turn only (on the prompt in request 1)."""
    marked = {"type": "ephemeral"}
    first: list[dict[str, Any]] = [
        {"type": "text", "text": _REMINDER},
        {"type": "text", "text": prompt},
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    for n in range(later):
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"step {n}"}]})
        messages.append({"role": "user", "content": [{"type": "text", "text": f"go on {n}"}]})
    messages[-1]["content"][-1]["cache_control"] = marked
    body: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 100,
        "system": _CLAUDE_SYSTEM,
        "messages": messages,
    }
    if session is not None:
        user_id = {"device_id": "d" * 64, "account_uuid": "", "session_id": session}
        body["metadata"] = {"user_id": orjson.dumps(user_id).decode()}
    return body


async def session_of(
    client: aiohttp.ClientSession,
    proxy: RunningProxy,
    path: str,
    body: dict[str, Any],
    *,
    key: str = "sk-one",
    headers: dict[str, str] | None = None,
) -> str:
    sent = {"Authorization": f"Bearer {key}", "Content-Type": "application/json", **(headers or {})}
    async with client.post(
        f"{proxy.url}/v1/{path}", data=orjson.dumps(body), headers=sent
    ) as response:
        assert response.status == 200
        assert response.headers["x-compaction-status"] == "none"
        return response.headers["x-compaction-session"]


async def test_two_codex_conversations_from_one_folder_get_two_sessions(
    running: RunningProxy, client: aiohttp.ClientSession
) -> None:
    first = await session_of(
        client, running, "responses", codex_body("fix the tests", thread="019a-1")
    )
    second = await session_of(
        client, running, "responses", codex_body("write the docs", thread="019a-2")
    )
    first_again = await session_of(
        client, running, "responses", codex_body("fix the tests", thread="019a-1", turns=3)
    )
    assert first != second
    assert first == first_again
    assert first.startswith("019a-1-") and is_valid_session_id(first)


async def test_codex_conversations_are_told_apart_by_their_prompt_not_their_context(
    running: RunningProxy, client: aiohttp.ClientSession
) -> None:
    # Without the names: the fingerprint reads past <environment_context> and AGENTS.md.
    one = await session_of(client, running, "responses", codex_body("fix the tests", thread=None))
    two = await session_of(client, running, "responses", codex_body("write the docs", thread=None))
    one_later = await session_of(
        client, running, "responses", codex_body("fix the tests", thread=None, turns=4)
    )
    assert one != two
    assert one == one_later
    assert one.startswith("fp-")


async def test_claude_code_request_one_and_two_land_in_one_session(
    running: RunningProxy, client: aiohttp.ClientSession
) -> None:
    for session in ("5f0c3a52-0d3e-4d7e-9d56-2d1f0a7c1e11", None):  # named, then fingerprinted
        one = await session_of(
            client, running, "messages", claude_code_body("refactor the parser", session=session)
        )
        two = await session_of(
            client,
            running,
            "messages",
            claude_code_body("refactor the parser", session=session, later=2),
        )
        other = await session_of(
            client, running, "messages", claude_code_body("add a CLI flag", session=session)
        )
        assert one == two
        assert (other == one) is (session is not None)  # a name is the client's to give


async def test_a_named_session_is_scoped_by_credential(
    running: RunningProxy, client: aiohttp.ClientSession
) -> None:
    body = codex_body("fix the tests", thread="shared-thread")
    mine = await session_of(client, running, "responses", body, key="sk-one")
    theirs = await session_of(client, running, "responses", body, key="sk-two")
    assert mine != theirs


async def test_the_header_and_the_path_still_win_over_the_body(
    running: RunningProxy, client: aiohttp.ClientSession
) -> None:
    body = codex_body("fix the tests", thread="thread-9")
    named = await session_of(client, running, "responses", body, headers={"X-Session-Id": "ops"})
    assert named == "ops"


async def test_a_hostile_name_never_leaves_the_memory_dir(
    running: RunningProxy, client: aiohttp.ClientSession
) -> None:
    for name in ("../../etc/passwd", ".hidden", "a/b\\c", "é" * 300):
        session = await session_of(client, running, "responses", codex_body("x", thread=name))
        assert is_valid_session_id(session)
        assert "/" not in session and not session.startswith(".")


@pytest.mark.parametrize(
    "content",
    [
        _ENVIRONMENT,
        _AGENTS,
        [{"type": "text", "text": _REMINDER}],
        "<command-name>/clear</command-name>\n<command-message>clear</command-message>",
        [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
    ],
)
def test_injected_context_is_not_the_persons_words(content: Any) -> None:
    assert is_injected(content)


def test_a_prompt_after_a_reminder_is_the_persons_words() -> None:
    assert not is_injected(f"{_REMINDER}\nfix the tests")
    assert not is_injected([{"type": "text", "text": _REMINDER}, {"type": "text", "text": "go"}])
